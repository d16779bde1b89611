"""The serving export: parity with the training path, signatures, bad inputs."""

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from beam_prep import keys
from tests.helpers import assert_serving_parity, png, run_cli
from train import models
from train.export import latest_export
from beam_prep.prep_output import PrepOutput


def _restored_model(model_dir):
  return models.rebuild(model_dir)


def _eval_examples(prep_dir, n=4):
  """The first eval examples in the example view (what serve_examples takes)."""
  prep = PrepOutput(prep_dir)
  return [prep.table.encode(ex) for ex in prep.read_numpy(keys.EVAL_SPLIT, limit=n)]


def test_serving_input_and_output_match_the_training_path(prep_dir, trained):
  assert_serving_parity(prep_dir, trained, n=4)


def test_batch_scoring_signature_takes_raw_examples(prep_dir, trained):
  loaded = tf.saved_model.load(latest_export(trained))
  examples = _eval_examples(prep_dir, 3)
  batch = loaded.signatures["serve_examples"](examples=tf.constant(examples))
  assert batch["probabilities"].shape == (3, 64, 64)
  for i, serialized in enumerate(examples):  # A batch scores each record as alone.
    one = loaded.signatures["serve_examples"](examples=tf.constant([serialized]))
    np.testing.assert_allclose(batch["probabilities"][i], one["probabilities"][0], atol=1e-5)


def test_serving_any_image_size_and_bad_inputs(trained):
  serving = tf.saved_model.load(latest_export(trained)).signatures["serving_default"]
  img = tf.constant(np.random.default_rng(0).integers(0, 255, (50, 90, 3), dtype=np.uint8))
  out = serving(image=img, positive_clicks=tf.constant([[45, 25]], tf.int32),
                negative_clicks=tf.zeros([0, 2], tf.int32))
  assert out["probabilities"].shape == (50, 90) and out["mask"].dtype == tf.uint8
  # Outside the image (and negative): clamped to the border, documented.
  clamped = serving(image=img, positive_clicks=tf.constant([[500, -7]], tf.int32),
                    negative_clicks=tf.constant([[-3, 900]], tf.int32))
  border = serving(image=img, positive_clicks=tf.constant([[89, 0]], tf.int32),
                   negative_clicks=tf.constant([[0, 49]], tf.int32))
  np.testing.assert_allclose(clamped["probabilities"], border["probabilities"], atol=1e-6)
  with pytest.raises(tf.errors.InvalidArgumentError, match="positive click"):
    serving(image=img, positive_clicks=tf.zeros([0, 2], tf.int32),
            negative_clicks=tf.zeros([0, 2], tf.int32))
  with pytest.raises(tf.errors.InvalidArgumentError, match="image is empty"):
    serving(image=tf.zeros([0, 5, 3], tf.uint8), positive_clicks=tf.constant([[0, 0]]),
            negative_clicks=tf.zeros([0, 2], tf.int32))


def test_a_wide_image_is_padded_in_its_records_and_served_back_in_place(tmp_path):
  """A 3:1 image: its record holds it fitted at the top, the padding ignore;
  the served mask of a model that marks a disk around the positive click
  (the object's size at the records' scale) lands on the object at the
  source's size."""
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow_transform as tft  # pylint: disable=g-import-not-at-top
  from beam_prep.features import FeatureTable  # pylint: disable=g-import-not-at-top
  from beam_prep.ops.image import resize_nearest  # pylint: disable=g-import-not-at-top
  from tests.helpers import records, red_disk_data  # pylint: disable=g-import-not-at-top
  from train.servers import SegmentationServer  # pylint: disable=g-import-not-at-top
  h, w, size, (cx, cy, r) = 60, 180, 96, (120, 30, 20)
  img, obj = red_disk_data(str(tmp_path), h, w, cx, cy, r)
  out = str(tmp_path / "prep")
  assert run_cli(["segmentation", "--input", str(tmp_path / "data"), "--output", out,
                  "--layout", "folders", "--image-size", str(size), "--variants", "1",
                  "--eval-percent", "0", "--crop", "none"]) == 0
  table = FeatureTable.load(out)
  [rec] = [table.decode_numpy(r.SerializeToString()) for r in records(out)]
  fit_h = h * size // w  # 32 rows of 96 hold the image; 64 rows are padding.
  mask = rec[keys.MASK].reshape(size, size)
  assert (mask[fit_h:] == keys.IGNORE).all() and (rec[keys.IMAGE][fit_h:] == 0).all()
  np.testing.assert_array_equal(mask[:fit_h], resize_nearest(obj.astype(np.uint8), fit_h, size))
  assert (int(rec[keys.HEIGHT]), int(rec[keys.WIDTH])) == (h, w)

  channel = 0  # The positive click's distance map among the model's inputs.
  for e in table.model_inputs:
    if e.key == keys.DISTANCE_MAPS:
      break
    channel += e.feature.channels
  radius = r * size / w / 255  # The object's radius at the records' scale, normalized.
  model = keras.Sequential([keras.Input((size, size, table.input_channels)), keras.layers.Lambda(
      lambda x: 100.0 * (radius - x[..., channel:channel + 1]))])
  server = SegmentationServer(model, tft.TFTransformOutput(os.path.join(out, keys.TRANSFORM_DIR)),
                              table)
  served = server.serve(tf.constant(img), tf.constant([[cx, cy]], tf.int32),
                        tf.zeros([0, 2], tf.int32))["mask"].numpy().astype(bool)
  assert served.shape == (h, w)
  iou = (served & obj).sum() / (served | obj).sum()
  assert iou > 0.9, iou
  ys, xs = np.nonzero(served)
  assert abs(xs.mean() - cx) < 1.5 and abs(ys.mean() - cy) < 1.5


def test_predict_cli_errors_are_clear(trained, tmp_path, capsys):
  from train import cli  # pylint: disable=g-import-not-at-top
  (tmp_path / "junk.png").write_bytes(b"not an image")
  (tmp_path / "ok.png").write_bytes(png(np.zeros((20, 30, 3), np.uint8)))
  cases = [
      (["--image", str(tmp_path / "junk.png"), "--positive", "1,1"], "cannot read image"),
      (["--image", str(tmp_path / "ok.png")], "at least one --positive"),
      (["--image", str(tmp_path / "ok.png"), "--positive", "3;4"], "X,Y"),
      (["--image", str(tmp_path / "nope.png"), "--positive", "1,1"], "nope.png"),
  ]
  for args, message in cases:
    with pytest.raises(SystemExit) as e:
      cli.main(["predict", "--model", trained, "--output", str(tmp_path / "m.png")] + args)
    assert e.value.code == 2
    assert message in capsys.readouterr().out
  with pytest.raises(SystemExit) as e:
    cli.main(["predict", "--model", trained, "--output", str(tmp_path / "m.png"),
              "--image", str(tmp_path / "ok.png"), "--positive", "100,-5"])
  assert e.value.code == 0
  assert "clamped" in capsys.readouterr().out
  assert Image.open(tmp_path / "m.png").size == (30, 20)


def test_saved_model_cli_show_and_run(trained, tmp_path):
  export = latest_export(trained)
  np.save(tmp_path / "image.npy", np.zeros((40, 50, 3), np.uint8))
  np.save(tmp_path / "pos.npy", np.array([[20, 20]], np.int32))
  np.save(tmp_path / "neg.npy", np.zeros((0, 2), np.int32))
  cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
  shown = subprocess.run([cli, "show", "--dir", export, "--all"], capture_output=True,
                         text=True, timeout=300)
  assert shown.returncode == 0, shown.stderr
  for text in ("serving_default", "serve_examples", "positive_clicks", "negative_clicks",
               "dtype: DT_UINT8", "probabilities"):
    assert text in shown.stdout
  ran = subprocess.run(
      [cli, "run", "--dir", export, "--tag_set", "serve", "--signature_def", "serving_default",
       "--inputs", f"image={tmp_path}/image.npy;positive_clicks={tmp_path}/pos.npy;"
       f"negative_clicks={tmp_path}/neg.npy"], capture_output=True, text=True, timeout=300)
  assert ran.returncode == 0, ran.stderr
  assert "probabilities" in ran.stdout and "mask" in ran.stdout


def test_classification_end_to_end(tmp_path, capsys):
  from train import cli  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  root = tmp_path / "classes"
  colours = {"red": (200, 30, 30), "blue": (30, 30, 200)}
  for label, colour in colours.items():
    (root / label).mkdir(parents=True)
    for i in range(12):
      img = np.clip(np.array(colour) + rng.normal(0, 25, (24, 24, 3)), 0, 255).astype(np.uint8)
      (root / label / f"{i}.png").write_bytes(png(img))
  prep = str(tmp_path / "prep")
  assert run_cli(["classification", "--input", str(root), "--output", prep, "--image-size", "16",
                  "--eval-percent", "25"]) == 0
  model_dir = str(tmp_path / "model")
  with pytest.raises(SystemExit) as e:
    cli.main(["fit", "--data", prep, "--model-dir", model_dir, "--steps", "30",
              "--batch-size", "4", "--width", "4", "--depth", "2", "--histogram-every", "0"])
  assert e.value.code == 0
  m = json.load(open(os.path.join(model_dir, "metrics.json")))
  assert m["task"] == "classification" and m["eval"]["classes"] == 2
  assert (f"eval: {m['eval']['examples']} examples, accuracy {m['eval']['accuracy']:.3f} over 2 "
          "classes") in capsys.readouterr().out
  import shutil  # pylint: disable=g-import-not-at-top
  shutil.rmtree(prep)
  serving = tf.saved_model.load(latest_export(model_dir)).signatures["serving_default"]
  red = io.BytesIO()
  Image.fromarray(np.full((30, 20, 3), (210, 20, 20), np.uint8)).save(red, format="JPEG")
  out = serving(image_bytes=tf.constant([red.getvalue(), png(np.full((8, 8, 3), (20, 20, 220),
                                                              np.uint8))]))
  assert out["probabilities"].shape == (2, 2)
  assert sorted(out["classes"].numpy().tolist()) == [b"blue", b"red"]
  assert out["label"].numpy().tolist() == [b"red", b"blue"]
  with pytest.raises(tf.errors.InvalidArgumentError):
    serving(image_bytes=tf.constant([b"not an image"]))
