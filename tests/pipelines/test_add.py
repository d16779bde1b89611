"""`beam-prep segmentation --add`: the images an output does not hold yet (by
digest) become a new shard set of it, read with its own transform; the
manifest accounts for every set; a refused add changes nothing, and what a
failed or stopped add left goes with the next one."""

import collections
import json
import os
import shutil

import numpy as np
from PIL import Image

from beam_prep import image_index, keys
from beam_prep.layouts import folders
from beam_prep.prep_output import PrepOutput
from beam_prep.sample_data import write_sample_data
from pipelines import shard_sets
from pipelines.report import problems
from tests.helpers import manifest, run_cli
from tests.pipelines.test_transform_from import SETTINGS, _same_tree


def _add(data, out, *more) -> int:
  return run_cli(
    ["segmentation", "--input", str(data), "--output", str(out), "--add", *SETTINGS, *more]
  )


def _input(tmp_path, sample_dir, new: int, relabel: bool, twin: bool = False) -> str:
  """The sample's images (one drawn again when `relabel`), `new` others, and
  with `twin` one of the sample's images again under another name with
  another mask (a second object of the same photograph)."""
  data = tmp_path / "input"
  shutil.copytree(sample_dir, data)
  if new:
    write_sample_data(str(tmp_path / "new"), count=new, seed=11)
    for sub in (folders.IMAGES_DIR, folders.MASKS_DIR):
      for name in os.listdir(tmp_path / "new" / sub):
        shutil.copy(tmp_path / "new" / sub / name, data / sub / f"new_{name}")
  masks = sorted(os.listdir(os.path.join(sample_dir, folders.MASKS_DIR)))
  if twin:
    image = sorted(os.listdir(os.path.join(sample_dir, folders.IMAGES_DIR)))[0]
    shutil.copy(data / folders.IMAGES_DIR / image, data / folders.IMAGES_DIR / f"twin_{image}")
    mask = np.asarray(Image.open(data / folders.MASKS_DIR / masks[0]))
    Image.fromarray((mask == mask.max()).astype(np.uint8)).save(
      data / folders.MASKS_DIR / f"twin_{masks[0]}"
    )
  if relabel:
    path = data / folders.MASKS_DIR / masks[-1]
    mask = np.asarray(Image.open(path)).copy()
    mask[mask == mask.max()] = 0  # One object less.
    Image.fromarray(mask).save(path)
  return str(data)


def _index(out):
  return [
    json.loads(line)
    for path in image_index.index_files(str(out), {"", "add0001", "add0002"})
    for line in open(path)
  ]


def test_only_new_images_are_added_as_a_set_the_manifest_sums(sample_dir, prep_dir, tmp_path):
  out = tmp_path / "out"
  shutil.copytree(prep_dir, out)
  before = manifest(out)
  held = before["counts"]["images_used"]
  assert len(_index(out)) == held  # Every job indexes the images it holds.
  assert _add(_input(tmp_path, sample_dir, new=3, relabel=True, twin=True), out) == 0
  m = manifest(out)
  assert [s["name"] for s in m["sets"]] == ["", "add0001"] and m["complete"]
  own = m["sets"][1]["counts"]
  # The same bytes with other labels under another name are a new input.
  assert (own["images_known"], own["images_relabelled"]) == (10, 1)
  assert own["inputs_read"] == 14 and own["images_used"] + own["images_failed"] == 4
  assert own["images_used"] >= 1 and own["accounted"]
  c = m["counts"]
  assert c["images_used"] == held + own["images_used"] and c["accounted"]
  for split in (keys.TRAIN_SPLIT, keys.EVAL_SPLIT):
    assert c["examples_written"][split] == sum(
      s["counts"]["examples_written"][split] for s in m["sets"]
    )
  # Read as one output: every set's records, the transform it had.
  prep = PrepOutput(str(out))
  prep.check_trainable()
  n = sum(1 for _ in prep.dataset(keys.TRAIN_SPLIT))
  assert (
    n == m["shards"][keys.TRAIN_SPLIT]["records"] > before["shards"][keys.TRAIN_SPLIT]["records"]
  )
  assert any("-add0001-" in f for f in prep.files(keys.TRAIN_SPLIT))
  assert _same_tree(os.path.join(prep_dir, keys.TRANSFORM_DIR), out / keys.TRANSFORM_DIR)
  # The paths are the output's own (it is a copy of another).
  assert m["paths"]["records"] == str(out / keys.RECORDS_DIR)
  assert m["paths"]["preview"] == str(out / keys.PREVIEW_FILE)
  index = _index(out)
  assert len(index) == c["images_used"]
  assert len({(e[image_index.DIGEST], e[image_index.LABELS]) for e in index}) == len(index)
  # Again: nothing new, a set that adds nothing; the output stays complete.
  # With the output's own settings, as the docs say, from a config.json
  # whose run replaced its output and copied a transform (an engine round's).
  settings = json.loads((out / keys.CONFIG_FILE).read_text())
  settings.update(overwrite=True, transform_from=str(prep_dir))
  (tmp_path / "settings.json").write_text(json.dumps(settings))
  again = _input(tmp_path / "again", sample_dir, new=3, relabel=False, twin=True)
  argv = ["segmentation", "--config", str(tmp_path / "settings.json"), "--input", again]
  assert run_cli(argv + ["--output", str(out), "--add", "--progress-seconds", "0"]) == 0
  m = manifest(out)
  assert m["sets"][2]["counts"]["images_known"] == 14 and m["sets"][2]["counts"]["images_used"] == 0
  assert m["complete"] and (out / keys.SUCCESS_FILE).exists()
  assert collections.Counter(e[keys.IMAGE_ID] for e in _index(out)) == collections.Counter(
    e[keys.IMAGE_ID] for e in index
  )


def test_a_refused_add_changes_nothing_and_a_failed_sets_files_go_with_the_next(
  sample_dir, prep_dir, tmp_path, capsys
):
  out = tmp_path / "out"
  shutil.copytree(prep_dir, out)
  data = _input(tmp_path, sample_dir, new=2, relabel=False)
  before = manifest(out)
  other = [s if s != "64" else "48" for s in SETTINGS]
  code = run_cli(["segmentation", "--input", data, "--output", str(out), "--add", *other])
  assert code == 2 and manifest(out) == before and (out / keys.SUCCESS_FILE).exists()
  assert _add(data, out, "--overwrite") == 2
  assert _add(data, tmp_path / "none") == 2
  capsys.readouterr()
  with shard_sets.one_job_adding(str(out)):  # Another job adding to it meanwhile.
    assert _add(data, out) == 2
  assert f"another job is adding to {out}" in capsys.readouterr().out
  assert manifest(out) == before and (out / keys.SUCCESS_FILE).exists()
  # A set that failed (listed, incomplete) and one a stopped job left (not listed).
  failed = out / keys.RECORDS_DIR / "train-add0001-00000-of-00001.tfrecord"
  stopped = out / image_index.INDEX_DIR / "images-add0005-00000-of-00001.jsonl"
  failed.write_bytes(b"")
  stopped.write_text("{}\n")
  temp = out / ".temp-0123" / "x"  # A stopped job's temp folder.
  temp.mkdir(parents=True)
  (temp / "train-00000-00000.tfrecord").write_bytes(b"x")
  listed = dict(before, sets=[{"name": "", **before}, {"name": "add0001", **before}])
  listed["sets"][1].update(complete=False, problems=["no record was written"])
  (out / keys.MANIFEST_FILE).write_text(json.dumps(listed))
  (out / keys.SUCCESS_FILE).unlink()
  assert _add(data, out) == 0
  m = manifest(out)
  assert [s["name"] for s in m["sets"]] == ["", "add0002"] and m["complete"]
  assert not failed.exists() and not stopped.exists() and not (out / ".temp-0123").exists()
  assert m["sets"][1]["counts"]["images_known"] == 10
  # The failed set's counts are gone from the totals with it.
  used = before["counts"]["images_used"] + m["sets"][1]["counts"]["images_used"]
  assert m["counts"]["images_used"] == used
  # An output made before outputs had an image index cannot say what it holds.
  old = tmp_path / "old"
  shutil.copytree(prep_dir, old)
  shutil.rmtree(old / image_index.INDEX_DIR)
  m = manifest(old)
  del m["shards"]["index"]
  (old / keys.MANIFEST_FILE).write_text(json.dumps(m))
  assert _add(data, old) == 2 and (old / keys.SUCCESS_FILE).exists()


def test_an_evaluation_only_output_takes_more_evaluation_images(sample_dir, tmp_path):
  """A benchmark's output (every input eval, source records at each image's
  own size) indexes each image it holds, by its source record alone too:
  here every object is under --min-object-area, so no record is written."""
  out = tmp_path / "bench"
  settings = [s if s != "30" else "100" for s in SETTINGS] + ["--min-object-area", "100000000"]
  argv = ["segmentation", "--input", sample_dir, "--output", str(out), *settings]
  assert run_cli(argv) == 0
  first = manifest(out)
  assert first["eval_only"] and first["counts"]["source_records"] > 0
  assert not sum(first["counts"]["examples_written"].values())
  held = first["counts"]["images_used"]
  assert len(_index(out)) == held
  assert run_cli(argv + ["--add"]) == 0
  own = manifest(out)["sets"][1]["counts"]
  assert own["images_known"] == held and own["images_used"] == 0
  assert _add(sample_dir, out) == 2  # Train records are not added to it.


def test_an_input_is_held_by_its_bytes_and_labels_and_an_id_held_is_a_relabel():
  held = image_index.Held({"A": [("x", "L1")]}, {"x"})
  status = image_index.status
  assert status(held, "x", "A", "L1") == image_index.HELD
  assert status(held, "y", "A", "L1") == image_index.HELD  # The same file again.
  assert status(held, "y", "A", "L2") == image_index.NEW  # Another object of the photograph.
  assert status(held, "x", "A", "L2") == image_index.RELABELLED  # A mask drawn again.
  assert status(held, "x", "B", "L1") == image_index.RELABELLED  # A file replaced.
  assert status(held, "z", "B", "L1") == image_index.NEW
  # Where an image has one label (a class), its bytes under another id with
  # another label are that photo moved to another class.
  classes = image_index.Held({"A": [("cat/x", "cat")]}, {"cat/x"}, one_label_per_image=True)
  assert status(classes, "dog/x", "A", "dog") == image_index.RELABELLED
  assert status(classes, "cat/y", "A", "cat") == image_index.HELD  # A copy in the same class.
  assert status(classes, "dog/y", "B", "dog") == image_index.NEW


def test_a_photo_moved_to_another_class_is_a_relabel_not_a_new_image(tmp_path, capsys):
  root = tmp_path / "classes"
  rng = np.random.default_rng(0)
  for label in ("cat", "dog"):
    (root / label).mkdir(parents=True)
    for i in range(3):
      image = rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)
      Image.fromarray(image).save(root / label / f"{label}{i}.png")
  out = str(tmp_path / "out")
  argv = ["classification", "--input", str(root), "--output", out, "--image-size", "16"]
  argv += ["--eval-percent", "0"]
  assert run_cli(argv) == 0
  os.rename(root / "cat" / "cat0.png", root / "dog" / "cat0.png")
  capsys.readouterr()
  assert run_cli(argv + ["--add"]) == 0
  _, added = manifest(out)["sets"]
  assert added["counts"]["images_known"] == 6 and added["counts"]["images_relabelled"] == 1
  assert added["counts"]["images_used"] == 0  # Not a second record of the photo.
  assert "(1 with other labels: run without --add to train on those)" in capsys.readouterr().out


def test_an_add_is_judged_with_what_the_output_holds():
  counts = {
    "accounted": True,
    "examples_written": {keys.TRAIN_SPLIT: 0, keys.EVAL_SPLIT: 0},
    "examples_made": 0,
    "example_errors": 0,
    "inputs_read": 11,
    "images_known": 10,
    "images_failed": 0,
    "objects_found": 1,
    "objects_failed": 1,  # One new label, its object too small to click.
  }
  held = {"images_used": 10, "objects_used": 30, "examples_written": {keys.TRAIN_SPLIT: 60}}
  assert problems(counts, 0.5, held=held) == []
  assert problems(counts, 0.5) == ["1 of 1 objects failed (100%), over --max-error-fraction 0.5"]
  counts.update(inputs_read=30, images_failed=20)  # 20 new images of 20 failed.
  assert problems(counts, 0.5, held=held) == [
    "20 of 30 images (with those the output held) failed (67%), over --max-error-fraction 0.5"
  ]


def test_a_failed_add_says_the_sets_before_it_are_unchanged():
  from pipelines.report import failure_lines  # pylint: disable=g-import-not-at-top

  m = {
    "problems": ["set add0002: no record was written"],
    "counts": {"errors_by_reason": {}},
    "paths": {"errors": "out/errors"},
    "sets": [{"name": ""}, {"name": "add0002"}],
  }
  assert "the sets before add0002 are unchanged: the next --add removes it" in failure_lines(m)[-1]
  assert "--add" not in failure_lines(dict(m, sets=None))[-1]


def test_a_files_set_is_read_from_its_name_past_the_ten_thousandth_add():
  assert image_index.set_name(7) == "add0007" and image_index.set_name(10000) == "add10000"
  for name in ("add0007", "add10000"):
    assert image_index.file_set(f"o/records/train-{name}-00003-of-00004.tfrecord") == name
    assert image_index.file_set(f"o/index/images-{name}-00000-of-00001.jsonl") == name
  assert image_index.file_set("o/records/train-00000-of-00001.tfrecord") == ""  # The first job's.
