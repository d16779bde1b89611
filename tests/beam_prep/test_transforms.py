"""PTransforms on Beam's TestPipeline, and the pipeline's accounting."""

import glob
import io
import json
import os

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that, equal_to
from PIL import Image

from beam_prep.transforms import ComputeDistanceMaps, ReadExamples, SampleClicks


def _png(arr, mode=None):
  buf = io.BytesIO()
  Image.fromarray(arr, mode=mode).save(buf, format="PNG")
  return buf.getvalue()


def test_sample_clicks_and_distance_maps_transforms():
  mask = np.zeros((64, 64), np.uint8)
  mask[10:50, 10:50] = 1
  obj = {
    "image_id": "x",
    "object_id": 1,
    "mask": mask,
    "instance_mask": mask,
    "image": np.zeros((64, 64, 3), np.uint8),
  }
  with BeamTestPipeline() as p:
    variants, errors = p | beam.Create([obj]) | SampleClicks(variants=3, seed=0)
    maps, map_errors = variants | ComputeDistanceMaps()
    summary = maps | beam.Map(
      lambda e: (e["variant"], e["distance_maps"].shape, int(e["distance_maps"][..., 0].min()))
    )
    assert_that(summary, equal_to([(v, (64, 64, 2), 0) for v in range(3)]))
    assert_that(errors, equal_to([]), label="NoClickErrors")
    assert_that(map_errors, equal_to([]), label="NoMapErrors")


def test_read_examples_pairs_images_and_masks(tmp_path):
  (tmp_path / "images").mkdir()
  (tmp_path / "masks").mkdir()
  img = np.zeros((8, 8, 3), np.uint8)
  (tmp_path / "images" / "a.png").write_bytes(_png(img))
  (tmp_path / "images" / "b.png").write_bytes(_png(img))
  (tmp_path / "images" / ".hidden").write_bytes(b"x")
  (tmp_path / "masks" / "a.png").write_bytes(_png(np.zeros((8, 8), np.uint8), "L"))
  with BeamTestPipeline() as p:
    examples, errors = p | ReadExamples(str(tmp_path))
    got = examples | beam.Map(lambda e: (e["image_id"], e["mask_bytes"] is not None))
    assert_that(got, equal_to([("a", True), ("b", False)]))
    assert_that(errors, equal_to([]), label="NoErrors")


def test_pipeline_output_accounting_and_records(prep_dir, sample_dir):
  manifest = json.load(open(os.path.join(prep_dir, "manifest.json")))
  c = manifest["counts"]
  n_images = len(os.listdir(os.path.join(sample_dir, "images")))
  assert c["inputs_read"] == n_images
  assert c["accounted"]
  assert c["images_used"] + c["images_failed"] == c["inputs_read"]
  written = sum(c["examples_written"].values())
  assert written == 2 * c["objects_used"] > 0
  assert c["examples_written"]["eval"] > 0
  errors = [
    json.loads(line)
    for f in glob.glob(os.path.join(prep_dir, "errors", "*.jsonl"))
    for line in open(f)
  ]
  assert len(errors) == c["errors_total"]
  assert all(e["source"] and e["reason"] and e["stage"] for e in errors)
  for name in ("transform_fn", "transformed_metadata", "metadata"):
    assert os.path.isdir(os.path.join(prep_dir, "transform", name))
  assert json.load(open(os.path.join(prep_dir, "config.json")))["image_size"] == 64

  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  files = sorted(glob.glob(os.path.join(prep_dir, "records", "train-*.tfrecord")))
  assert len(files) == manifest["shards"]["train"]["files"] >= 2
  n = sum(1 for _ in tf.data.TFRecordDataset(files))
  assert n == c["records_written"]["train"] and 2 * n == c["examples_written"]["train"]
  ex = tf.train.Example.FromString(next(iter(tf.data.TFRecordDataset(files))).numpy())
  f = ex.features.feature
  assert len(f["image"].bytes_list.value[0]) == 64 * 64 * 3  # once, raw
  assert len(f["distance_maps"].bytes_list.value) == 2  # one per variant
  assert len(f["positive_clicks"].bytes_list.value[0]) % 16 == 0  # (x, y) int64 pairs


def test_bad_inputs_reach_the_dead_letters(tmp_path):
  from pipelines import cli  # pylint: disable=g-import-not-at-top

  root = tmp_path / "data"
  (root / "images").mkdir(parents=True)
  (root / "masks").mkdir()
  img = np.full((40, 40, 3), 90, np.uint8)
  inst = np.zeros((40, 40), np.uint8)
  inst[5:35, 5:35] = 1
  (root / "images" / "good.png").write_bytes(_png(img))
  (root / "masks" / "good.png").write_bytes(_png(inst, "L"))
  (root / "images" / "nomask.png").write_bytes(_png(img))
  (root / "images" / "empty.png").write_bytes(b"")
  (root / "images" / "text.png").write_bytes(b"not an image at all")
  (root / "masks" / "text.png").write_bytes(_png(inst, "L"))
  (root / "images" / "small.png").write_bytes(_png(np.zeros((20, 40, 3), np.uint8)))
  (root / "masks" / "small.png").write_bytes(_png(inst, "L"))
  (root / "images" / "blank.png").write_bytes(_png(img))
  (root / "masks" / "blank.png").write_bytes(_png(np.zeros((40, 40), np.uint8), "L"))
  out = tmp_path / "out"
  with pytest.raises(SystemExit) as e:
    cli.main(
      [
        "segmentation",
        "--input",
        str(root),
        "--output",
        str(out),
        "--image-size",
        "32",
        "--variants",
        "1",
        "--eval-percent",
        "0",
      ]
    )
  # 5 of 6 inputs failed, over the default --max-error-fraction (0.5): the job
  # fails, writes everything but _SUCCESS, and the trainer would refuse it.
  assert e.value.code == 1
  assert not (out / "_SUCCESS").exists()
  assert json.load(open(out / "manifest.json"))["complete"] is False
  m = json.load(open(out / "manifest.json"))["counts"]
  assert m["inputs_read"] == 6 and m["images_failed"] == 5 and m["images_used"] == 1
  assert m["errors_by_reason"] == {
    "empty_image": 1,
    "mask_has_no_object": 1,
    "mask_size_mismatch": 1,
    "missing_mask": 1,
    "not_an_image": 1,
  }
  assert m["examples_written"]["train"] == 1
  errors = [
    json.loads(line) for f in glob.glob(str(out / "errors" / "*.jsonl")) for line in open(f)
  ]
  by_source = {os.path.basename(e["source"]): e["reason"] for e in errors}
  assert by_source == {
    "empty.png": "empty_image",
    "blank.png": "mask_has_no_object",
    "small.png": "mask_size_mismatch",
    "nomask.png": "missing_mask",
    "text.png": "not_an_image",
  }


def test_non_empty_output_is_refused_without_overwrite(prep_dir, sample_dir, capsys):
  from pipelines import cli  # pylint: disable=g-import-not-at-top

  with pytest.raises(SystemExit) as e:
    cli.main(["segmentation", "--input", sample_dir, "--output", prep_dir])
  assert e.value.code == 2
  assert "pass --overwrite" in capsys.readouterr().out
  assert os.path.exists(os.path.join(prep_dir, "manifest.json"))


def test_missing_input_is_a_clear_error(tmp_path, capsys):
  from pipelines import cli  # pylint: disable=g-import-not-at-top

  with pytest.raises(SystemExit) as e:
    cli.main(
      ["segmentation", "--input", str(tmp_path / "nothing"), "--output", str(tmp_path / "out")]
    )
  assert e.value.code == 2
  assert "does not exist" in capsys.readouterr().out
  (tmp_path / "empty").mkdir()
  with pytest.raises(SystemExit) as e:
    cli.main(
      ["segmentation", "--input", str(tmp_path / "empty"), "--output", str(tmp_path / "out")]
    )
  assert e.value.code == 2
  assert "no input layout recognises" in capsys.readouterr().out
  assert not (tmp_path / "out").exists()
