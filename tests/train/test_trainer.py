"""The trainer on real records: input path, strategies, checkpoints, TensorBoard."""

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from beam_prep import keys
from tests.helpers import run_cli
from train.fit.data import Decoder, InputReader, Parser
from beam_prep.prep_output import PrepOutput
from beam_prep.record_codec import RecordCodec
from train.tasks import make_task


def _loaded(prep_dir):
  """(transform output, feature table, task) of a prep output."""
  prep = PrepOutput(prep_dir)
  return prep.tft_output, prep.table, make_task(prep.table, prep.tft_output)


def _fit(args):
  """fit without the NoC evaluation (tests/train/test_noc.py covers it) unless asked."""
  from train import cli  # pylint: disable=g-import-not-at-top

  extra = [] if "--noc-clicks" in args else ["--noc-clicks", "0"]
  with pytest.raises(SystemExit) as e:
    cli.main(["fit"] + args + extra)
  return e.value.code


def _cli(args, timeout=600, **kw):
  """beam-train in a fresh process (device settings need a fresh runtime)."""
  return subprocess.run(
    [sys.executable, "-m", "train"] + args, capture_output=True, text=True, timeout=timeout, **kw
  )


SMALL = [
  "--batch-size",
  "4",
  "--width",
  "4",
  "--depth",
  "1",
  "--log-every",
  "1",
  "--histogram-every",
  "0",
  "--no-export",
]


def test_decoder_and_parser_on_in_memory_examples(prep_dir):
  out, table, task = _loaded(prep_dir)
  image = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
  mask = np.zeros((64, 64), np.uint8)
  mask[10:30, 10:30] = 1
  mask[0] = keys.IGNORE
  ex = {
    "image_id": "mem",
    "object_id": 1,
    "variant": 0,
    "image": image,
    "distance_maps": np.full((64, 64, 2), 255, np.uint8),
    "mask": mask,
    "positive_clicks": np.array([[20, 20]]),
    "negative_clicks": np.zeros((0, 2), int),
  }
  ex.update(height=64, width=64, negative_strategy=0, flipped=0, crop_box=np.array([0, 0, 64, 64]))
  decoder = Decoder(table)
  stored = decoder.stored(tf.constant([RecordCodec(table).encode_unit([ex])] * 2))
  raw = decoder.raw(stored)
  assert raw[keys.IMAGE].shape == (2,) and raw[keys.POSITIVE_CLICKS].values.numpy().tolist() == [
    20,
    20,
    20,
    20,
  ]
  raw = {k: stored[k] for k in task.transform_keys}
  inputs, labels = Parser(out, table, task)(raw, training=False)
  assert inputs.shape == (2, 64, 64, 5) and inputs.dtype == tf.float32
  np.testing.assert_allclose(inputs[0, ..., 3:].numpy(), 1.0)
  assert labels[keys.LABEL].shape == (2, 64, 64, 1)
  assert float(tf.reduce_sum(labels[keys.LABEL][0])) == 400
  assert float(tf.reduce_sum(1 - labels[keys.LABEL_WEIGHT][0])) == 64
  flipped, flabels = Parser(out, table, task, seed=1)(raw, training=True)
  for b in range(2):  # Either unchanged or mirrored, always image and label together.
    same = np.allclose(flipped[b], inputs[b])
    mirrored = np.allclose(flipped[b], inputs[b, :, ::-1])
    assert same or mirrored
    want = labels[keys.LABEL][b] if same else labels[keys.LABEL][b, :, ::-1]
    np.testing.assert_array_equal(flabels[keys.LABEL][b], want)


def test_reader_sharding_is_disjoint_and_eval_is_deterministic(prep_dir):
  _, _, task = _loaded(prep_dir)
  reader = InputReader(PrepOutput(prep_dir), task, batch_size=4)
  everything = sorted(r.numpy() for r in reader.records(keys.TRAIN_SPLIT, training=False))
  parts = []
  for i in range(2):
    ctx = tf.distribute.InputContext(
      num_input_pipelines=2, input_pipeline_id=i, num_replicas_in_sync=2
    )
    parts.append([r.numpy() for r in reader.records(keys.TRAIN_SPLIT, False, ctx)])
  assert parts[0] and parts[1]
  assert not set(parts[0]) & set(parts[1])
  assert sorted(parts[0] + parts[1]) == everything
  first = [x.numpy() for x, _ in reader.model_batches(keys.EVAL_SPLIT, training=False)]
  second = [x.numpy() for x, _ in reader.model_batches(keys.EVAL_SPLIT, training=False)]
  assert len(first) == len(second) > 0
  for a, b in zip(first, second):
    np.testing.assert_array_equal(a, b)
  # Segmentation batches stay bytes as stored until the step, which inflates
  # the mask, unpacks the clicks and makes the distance maps from them.
  stored = next(iter(reader.dataset(keys.TRAIN_SPLIT, training=True)))
  assert sorted(stored) == [keys.IMAGE, keys.MASK, keys.NEGATIVE_CLICKS, keys.POSITIVE_CLICKS]
  for k, v in stored.items():
    assert v.dtype == tf.string and v.shape == (4,), k
  assert reader.prep.table[keys.MASK].feature.encoding == "zlib"
  masks = tf.io.decode_compressed(stored[keys.MASK], compression_type="ZLIB")
  assert set(tf.strings.length(masks).numpy()) == {64 * 64}
  inputs, _ = reader.parser(stored, training=True)
  assert inputs.shape == (4, 64, 64, 5)


def test_two_replicas_on_logical_cpus_with_the_full_recipe_compiled_by_xla(guided_prep, tmp_path):
  """MirroredStrategy, and --xla compiling the step's rounds (previous mask,
  corrective clicks), the model and its gradient; the parse of the stored
  bytes, the exported transform and the optimizer's all-reduce stay outside."""
  model_dir = str(tmp_path / "m")
  r = _cli(
    [
      "fit",
      "--data",
      guided_prep,
      "--model-dir",
      model_dir,
      "--steps",
      "4",
      "--cpu-replicas",
      "2",
      "--scale-learning-rate",
      "--lr-schedule",
      "cosine",
      "--noc-clicks",
      "2",
      "--noc-objects",
      "2",
      "--mask-rounds",
      "3",
      "--corrective-clicks",
      "--xla",
    ]
    + SMALL,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0"),
  )  # XLA says it compiled.
  assert r.returncode == 0, r.stdout + r.stderr[-5000:]
  assert "Compiled cluster using XLA" in r.stderr
  m = json.load(open(os.path.join(model_dir, "metrics.json")))
  assert m["replicas"] == 2 and m["global_batch_size"] == 8
  assert m["noc"]["max_clicks"] == 2  # NoC runs on a mirrored model too
  assert m["learning_rate"] == pytest.approx(2 * 2e-3)
  assert m["final_step"] == 4 and m["step_traces"] == 1
  assert "MirroredStrategy over 2 logical CPU devices" in r.stdout


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(prep_dir, tmp_path, capsys):
  model_dir = str(tmp_path / "m")
  assert (
    _fit(
      [
        "--data",
        prep_dir,
        "--model-dir",
        model_dir,
        "--checkpoint-every",
        "1",
        "--steps",
        "40",
        "--learning-rate",
        "1e30",
      ]
      + SMALL
    )
    == 1
  )
  out = capsys.readouterr().out
  assert "loss is nan" in out and "last good checkpoint" in out
  latest = tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints"))
  nan_step = int(out.split("loss is nan at step ")[1].split(";")[0])
  assert int(latest.rsplit("-", 1)[1]) < nan_step
  reader = tf.train.load_checkpoint(latest)
  for name in reader.get_variable_to_shape_map():
    if name.startswith("model/") and "VARIABLE_VALUE" in name:
      assert np.isfinite(reader.get_tensor(name)).all(), name


def test_metrics_tensorboard_and_profile(prep_dir, tmp_path, capsys):
  model_dir = str(tmp_path / "m")
  assert (
    _fit(
      [
        "--data",
        prep_dir,
        "--model-dir",
        model_dir,
        "--steps",
        "4",
        "--batch-size",
        "4",
        "--width",
        "4",
        "--depth",
        "1",
        "--log-every",
        "2",
        "--histogram-every",
        "2",
        "--profile-steps",
        "2,3",
        "--no-export",
      ]
    )
    == 0
  )
  m = json.load(open(os.path.join(model_dir, "metrics.json")))
  for key in (
    "final_step",
    "examples_per_second",
    "input_wait_fraction",
    "input_bound",
    "step_traces",
    "replicas",
    "global_batch_size",
    "eval",
  ):
    assert key in m, key
  assert 0 <= m["input_wait_fraction"] <= 1 and m["examples_per_second"] > 0
  assert 0 <= m["eval"]["mean_iou"] <= 1
  assert 0 <= m["eval"]["baseline_nearest_click_mean_iou"] <= 1
  ev = m["eval"]
  assert (
    f"eval: {ev['examples']} examples, mean IoU {ev['mean_iou']:.3f} (nearest-click "
    f"baseline {ev['baseline_nearest_click_mean_iou']:.3f}), pixel accuracy "
    f"{ev['pixel_accuracy']:.3f}"
  ) in capsys.readouterr().out
  tags = set()
  for f in glob.glob(os.path.join(model_dir, "tensorboard", "train", "events.*")):
    for e in tf.compat.v1.train.summary_iterator(f):
      tags.update(v.tag for v in e.summary.value)
  for tag in (
    "loss",
    "examples_per_second",
    "input_wait_fraction",
    "learning_rate",
    "predicted_masks",
  ):
    assert tag in tags, tag
  assert any(t.startswith("weights/") for t in tags)
  assert any(t.startswith("gradients/") for t in tags)
  assert glob.glob(os.path.join(model_dir, "tensorboard", "plugins", "profile", "*", "*.xplane.pb"))


def _kernel(model_dir, layer):
  from train import models  # pylint: disable=g-import-not-at-top

  return models.rebuild(model_dir).get_layer(layer).kernel.numpy()


def test_fine_tuning_from_a_checkpoint_with_frozen_layers(prep_dir, trained, tmp_path):
  """--init-from the session's model, its first block frozen."""
  b = str(tmp_path / "b")
  common = [
    "--data",
    prep_dir,
    "--batch-size",
    "4",
    "--width",
    "4",
    "--depth",
    "2",  # The session model's.
    "--histogram-every",
    "0",
    "--no-export",
  ]
  tuned = ["--init-from", trained, "--freeze", "^down0_", "--warmup-steps", "2", "--log-every", "1"]
  assert _fit(common + ["--model-dir", b, "--steps", "3"] + tuned) == 0
  np.testing.assert_array_equal(_kernel(trained, "down0_conv1"), _kernel(b, "down0_conv1"))
  assert not np.array_equal(_kernel(trained, "up0_conv1"), _kernel(b, "up0_conv1"))
  # The learning rate rose to its value (2e-3) over the first two steps.
  assert _scalars(b, "learning_rate") == pytest.approx([1e-3, 2e-3, 2e-3])
  assert _fit(common + ["--model-dir", str(tmp_path / "c"), "--warmup-steps", "-1"]) == 2


def _scalars(model_dir, tag):
  """A training scalar's values, by step."""
  found = {}
  for f in glob.glob(os.path.join(model_dir, "tensorboard", "train", "events.*")):
    for e in tf.compat.v1.train.summary_iterator(f):
      for v in e.summary.value:
        if v.tag == tag:
          found[e.step] = float(tf.make_ndarray(v.tensor))
  return [found[k] for k in sorted(found)]


def test_warmup_scales_a_schedule_over_its_first_steps():
  from train.fit.model_setup import Warmup  # pylint: disable=g-import-not-at-top

  cosine = keras.optimizers.schedules.CosineDecay(1.0, decay_steps=10, alpha=0.05)
  warm = Warmup(cosine, 4)
  for step in range(12):
    want = float(cosine(step)) * min(1.0, (step + 1) / 4)
    assert float(warm(step)) == pytest.approx(want, rel=1e-6), step
  assert float(Warmup(2e-3, 2)(0)) == pytest.approx(1e-3)


def _interrupted_fit(prep_dir, model_dir, sig, at_step, every=100000):
  """`fit` in a fresh process, checkpointing every `every` steps, sent `sig`
  once it logs step `at_step`: its output."""
  args = ["fit", "--data", prep_dir, "--model-dir", model_dir, "--steps", "100000"]
  proc = subprocess.Popen(
    [sys.executable, "-m", "train"] + args + ["--checkpoint-every", str(every)] + SMALL,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
    env=dict(os.environ, PYTHONUNBUFFERED="1"),
  )
  deadline = time.time() + 300
  seen = ""
  while time.time() < deadline:
    line = proc.stdout.readline()
    seen += line
    if f"train: step {at_step}/" in line:
      break
  proc.send_signal(sig)
  rest, _ = proc.communicate(timeout=300)
  assert proc.returncode == (-signal.SIGKILL if sig == signal.SIGKILL else 130), seen + rest
  return seen + rest


def _checkpoint_step(model_dir) -> int:
  latest = tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints"))
  assert latest is not None
  tf.train.load_checkpoint(latest)  # Readable, not half written.
  return int(latest.rsplit("-", 1)[1])


def _stopped_at(prep_dir, model_dir, sig, at_step) -> int:
  """`_interrupted_fit` by Ctrl-C or SIGTERM: the step its checkpoint holds,
  saved on the way out."""
  _interrupted_fit(prep_dir, model_dir, sig, at_step)
  saved_step = _checkpoint_step(model_dir)
  m = json.load(open(os.path.join(model_dir, "metrics.json")))
  assert m["interrupted"] and m["final_step"] == saved_step >= at_step
  return saved_step


def test_sigterm_and_sigkill_keep_a_checkpoint_and_a_rerun_resumes(prep_dir, tmp_path):
  """A preemptible machine's SIGTERM stops a run with a checkpoint (Ctrl-C
  takes the same way: `test_ctrl_c_asks_to_stop_after_the_step_and_twice_at_once`);
  its rerun resumes from it; killed (SIGKILL: no way out) it keeps its last
  periodic checkpoint, whole; the next rerun resumes from that and ends at
  the step asked."""
  model_dir = str(tmp_path / "m")
  first = _stopped_at(prep_dir, model_dir, signal.SIGTERM, 3)
  out = _interrupted_fit(prep_dir, model_dir, signal.SIGKILL, first + 5, every=2)
  assert re.search(rf"train: resumed from \S+ at step {first}\n", out), out
  killed = _checkpoint_step(model_dir)
  assert killed >= first + 2  # Periodic, while it ran on.
  end = killed + 2
  run_files = {f: open(os.path.join(model_dir, f)).read() for f in ("config.json", "model.json")}
  rerun = ["--data", prep_dir, "--model-dir", model_dir, "--steps", str(end)] + SMALL
  assert _fit(rerun + ["--width", "8"]) == 1  # Another model: refused, the dir as it was.
  assert {f: open(os.path.join(model_dir, f)).read() for f in run_files} == run_files
  assert _fit(rerun) == 0
  m = json.load(open(os.path.join(model_dir, "metrics.json")))
  assert m["final_step"] == end and m["steps_this_run"] == 2 and not m.get("interrupted")


def test_ctrl_c_asks_to_stop_after_the_step_and_twice_at_once():
  """The signals as the loop's stop request takes them: Ctrl-C or SIGTERM
  ask it to stop after the current step; a second Ctrl-C stops at once;
  the handlers before it are put back."""
  from train.fit.step_hooks import StopRequest  # pylint: disable=g-import-not-at-top

  before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
  for first in (signal.SIGINT, signal.SIGTERM):
    stop = StopRequest()
    try:
      assert not stop.requested
      signal.raise_signal(first)
      assert stop.requested
      with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
    finally:
      stop.restore()
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_retrace_guard_names_the_change_in_the_real_step():
  from train.fit.train_step import FinalizedFunction, RetraceError  # pylint: disable=g-import-not-at-top

  v = tf.Variable(0.0)
  step = FinalizedFunction(lambda x: v.assign_add(tf.reduce_sum(x)), "train_step")
  step(tf.ones([8, 64, 64, 5]))
  with pytest.raises(RetraceError, match=r"float32\[8, 64, 64, 5\].*float32\[7, 64, 64, 5\]"):
    step(tf.ones([7, 64, 64, 5]))


def _free_ports(n):
  import socket  # pylint: disable=g-import-not-at-top

  socks = [socket.socket() for _ in range(n)]
  for s in socks:
    s.bind(("127.0.0.1", 0))
  ports = [s.getsockname()[1] for s in socks]
  for s in socks:
    s.close()
  return ports


def test_multi_worker_with_two_local_processes(prep_dir, tmp_path):
  ports = _free_ports(2)
  cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
  model_dir = str(tmp_path / "m")
  procs = []
  for i in range(2):
    env = dict(
      os.environ, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
    )
    procs.append(
      subprocess.Popen(
        [
          sys.executable,
          "-m",
          "train",
          "fit",
          "--data",
          prep_dir,
          "--model-dir",
          model_dir,
          "--steps",
          "4",
          "--batch-size",
          "2",
          "--width",
          "4",
          "--depth",
          "1",
          "--histogram-every",
          "0",
          "--no-export",
          "--noc-clicks",
          "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
      )
    )
  outs = []
  for p in procs:
    try:
      outs.append(p.communicate(timeout=400)[0])
    finally:
      p.kill()
  assert [p.returncode for p in procs] == [0, 0], "\n".join(outs)
  assert "MultiWorkerMirroredStrategy, 2 replicas in sync" in outs[1]
  m = json.load(open(os.path.join(model_dir, "metrics.json")))
  assert m["replicas"] == 2 and m["global_batch_size"] == 4 and m["final_step"] == 4
  worker = json.load(open(os.path.join(model_dir, "workertemp_1", "metrics.json")))
  assert worker["final_loss"] == pytest.approx(m["final_loss"])  # one all-reduced model


def _prep(data, out, *extra):
  """A real beam-prep run (64 px, one variant) over `data`."""
  assert (
    run_cli(
      [
        "segmentation",
        "--input",
        data,
        "--output",
        out,
        "--preset",
        "smoke",
        "--image-size",
        "64",
        "--variants",
        "1",
        "--max-error-fraction",
        "1",
      ]
      + list(extra)
    )
    == 0
  )
  return out


def test_fit_refuses_an_output_with_no_train_record(prep_dir, sample_dir, tmp_path, capsys):
  # The images of the train split all unreadable, those of the eval split fine:
  # a complete output (with _SUCCESS) holding eval records only.
  eval_ids = {
    r[keys.IMAGE_ID] for r in PrepOutput(prep_dir).read_numpy(keys.EVAL_SPLIT, [keys.IMAGE_ID])
  }
  data = tmp_path / "photos"
  shutil.copytree(sample_dir, data)
  for image in (data / "images").iterdir():
    if image.stem not in eval_ids:
      image.write_bytes(b"not an image")
  out = _prep(str(data), str(tmp_path / "prep"), "--eval-percent", "30")  # prep_dir's split
  prep = PrepOutput(out)
  assert prep.manifest["counts"]["examples_written"][keys.TRAIN_SPLIT] == 0
  assert prep.has_records(keys.EVAL_SPLIT) and os.path.exists(os.path.join(out, "_SUCCESS"))
  model_dir = str(tmp_path / "m")
  for extra in ([], ["--skip-corrupt-records"]):
    assert _fit(["--data", out, "--model-dir", model_dir, "--steps", "2"] + SMALL + extra) == 1
    printed = capsys.readouterr().out
    assert f"{out} has no train records (0 in its " in printed, printed
    assert "not_an_image" in printed  # the manifest's count of what failed
    assert f"{out}/manifest.json" in printed and f"{out}/errors/" in printed
    assert "StopIteration" not in printed and "Traceback" not in printed
  assert not os.path.exists(os.path.join(model_dir, "checkpoints"))  # refused before training


def test_fit_on_the_records_folder_names_the_output_to_give(prep_dir, tmp_path, capsys):
  records = os.path.join(prep_dir, keys.RECORDS_DIR)
  assert (
    _fit(["--data", records + "/", "--model-dir", str(tmp_path / "m"), "--steps", "1"] + SMALL) == 1
  )
  printed = capsys.readouterr().out
  assert f"{records} is the records/ folder of a beam-prep output" in printed
  assert f"--data {prep_dir}" in printed
  assert "still running" not in printed and "_SUCCESS" not in printed


def test_an_empty_eval_split_skips_evaluation_and_noc_saying_why(
  sample_dir, tmp_path, capsys, monkeypatch
):
  out = _prep(sample_dir, str(tmp_path / "prep"), "--eval-percent", "0")
  model_dir = str(tmp_path / "m")
  monkeypatch.chdir(tmp_path)  # --data relative to here.
  argv = ["--data", "prep", "--model-dir", model_dir, "--steps", "2", "--noc-clicks", "2"]
  assert _fit(argv + SMALL) == 0
  printed = capsys.readouterr().out
  [line] = [text for text in printed.splitlines() if text.startswith("eval: ")]
  assert line.startswith(f"eval: skipped evaluation and NoC: {out} has no eval records (0 in")
  assert "--eval-percent N" in line and "made with --eval-percent 0" in line
  m = json.load(open(os.path.join(model_dir, "metrics.json")))
  assert m["eval"]["examples"] == 0 and m["eval"]["skipped"] in line
  assert m["noc_skipped"] == m["eval"]["skipped"] and "noc" not in m
  assert not os.path.exists(os.path.join(model_dir, "eval"))
  config = json.load(open(os.path.join(model_dir, "config.json")))
  assert config["data"] == out  # Absolute: found from any folder by evaluate and export.
