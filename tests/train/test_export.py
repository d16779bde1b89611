"""The serving export: parity with the training path, signatures, bad inputs."""

import io
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from beam_prep import keys
from tests.helpers import assert_encoded_answer, assert_serving_parity, png, run_cli, unpng
from train import models
from train.export.saved_model import latest_export
from beam_prep.prep_output import PrepOutput
from beam_prep.record_codec import RecordCodec


def _restored_model(model_dir):
  return models.rebuild(model_dir)


def _eval_examples(prep_dir, n=4):
  """The first eval examples in the example view (what serve_examples takes)."""
  prep = PrepOutput(prep_dir)
  return [RecordCodec(prep.table).encode(ex) for ex in prep.read_numpy(keys.EVAL_SPLIT, limit=n)]


def test_serving_input_and_output_match_the_training_path(prep_dir, trained):
  assert_serving_parity(prep_dir, trained, n=4)


def test_batch_scoring_signature_takes_raw_examples(prep_dir, trained_loaded):
  loaded = trained_loaded
  examples = _eval_examples(prep_dir, 3)
  batch = loaded.signatures["serve_examples"](examples=tf.constant(examples))
  assert batch["probabilities"].shape == (3, 64, 64)
  for i, serialized in enumerate(examples):  # A batch scores each record as alone.
    one = loaded.signatures["serve_examples"](examples=tf.constant([serialized]))
    np.testing.assert_allclose(batch["probabilities"][i], one["probabilities"][0], atol=1e-5)


def test_serving_any_image_size_and_bad_inputs(trained_loaded):
  serving = trained_loaded.signatures["serving_default"]
  img = tf.constant(np.random.default_rng(0).integers(0, 255, (50, 90, 3), dtype=np.uint8))
  out = serving(
    image=img,
    positive_clicks=tf.constant([[45, 25]], tf.int32),
    negative_clicks=tf.zeros([0, 2], tf.int32),
  )
  assert out["probabilities"].shape == (50, 90) and out["mask"].dtype == tf.uint8
  # Outside the image (and negative): clamped to the border, documented.
  clamped = serving(
    image=img,
    positive_clicks=tf.constant([[500, -7]], tf.int32),
    negative_clicks=tf.constant([[-3, 900]], tf.int32),
  )
  border = serving(
    image=img,
    positive_clicks=tf.constant([[89, 0]], tf.int32),
    negative_clicks=tf.constant([[0, 49]], tf.int32),
  )
  np.testing.assert_allclose(clamped["probabilities"], border["probabilities"], atol=1e-6)
  with pytest.raises(tf.errors.InvalidArgumentError, match="positive click"):
    serving(
      image=img,
      positive_clicks=tf.zeros([0, 2], tf.int32),
      negative_clicks=tf.zeros([0, 2], tf.int32),
    )
  with pytest.raises(tf.errors.InvalidArgumentError, match="image is empty"):
    serving(
      image=tf.zeros([0, 5, 3], tf.uint8),
      positive_clicks=tf.constant([[0, 0]]),
      negative_clicks=tf.zeros([0, 2], tf.int32),
    )


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
  from train.export.servers import SegmentationServer  # pylint: disable=g-import-not-at-top

  h, w, size, (cx, cy, r) = 60, 180, 96, (120, 30, 20)
  img, obj = red_disk_data(str(tmp_path), h, w, cx, cy, r)
  out = str(tmp_path / "prep")
  assert (
    run_cli(
      [
        "segmentation",
        "--input",
        str(tmp_path / "data"),
        "--output",
        out,
        "--layout",
        "folders",
        "--image-size",
        str(size),
        "--variants",
        "1",
        "--eval-percent",
        "0",
        "--crop",
        "none",
      ]
    )
    == 0
  )
  table = FeatureTable.load(out)
  [rec] = [RecordCodec(table).decode_numpy(r.SerializeToString()) for r in records(out)]
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
  model = keras.Sequential(
    [
      keras.Input((size, size, table.input_channels)),
      keras.layers.Lambda(lambda x: 100.0 * (radius - x[..., channel : channel + 1])),
    ]
  )
  server = SegmentationServer(
    model, tft.TFTransformOutput(os.path.join(out, keys.TRANSFORM_DIR)), table
  )
  served = (
    server.serve(tf.constant(img), tf.constant([[cx, cy]], tf.int32), tf.zeros([0, 2], tf.int32))[
      "mask"
    ]
    .numpy()
    .astype(bool)
  )
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
  # A wrong image or click is said before any model is loaded (or looked for).
  for args, message in cases[:1] + cases[2:]:
    with pytest.raises(SystemExit) as e:
      cli.main(["predict", "--model", str(tmp_path / "none"), "--output", "m.png"] + args)
    assert e.value.code == 2 and message in capsys.readouterr().out
  with pytest.raises(SystemExit) as e:
    cli.main(
      [
        "predict",
        "--model",
        trained,
        "--output",
        str(tmp_path / "m.png"),
        "--image",
        str(tmp_path / "ok.png"),
        "--positive",
        "100,-5",
      ]
    )
  assert e.value.code == 0
  assert "clamped" in capsys.readouterr().out
  assert Image.open(tmp_path / "m.png").size == (30, 20)


def test_saved_model_cli_show_and_run(trained, tmp_path):
  export = latest_export(trained)
  np.save(tmp_path / "image.npy", np.zeros((40, 50, 3), np.uint8))
  np.save(tmp_path / "pos.npy", np.array([[20, 20]], np.int32))
  np.save(tmp_path / "neg.npy", np.zeros((0, 2), np.int32))
  cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
  shown = subprocess.run(
    [cli, "show", "--dir", export, "--all"], capture_output=True, text=True, timeout=300
  )
  assert shown.returncode == 0, shown.stderr
  for text in (
    "serving_default",
    "serve_examples",
    "positive_clicks",
    "negative_clicks",
    "dtype: DT_UINT8",
    "probabilities",
  ):
    assert text in shown.stdout
  ran = subprocess.run(
    [
      cli,
      "run",
      "--dir",
      export,
      "--tag_set",
      "serve",
      "--signature_def",
      "serving_default",
      "--inputs",
      f"image={tmp_path}/image.npy;positive_clicks={tmp_path}/pos.npy;"
      f"negative_clicks={tmp_path}/neg.npy",
    ],
    capture_output=True,
    text=True,
    timeout=300,
  )
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
  assert (
    run_cli(
      [
        "classification",
        "--input",
        str(root),
        "--output",
        prep,
        "--image-size",
        "16",
        "--eval-percent",
        "25",
      ]
    )
    == 0
  )
  model_dir = str(tmp_path / "model")
  with pytest.raises(SystemExit) as e:
    cli.main(
      [
        "fit",
        "--data",
        prep,
        "--model-dir",
        model_dir,
        "--steps",
        "30",
        "--batch-size",
        "4",
        "--width",
        "4",
        "--depth",
        "2",
        "--histogram-every",
        "0",
      ]
    )
  assert e.value.code == 0
  m = json.load(open(os.path.join(model_dir, "metrics.json")))
  assert m["task"] == "classification" and m["eval"]["classes"] == 2
  assert (
    f"eval: {m['eval']['examples']} examples, accuracy {m['eval']['accuracy']:.3f} over 2 classes"
  ) in capsys.readouterr().out
  import shutil  # pylint: disable=g-import-not-at-top

  shutil.rmtree(prep)
  serving = tf.saved_model.load(latest_export(model_dir)).signatures["serving_default"]
  red = io.BytesIO()
  Image.fromarray(np.full((30, 20, 3), (210, 20, 20), np.uint8)).save(red, format="JPEG")
  out = serving(
    image_bytes=tf.constant([red.getvalue(), png(np.full((8, 8, 3), (20, 20, 220), np.uint8))])
  )
  assert out["probabilities"].shape == (2, 2)
  assert sorted(out["classes"].numpy().tolist()) == [b"blue", b"red"]
  assert out["label"].numpy().tolist() == [b"red", b"blue"]
  with pytest.raises(tf.errors.InvalidArgumentError):
    serving(image_bytes=tf.constant([b"not an image"]))


def _encoded(arr, fmt="PNG", **save):
  buf = io.BytesIO()
  Image.fromarray(arr).save(buf, format=fmt, **save)
  return buf.getvalue()


def test_encoded_signatures_answer_as_the_array_ones_on_the_decoded_pixels(trained_served):
  from beam_prep.ops.image import decode_file  # pylint: disable=g-import-not-at-top

  model = trained_served
  rng = np.random.default_rng(4)
  image = rng.integers(0, 256, (41, 57, 3), dtype=np.uint8)
  pos, neg = [[10, 12], [30, 20]], [[50, 3]]
  jpeg = _encoded(image, "JPEG", quality=85)
  # The PNG's pixels are the image; the JPEG's those the Beam job's decoder
  # gives (PIL), which the graph's decoder reproduces exactly. The answer is
  # PNG files: the array signature's mask exactly, its probabilities' grey levels.
  for data, pixels in ((_encoded(image), image), (jpeg, decode_file(jpeg))):
    want = model.segment(pixels, pos, neg)
    got = model.predict(*model.encoded_inputs(data, pos, neg))
    assert sorted(got) == ["mask_bytes", "probabilities_bytes"], sorted(got)
    assert_encoded_answer({k: v[0] for k, v in got.items()}, want)
    # The next click: the decoded PNG (0 / 255) is the previous mask as is.
    previous = unpng(got["mask_bytes"][0])
    want = model.segment(pixels, pos, neg, want["mask"])
    got = model.predict(*model.encoded_inputs(data, pos, neg, previous))
    assert_encoded_answer({k: v[0] for k, v in got.items()}, want)
  # A batch is each image alone, each at its own size.
  small = _encoded(image[:20])
  batch = model.predict(
    "serve_encoded",
    {
      "image_bytes": [jpeg, small],
      "positive_clicks": [pos, pos],
      "negative_clicks": np.zeros([2, 0, 2]),
    },
  )
  alone = model.predict(*model.encoded_inputs(small, pos, []))
  for k in alone:
    assert batch[k][1] == alone[k][0], k
  assert [unpng(m).shape for m in batch["mask_bytes"]] == [(41, 57), (20, 57)]
  from train.export.served import InvalidInput  # pylint: disable=g-import-not-at-top

  with pytest.raises(InvalidInput, match="previous_mask: must have the image's height"):
    model.predict(
      "serve_iterative_encoded",
      {
        "image_bytes": [jpeg, small],
        "positive_clicks": [pos, pos],
        "negative_clicks": [neg, neg],
        "previous_mask": np.zeros([2, 41, 57], np.uint8),
      },
    )
  with pytest.raises(InvalidInput, match="positive_clicks: at least one positive click"):
    model.predict(*model.encoded_inputs(jpeg, np.zeros([0, 2]), neg))
  with pytest.raises(InvalidInput, match="image_bytes: at least one image is required"):
    model.predict(
      "serve_encoded",
      {
        "image_bytes": np.zeros([0], object),
        "positive_clicks": np.zeros([0, 0, 2], np.int32),
        "negative_clicks": np.zeros([0, 0, 2], np.int32),
      },
    )
  # A box prompt (serve_box_encoded): the array signature's answer for the box.
  box = [40, 30, 5, 3]
  with pytest.raises(InvalidInput, match=r"box: must be \[x0, y0, x1, y1\] with x0 <= x1"):
    model.predict(*model.encoded_inputs(jpeg, [], neg, box=box))
  box = [5, 3, 40, 30]
  got = model.predict(*model.encoded_inputs(jpeg, [], neg, box=box))
  want = model.segment(decode_file(jpeg), [], neg, box=box)
  assert_encoded_answer({k: v[0] for k, v in got.items()}, want)
  assert not want["mask"][31:].any() and not want["mask"][:, 41:].any()


def test_an_exif_rotated_jpeg_is_served_as_displayed(trained_served):
  """A phone photo: pixels stored as the sensor saw them (24 x 48) and EXIF
  orientation 6 (turned 90 degrees clockwise to show: 48 x 24). The encoded
  signature answers for the picture as shown, as the array signature does
  for the shown pixels; clicks are in the shown picture."""
  from beam_prep.ops.image import decode_file  # pylint: disable=g-import-not-at-top

  model = trained_served
  stored = np.random.default_rng(5).integers(0, 256, (24, 48, 3), dtype=np.uint8)
  exif = Image.Exif()
  exif[0x0112] = 6
  jpeg = _encoded(stored, "JPEG", quality=90, exif=exif.tobytes())
  shown = decode_file(jpeg)
  assert shown.shape == (48, 24, 3)
  as_stored = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"))  # No EXIF applied.
  np.testing.assert_array_equal(shown, np.rot90(as_stored, k=-1))
  pos, neg = [[5, 40]], [[20, 3]]
  got = model.predict(*model.encoded_inputs(jpeg, pos, neg))
  want = model.segment(shown, pos, neg)
  assert unpng(got["mask_bytes"][0]).shape == (48, 24)
  assert_encoded_answer({k: v[0] for k, v in got.items()}, want)


def test_serve_examples_says_in_one_line_what_an_example_lacks(prep_dir, trained_served):
  """The job's own records (an object with its variants stacked) and other
  wrong examples are refused with one line naming the feature and why."""
  from beam_prep.features import FeatureTable  # pylint: disable=g-import-not-at-top
  from tests.helpers import records  # pylint: disable=g-import-not-at-top
  from train.export.served import InvalidInput  # pylint: disable=g-import-not-at-top

  model = trained_served
  job = [r.SerializeToString() for r in records(prep_dir, keys.EVAL_SPLIT)][:2]
  good = tf.train.Example.FromString(_eval_examples(prep_dir, 1)[0])

  def changed(key, values=None):
    ex = tf.train.Example()
    ex.CopyFrom(good)
    del ex.features.feature[key]
    if values is not None:
      ex.features.feature[key].CopyFrom(values)
    return ex.SerializeToString()

  odd = tf.train.Feature(int64_list=tf.train.Int64List(value=[1, 2, 3]))
  short = tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"abc"]))
  floats = tf.train.Feature(float_list=tf.train.FloatList(value=[1.0, 2.0]))
  cases = [
    # Either click list is found first.
    (
      job,
      "examples[0]: feature '(positive|negative)_clicks' holds string values where "
      "serve_examples reads int64: beam-prep's records stack an object's click variants",
    ),
    ([changed("image")], "examples: an example has no feature 'image' (string)"),
    ([b"\xff not a tf.Example"], "examples: a value is not a serialized tf.Example"),
    (
      [changed("image", short)],
      "examples: feature 'image' must hold the raw bytes of uint8 [64, 64, 3]",
    ),
    (
      [changed("negative_clicks", odd)],
      "examples: feature 'negative_clicks' must hold (x, y) pairs",
    ),
    (
      [changed("positive_clicks")],
      "examples: feature 'positive_clicks': each example needs a positive click",
    ),
    (
      [changed("positive_clicks", floats)],
      "examples[0]: feature 'positive_clicks' holds float values where serve_examples reads int64",
    ),
  ]
  for examples, message in cases:
    with pytest.raises(InvalidInput) as e:
      model.predict("serve_examples", {"examples": examples})
    assert re.match(
      re.escape(message).replace(r"\(positive\|negative\)", "(positive|negative)"), str(e.value)
    ) and "\n" not in str(e.value), str(e.value)
  # What it asks for: the records' examples, as RecordCodec.encode writes them.
  table = FeatureTable.load(prep_dir)
  examples = [RecordCodec(table).encode(ex) for ex in RecordCodec(table).decode_examples(job[0])]
  assert model.predict("serve_examples", {"examples": examples})["mask"].shape[0] == len(examples)
