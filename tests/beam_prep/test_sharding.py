"""Shards sized by bytes, committed once, identical across processes and workers."""

import glob
import os
import subprocess
import sys

import numpy as np
import pytest

from beam_prep import keys
from beam_prep.shards import commit as sharding
from beam_prep.record_codec import RecordCodec
from beam_prep.sample_data import write_sample_data
from tests.helpers import ROOT, made_once, manifest, run_cli

TARGET_MB = 0.06
# 48 px records: many sample objects are thinner than the click margin.
ARGS = [
  "--image-size",
  "48",
  "--variants",
  "2",
  "--target-shard-mb",
  str(TARGET_MB),
  "--max-error-fraction",
  "1",
]


def _tree(root, sub):
  return {
    os.path.relpath(p, root): open(p, "rb").read()
    for p in sorted(glob.glob(os.path.join(root, sub, "*")))
  }


# The new process runs the job as a Dataflow worker would have it: with
# only what setup.py's REQUIRED installs, matplotlib and tensorboard (the
# train extra) made impossible to import.
WITHOUT_THE_TRAIN_EXTRA = (
  "import sys\n"
  "for name in ('matplotlib', 'tensorboard'):\n"
  "  sys.modules[name] = None  # import fails\n"
  "from pipelines.cli import main\n"
  "main(sys.argv[1:])\n"
)


def _prep_in_new_process(data, out, extra=()):
  cmd = [
    sys.executable,
    "-c",
    WITHOUT_THE_TRAIN_EXTRA,
    "segmentation",
    "--input",
    data,
    "--output",
    out,
    *ARGS,
    *extra,
  ]
  r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
  assert r.returncode == 0, r.stdout + r.stderr
  return r.stdout + r.stderr


def _largest_record(files):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  return max(len(r.numpy()) + 16 for r in tf.data.TFRecordDataset(files))


def _small(root):
  data = os.path.join(root, "data")
  write_sample_data(data, count=8, seed=11)
  assert (
    run_cli(["segmentation", "--input", data, "--output", os.path.join(root, "out")] + ARGS) == 0
  )


@pytest.fixture(scope="module")
def small(tmp_path_factory):
  return os.path.join(made_once(tmp_path_factory, "sharding_small", _small), "out")


def _large(root):
  """Two separate processes: this one, one worker in memory; a new one, two
  worker threads, without the train extra (`WITHOUT_THE_TRAIN_EXTRA`). The 4
  objects under 100 pixels are dead letters: the error files are compared too."""
  data = os.path.join(root, "data")
  write_sample_data(data, count=32, seed=11)
  small_objects = ["--min-object-area", "100"]
  one = os.path.join(root, "one")
  assert run_cli(["segmentation", "--input", data, "--output", one, *ARGS, *small_objects]) == 0
  _prep_in_new_process(
    data,
    os.path.join(root, "two"),
    small_objects + ["--direct_running_mode=multi_threading", "--direct_num_workers=2"],
  )


@pytest.fixture(scope="module")
def large(tmp_path_factory):
  """Made once for every test process of the run (they only read it)."""
  root = made_once(tmp_path_factory, "sharding_large", _large)
  return os.path.join(root, "one"), os.path.join(root, "two")


def test_shard_count_follows_the_data_and_sizes_stay_near_the_target(small, large):
  target = TARGET_MB * 1e6
  counts = {}
  for name, out in (("small", small), ("large", large[0])):
    files = sorted(glob.glob(keys.record_pattern(out, keys.TRAIN_SPLIT)))
    sizes = [os.path.getsize(f) for f in files]
    limit = 2 * target + _largest_record(files)
    assert max(sizes) <= limit, (name, sizes)
    assert sum(sizes) / len(sizes) >= target / 3, (name, sizes)
    counts[name] = len(files)
    shards = manifest(out)["shards"][keys.TRAIN_SPLIT]
    assert shards["files"] == len(files) and shards["bytes"] == sum(sizes)
  # 4x the images: at least 2.5x the files (each size rounds to whole groups).
  assert counts["large"] >= 2.5 * counts["small"] >= 2.5, counts


def test_two_processes_and_worker_counts_write_identical_bytes(large):
  one, two = large
  for sub in (keys.RECORDS_DIR, keys.ERRORS_DIR):
    a, b = _tree(one, sub), _tree(two, sub)
    assert a and a.keys() == b.keys()
    assert a == b, sub
  assert manifest(one)["counts"] == manifest(two)["counts"]
  assert manifest(one)["counts"]["accounted"]


def test_the_job_runs_without_the_trainers_packages(large):
  """What Dataflow workers install (setup.py's REQUIRED) is enough for the
  whole job, preview included: `large`'s second run could import neither
  matplotlib nor tensorboard."""
  _, two = large
  assert os.path.exists(os.path.join(two, keys.PREVIEW_FILE))
  assert os.path.exists(os.path.join(two, keys.SUCCESS_FILE))


def test_the_job_writes_success_last_and_leaves_no_temp_files(small):
  assert os.path.exists(os.path.join(small, keys.SUCCESS_FILE))
  assert not glob.glob(os.path.join(small, "**", ".*"), recursive=True)
  m = manifest(small)
  assert m["paths"]["preview"] and os.path.exists(m["paths"]["preview"])
  assert m["timing"]["wall_seconds"] > 0


def test_trainer_refuses_an_output_without_success(small, tmp_path, capsys):
  import shutil  # pylint: disable=g-import-not-at-top
  from train import cli as train_cli  # pylint: disable=g-import-not-at-top

  partial = str(tmp_path / "partial")
  shutil.copytree(small, partial)
  os.remove(os.path.join(partial, keys.SUCCESS_FILE))
  with pytest.raises(SystemExit) as e:
    train_cli.main(["fit", "--data", partial, "--model-dir", str(tmp_path / "m"), "--steps", "1"])
  assert e.value.code != 0
  printed = capsys.readouterr().out
  assert "_SUCCESS is missing" in printed and partial in printed


def test_commit_is_idempotent_and_numbers_files_in_group_order(tmp_path):
  out = str(tmp_path / "out")
  temp = os.path.join(out, ".temp-x")
  os.makedirs(os.path.join(temp, "a"))
  files = []
  for split, group, part, data in (
    ("train", 1, 0, b"B"),
    ("train", 0, 1, b"A2"),
    ("train", 0, 0, b"A1"),
    ("train", 3, 0, b"C"),
  ):
    path = os.path.join(temp, "a", f"{split}-{group}-{part}")
    with open(path, "wb") as f:
      f.write(data)
    files.append(
      {
        "kind": "records",
        "split": split,
        "group": group,
        "part": part,
        "temp": path,
        "records": 1,
        "bytes": len(data),
      }
    )
  # A first commit that stops after moving one file ...
  first = sharding.final_names(files, out, False, ("train", "eval"))
  os.makedirs(os.path.join(out, keys.RECORDS_DIR))
  temp_path, final_path, _ = next(f for f in first if f[0])
  os.rename(temp_path, final_path)
  # ... then the retry finishes the job.
  summary = sharding.commit_files(files, out, temp, False, ("train", "eval"))
  names = sorted(os.listdir(os.path.join(out, keys.RECORDS_DIR)))
  assert names == ["eval-00000-of-00001.tfrecord"] + [
    f"train-{i:05d}-of-00004.tfrecord" for i in range(4)
  ]
  contents = [open(os.path.join(out, keys.RECORDS_DIR, n), "rb").read() for n in names[1:]]
  assert contents == [b"A1", b"A2", b"B", b"C"]
  assert summary["train"]["files"] == 4 and summary["eval"]["records"] == 0
  assert not os.path.exists(temp)
  with pytest.raises(IOError, match="neither the temp file"):
    sharding.commit_files(
      files[:1] + [dict(files[1], temp=files[1]["temp"] + "x")], out + "2", temp, False, ("train",)
    )


def test_transform_statistics_weigh_every_image_once(small):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_transform as tft  # pylint: disable=g-import-not-at-top
  from beam_prep.features import FeatureTable  # pylint: disable=g-import-not-at-top
  from train.fit.data import Decoder, Parser  # pylint: disable=g-import-not-at-top
  from train.tasks import make_task  # pylint: disable=g-import-not-at-top

  table = FeatureTable.load(small)
  tft_out = tft.TFTransformOutput(os.path.join(small, keys.TRANSFORM_DIR))
  task = make_task(table, tft_out)
  files = sorted(glob.glob(keys.record_pattern(small, keys.TRAIN_SPLIT)))
  serialized = [r.numpy() for r in tf.data.TFRecordDataset(files)]
  examples = [ex for s in serialized for ex in RecordCodec(table).decode_examples(s)]
  first, per_record = {}, []
  for ex in examples:
    mean = ex[keys.IMAGE].reshape(-1, 3).mean(axis=0)
    first.setdefault(str(np.ravel(ex[keys.IMAGE_ID])[0]), mean)
    per_record.append(mean)
  by_image = np.mean(list(first.values()), axis=0)
  by_record = np.mean(per_record, axis=0)
  assert np.abs(by_image - by_record).max() > 0.5  # the data tells the two apart
  # Solve out = (x - mean) / std per channel from two pixels of the transformed batch.
  parser = Parser(tft_out, table, task)
  inputs, _ = parser(
    Decoder(table, task.transform_keys).stored(tf.constant(serialized[:4]), training=False),
    training=False,
  )  # Every variant of the first 4 records, in order.
  x = np.stack([ex[keys.IMAGE] for ex in examples[: len(inputs)]]).astype(np.float64)
  x = x.reshape(-1, 3)
  y = inputs.numpy()[..., :3].reshape(-1, 3)
  for c in range(3):
    i, j = np.argmin(x[:, c]), np.argmax(x[:, c])
    scale = (y[j, c] - y[i, c]) / (x[j, c] - x[i, c])
    analyzed_mean = x[i, c] - y[i, c] / scale
    assert analyzed_mean == pytest.approx(by_image[c], abs=0.05), (c, by_image, by_record)


def test_progress_lines_at_a_steady_interval(small, tmp_path, capsys):
  """`small`'s job again with a progress line every millisecond: the lines
  count up, and the records are the same as without them (`small`: the
  default interval)."""
  import re  # pylint: disable=g-import-not-at-top

  data = os.path.join(os.path.dirname(small), "data")
  out = str(tmp_path / "out")
  argv = ["segmentation", "--input", data, "--output", out, *ARGS]
  assert run_cli(argv + ["--progress-seconds", "0.001"]) == 0
  printed = capsys.readouterr().out
  assert re.search(r"prep: 8 inputs in \d+ train \+ \d+ eval groups", printed), printed
  done = [
    int(m)
    for m in re.findall(
      r"prep: (\d+) of 8 inputs \(\d+ objects\), [\d.]+ inputs/s, \d+ s elapsed", printed
    )
  ]
  assert done and done == sorted(done) and done[-1] <= 8, printed
  assert "left" in printed
  assert _tree(out, keys.RECORDS_DIR).values() and (
    list(_tree(out, keys.RECORDS_DIR).values()) == list(_tree(small, keys.RECORDS_DIR).values())
  )
