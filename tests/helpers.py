"""Small builders of image files for tests."""

import atexit
import fcntl
import glob
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from PIL import Image
from beam_prep.record_codec import RecordCodec

# The project's root: the folder of setup.py and the packages.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# The settings of the session's records (`prep_dir`, tests/conftest.py).
PREP_ARGS = [
  "--preset",
  "smoke",
  "--image-size",
  "64",
  "--variants",
  "2",
  "--eval-percent",
  "30",
  "--target-shard-mb",
  "0.03",
  # 64 px records: many sample objects are too small to click.
  "--max-error-fraction",
  "1",
]


# The settings of the session's model (`trained`, 6 steps of them).
FIT_ARGS = [
  "--batch-size",
  "4",
  "--width",
  "4",
  "--depth",
  "2",
  "--histogram-every",
  "0",
  "--noc-clicks",
  "0",
]


def made_once(tmp_path_factory, name, make) -> str:
  """The folder `name`, made by `make(path)` once for every worker of this
  run (under pytest-xdist, by the first worker that asks; the others wait
  for it and only read it)."""
  root = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    root = root.parent  # The folder all workers of this run share.
  path = root / f"shared_{name}"
  with open(root / f"shared_{name}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not (root / f"shared_{name}.done").exists():
      make(str(path))
      (root / f"shared_{name}.done").touch()
  return str(path)


def png(arr, mode=None, **save) -> bytes:
  buf = io.BytesIO()
  Image.fromarray(arr, mode=mode).save(buf, format="PNG", **save)
  return buf.getvalue()


def encoded(im: Image.Image, fmt: str = "PNG") -> bytes:
  buf = io.BytesIO()
  im.save(buf, format=fmt)
  return buf.getvalue()


def unpng(data: bytes) -> np.ndarray:
  """A PNG file's pixels, as a client decodes them."""
  return np.asarray(Image.open(io.BytesIO(data)))


def assert_encoded_answer(got, want):
  """One image's answer from an encoded signature (`got`: its PNG files)
  against the array signature's outputs (`want`): the mask exactly (0 / 255
  greyscale), the probabilities' grey levels within 1 of round(p * 255)."""
  from train.export import signatures as sig  # pylint: disable=g-import-not-at-top

  mask, grey = unpng(got[sig.MASK_BYTES]), unpng(got[sig.PROBABILITIES_BYTES])
  assert mask.dtype == grey.dtype == np.uint8, (mask.dtype, grey.dtype)
  np.testing.assert_array_equal(mask, want[sig.MASK] * 255)
  assert grey.shape == want[sig.PROBABILITIES].shape, grey.shape
  levels = np.round(want[sig.PROBABILITIES].astype(np.float64) * 255)
  assert np.abs(grey - levels).max() <= 1, np.abs(grey - levels).max()


def scene(size=48, boxes=((6, 6, 30, 30),)):
  """(RGB image, instance mask) with one box-shaped object per entry."""
  img = np.full((size, size, 3), 80, np.uint8)
  inst = np.zeros((size, size), np.uint8)
  for i, (y0, x0, y1, x1) in enumerate(boxes, start=1):
    img[y0:y1, x0:x1] = (200, 40 * i % 255, 30)
    inst[y0:y1, x0:x1] = i
  return img, inst


def red_disk_data(root, h, w, cx, cy, r):
  """A folders-layout data set under ROOT/data: one h x w grey image with a red
  disk, its mask; returns (image, object mask bool)."""
  yy, xx = np.mgrid[:h, :w]
  obj = (xx - cx) ** 2 + (yy - cy) ** 2 <= r * r
  img = np.full((h, w, 3), 80, np.uint8)
  img[obj] = (200, 40, 30)
  for sub, arr, mode in (("images", img, None), ("masks", obj.astype(np.uint8), "L")):
    os.makedirs(os.path.join(root, "data", sub))
    with open(os.path.join(root, "data", sub, "a.png"), "wb") as f:
      f.write(png(arr, mode))
  return img, obj


def assert_never_imports(code: str, package: str) -> None:
  """Runs `code` in a fresh interpreter (in the project's root) and checks
  that it ran and that no module of `package` was imported."""
  check = (
    f"{code}\nimport sys\n"
    f"loaded = sorted(m for m in sys.modules if m.split('.')[0] == {package!r})\n"
    "assert not loaded, loaded[:5]\nprint('ok')\n"
  )
  run = subprocess.run(
    [sys.executable, "-c", check], capture_output=True, text=True, cwd=ROOT, timeout=300
  )
  assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout + run.stderr[-3000:]


def run_cli(argv):
  """Runs `beam-prep` in-process; returns its exit code."""
  from pipelines import cli  # pylint: disable=g-import-not-at-top

  try:
    cli.main(argv)
  except SystemExit as e:
    return e.code
  raise AssertionError("beam-prep did not exit")


def manifest(out) -> dict:
  with open(os.path.join(out, "manifest.json")) as f:
    return json.load(f)


def dead_letters(out):
  return [
    json.loads(line)
    for f in sorted(glob.glob(os.path.join(out, "errors", "*.jsonl")))
    for line in open(f)
  ]


def records(out, split="*"):
  """The records of a split ("*": train and eval, not the source records)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from beam_prep import keys  # pylint: disable=g-import-not-at-top

  splits = (keys.TRAIN_SPLIT, keys.EVAL_SPLIT) if split == "*" else (split,)
  files = sorted(f for s in splits for f in glob.glob(keys.record_pattern(out, s)))
  comp = keys.compression_of(files[0]) if files else ""
  return [
    tf.train.Example.FromString(r.numpy())
    for r in tf.data.TFRecordDataset(files, compression_type=comp)
  ]


def examples(out, split="*"):
  """The examples of a split's records, decoded by the output's features.json
  (one dict of numpy arrays per (object, variant))."""
  from beam_prep.features import FeatureTable  # pylint: disable=g-import-not-at-top

  table = FeatureTable.load(out)
  decoded = RecordCodec(table).decode_records([r.SerializeToString() for r in records(out, split)])
  return [ex for examples in decoded for ex in examples]


def assert_serving_parity(prep_dir, export, n=3, model=None):
  """The serving graph against the training path on `n` eval records.

  Every model input the twins compute equals the records' bytes, the model
  input equals the trainer's, and the exported SavedModel's probabilities
  equal the trained model's on the trainer's input (`serving_default` on the
  record's image, refined by it as every click is; for crop records, whose
  image is the crop already, `serve_examples` on the record).

  Args:
    export: a SavedModel, or a dir with versions (a fit model dir).
    model: the trained Keras model; default: rebuilt from the fit model dir
      `export` (model.json and its newest checkpoint).
  """
  import numpy as np  # pylint: disable=g-import-not-at-top,reimported
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_transform as tft  # pylint: disable=g-import-not-at-top
  from beam_prep import keys  # pylint: disable=g-import-not-at-top
  from beam_prep.features import FeatureTable  # pylint: disable=g-import-not-at-top
  from train.evaluate import clicker  # pylint: disable=g-import-not-at-top
  from train import models  # pylint: disable=g-import-not-at-top
  from train.fit.data import Decoder, Parser  # pylint: disable=g-import-not-at-top
  from train.export import guided_filter  # pylint: disable=g-import-not-at-top
  from train.export.saved_model import SegmentationServer, latest_export  # pylint: disable=g-import-not-at-top
  from train.export.serving_inputs import serving_side  # pylint: disable=g-import-not-at-top
  from train.tasks import make_task  # pylint: disable=g-import-not-at-top

  table = FeatureTable.load(prep_dir)
  tft_out = tft.TFTransformOutput(os.path.join(prep_dir, keys.TRANSFORM_DIR))
  task = make_task(table, tft_out)
  if model is None:
    model = models.rebuild(export)
  server = SegmentationServer(model, tft_out, table)
  signatures = tf.saved_model.load(latest_export(export)).signatures
  crops = keys.CROP_BOX in table
  frame = {keys.CROP_BOX: tf.constant([0, 0, *table.image_size], tf.int64)} if crops else {}
  files = sorted(glob.glob(keys.record_pattern(prep_dir, keys.EVAL_SPLIT)))
  checked = 0
  decoder = Decoder(table, task.transform_keys)
  parser = Parser(tft_out, table, task)
  reader = Decoder(table, parser.read_keys(training=False))
  for serialized in [r.numpy() for r in tf.data.TFRecordDataset(files).take(n)]:
    # Every variant of the record: the example view, and what the trainer
    # reads of it (the step makes the click inputs from the clicks).
    raw = decoder.decode(tf.constant([serialized]), training=False)
    train_all, _ = parser(reader.stored(tf.constant([serialized]), training=False), training=False)
    for i, rec in enumerate(RecordCodec(table).decode_examples(serialized)):
      clicks = {k: rec[k] for k in (keys.POSITIVE_CLICKS, keys.NEGATIVE_CLICKS)}
      served = server.raw_model_input(
        {
          keys.IMAGE: tf.constant(rec[keys.IMAGE]),
          **frame,
          **{k: tf.constant(v) for k, v in clicks.items()},
        }
      )
      assert set(served) == set(table.keys("model_input"))
      for key, value in served.items():  # uint8 exact: the very bytes of the records
        assert value.numpy() == raw[key][i].numpy(), key
      train_inputs = train_all[i : i + 1]
      np.testing.assert_array_equal(
        server.model_input({k: v[None] for k, v in served.items()}).numpy(), train_inputs.numpy()
      )
      if crops:  # The record's image is its crop already: scored as it is.
        out = {
          k: v[0]
          for k, v in signatures["serve_examples"](
            examples=tf.constant([RecordCodec(table).encode(rec)])
          ).items()
        }
      else:
        out = signatures["serving_default"](
          image=tf.constant(rec[keys.IMAGE]),
          **{k: tf.constant(v, tf.int32) for k, v in clicks.items()},
        )
      want = tf.sigmoid(model(train_inputs, training=False))[0, ..., 0]
      if not crops:  # The click signatures refine the model's answer by the image.
        h, w = rec[keys.IMAGE].shape[:2]
        seen = serving_side(table).seen({}, h, w)
        want = guided_filter.refine(tf.constant(rec[keys.IMAGE]), want, seen)
      want = want.numpy()
      np.testing.assert_allclose(out["probabilities"].numpy(), want, atol=1e-5)
      np.testing.assert_array_equal(out["mask"].numpy(), (want > clicker.PRED_THR).astype(np.uint8))
      checked += 1
  assert checked, f"no eval records in {prep_dir}"


# How often a browser test's wait looks again (selenium's default, 0.5 s, is
# most of the wait for an answer of the page's server).
POLL_SECONDS = 0.05


def browser(width: int = 1280, height: int = 800):
  """A headless Chromium driven by selenium, or a skip saying what is missing."""
  try:
    from selenium import webdriver  # pylint: disable=g-import-not-at-top
    from selenium.webdriver.chrome.service import Service  # pylint: disable=g-import-not-at-top
  except ImportError:
    pytest.skip("selenium is not installed (pip install 'beam-prep[test]')")
  chromium = shutil.which("chromium") or shutil.which("chromium-browser")
  driver = shutil.which("chromedriver")
  if not chromium or not driver:
    pytest.skip(
      "no chromium/chromedriver here (Debian: apt-get install chromium "
      "chromium-driver; .ci/run does it)"
    )
  options = webdriver.ChromeOptions()
  options.binary_location = chromium
  for flag in (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
  ):
    options.add_argument(flag)
  options.add_argument(f"--window-size={width},{height}")
  profile = tempfile.mkdtemp(prefix="chromium_profile_")
  atexit.register(shutil.rmtree, profile, ignore_errors=True)  # Chromium has quit by then.
  options.add_argument(f"--user-data-dir={profile}")
  return webdriver.Chrome(options=options, service=Service(driver))
