"""NoC at source resolution (`beam-train evaluate --data`): a GrabCut-format
set written by the test, prepared as an evaluation-only output, evaluated
with the nearest-click baseline; every object's NoC against a numpy
transcription of RITM's clicker, IoU and NoC count at the images' own
size; and the memory of a 1536x1536 image."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image
from scipy import ndimage

from beam_prep import source_records
from tests.helpers import ROOT, manifest, run_cli

SIZES = [(37, 50), (64, 64), (70, 41)]  # (H, W): none is the records' size
MAX_CLICKS = 8


def _trimap(rng, h, w):
  """A grey GrabCut mask: 255 two blobs' object, 128 a band along its boundary, 0 background."""
  yy, xx = np.mgrid[:h, :w]
  obj = np.zeros((h, w), bool)
  for _ in range(2):
    cy, cx, r = rng.integers(h // 4, 3 * h // 4), rng.integers(w // 4, 3 * w // 4), h // 5
    obj |= (yy - cy) ** 2 + ((xx - cx) * 0.8) ** 2 <= r * r
  band = ndimage.binary_dilation(obj, iterations=1) & ~ndimage.binary_erosion(obj)
  m = np.where(obj, 255, 0).astype(np.uint8)
  m[band] = 128
  return m


def _grabcut_set(root, sizes, seed=0):
  rng = np.random.default_rng(seed)
  (root / "data_GT").mkdir(parents=True)
  (root / "boundary_GT").mkdir()
  masks = {}
  for i, (h, w) in enumerate(sizes):
    image = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
    Image.fromarray(image).save(root / "data_GT" / f"im{i}.jpg", quality=95)
    masks[f"im{i}"] = _trimap(rng, h, w)
    Image.fromarray(masks[f"im{i}"]).save(root / "boundary_GT" / f"im{i}.bmp")
  return masks


# ---- RITM's evaluation, transcribed (the reference) ----------------------------


def ritm_next_click(gt, pred, not_ignore, not_clicked):
  """isegm/inference/clicker.py Clicker._get_next_click (padding=True, cv2's exact
  L2 transform as scipy's): (is_positive, y, x)."""
  fn = np.pad(gt & ~pred & not_ignore, 1)
  fp = np.pad(~gt & pred & not_ignore, 1)
  fn_dt = ndimage.distance_transform_edt(fn)[1:-1, 1:-1] * not_clicked
  fp_dt = ndimage.distance_transform_edt(fp)[1:-1, 1:-1] * not_clicked
  positive = fn_dt.max() > fp_dt.max()
  d = fn_dt if positive else fp_dt
  ys, xs = np.where(d == d.max())
  return positive, ys[0], xs[0]


def ritm_iou(gt, pred, not_ignore):
  """isegm/inference/utils.py get_iou (0/0 is NaN: never >= a threshold)."""
  with np.errstate(invalid="ignore"):
    return (pred & gt & not_ignore).sum() / ((pred | gt) & not_ignore).sum()


def ritm_baseline_noc(trimap, thresholds, max_clicks):
  """RITM's evaluate_sample with the nearest-click baseline as the predictor,
  then compute_noc_metric's _get_noc."""
  gt, not_ignore = trimap == 255, trimap != 128
  h, w = gt.shape
  pred = np.zeros((h, w), bool)
  not_clicked = np.ones((h, w), bool)
  clicks, ious = [], []
  for _ in range(max_clicks):
    positive, y, x = ritm_next_click(gt, pred, not_ignore, not_clicked)
    clicks.append((positive, y, x))
    not_clicked[y, x] = False
    yy, xx = np.mgrid[:h, :w]
    d = {True: np.full((h, w), np.inf), False: np.full((h, w), np.inf)}
    for kind, cy, cx in clicks:
      d[kind] = np.minimum(d[kind], (yy - cy) ** 2 + (xx - cx) ** 2)
    pred = d[True] < d[False]
    ious.append(ritm_iou(gt, pred, not_ignore))
  ious = np.array(ious)
  return [int(np.argmax(ious >= t) + 1) if np.any(ious >= t) else max_clicks for t in thresholds]


def _prep_eval_only(data, out):
  assert (
    run_cli(
      [
        "segmentation",
        "--input",
        str(data),
        "--output",
        str(out),
        "--image-size",
        "32",
        "--variants",
        "1",
        "--eval-percent",
        "100",
        "--progress-seconds",
        "0",
        "--max-error-fraction",
        "1",
      ]
    )
    == 0
  )


def _evaluate(argv):
  from train import cli  # pylint: disable=g-import-not-at-top

  with pytest.raises(SystemExit) as e:
    cli.main(["evaluate"] + argv)
  return e.value.code


def test_baseline_noc_at_source_resolution_equals_ritms(tmp_path, capsys):
  masks = _grabcut_set(tmp_path / "GrabCut", SIZES)
  prep = tmp_path / "prep"
  _prep_eval_only(tmp_path / "GrabCut", prep)
  m = manifest(prep)
  assert m["complete"] and m["eval_only"] and m["counts"]["source_records"] == len(SIZES)
  assert m["counts"]["examples_written"]["train"] == 0
  assert not os.path.exists(prep / "transform")  # Nothing to train on: no analysis.
  from train import cli  # pylint: disable=g-import-not-at-top

  with pytest.raises(SystemExit) as e:
    cli.main(["fit", "--data", str(prep), "--model-dir", str(tmp_path / "m"), "--steps", "1"])
  assert e.value.code == 1 and "is an evaluation-only output" in capsys.readouterr().out
  out = tmp_path / "noc"
  assert (
    _evaluate(["--data", str(prep), "--output", str(out), "--max-clicks", str(MAX_CLICKS)]) == 0
  )
  assert "NoC@85 of the nearest-click baseline" in capsys.readouterr().out
  report = json.load(open(out / "noc.json"))
  assert report["resolution"] == "source" and report["pred_thr"] == 0.49
  assert "tensorflow" in report["versions"] and report["model_path"] is None
  rows = {r["image_id"]: r for r in report["objects"]}
  assert sorted(rows) == sorted(masks)  # One object per image, every one evaluated.
  for image_id, trimap in masks.items():
    row = rows[image_id]
    assert (row["height"], row["width"]) == trimap.shape
    want = ritm_baseline_noc(trimap, (0.85, 0.90), MAX_CLICKS)
    assert [row["baseline"]["noc@85"], row["baseline"]["noc@90"]] == want, image_id
  assert report["skipped_objects"] == [] and report["min_area"] == 0
  nocs = [r["baseline"]["noc@85"] for r in report["objects"]]
  # An output whose job did not finish is refused, as for training.
  os.remove(prep / "_SUCCESS")
  assert _evaluate(["--data", str(prep), "--output", str(out)]) == 1
  assert "_SUCCESS is missing" in capsys.readouterr().out
  assert report["baseline"]["noc@85"] == pytest.approx(np.mean(nocs))
  assert report["baseline"][f">={MAX_CLICKS}@85"] == sum(n >= MAX_CLICKS for n in nocs)


def test_source_records_hold_the_image_and_mask_at_their_own_size(tmp_path):
  masks = _grabcut_set(tmp_path / "GrabCut", SIZES[:1])
  prep = tmp_path / "prep"
  _prep_eval_only(tmp_path / "GrabCut", prep)
  from beam_prep.prep_output import PrepOutput  # pylint: disable=g-import-not-at-top
  from train.evaluate.source_eval import object_labels, source_images  # pylint: disable=g-import-not-at-top

  (image,) = list(source_images(PrepOutput(str(prep))))
  shown = np.asarray(Image.open(tmp_path / "GrabCut" / "data_GT" / "im0.jpg").convert("RGB"))
  np.testing.assert_array_equal(image["image"], shown)
  ids, labels, small = object_labels(image["instance_mask"])
  trimap = masks["im0"]
  assert ids == [1] and small == []
  assert object_labels(image["instance_mask"], min_area=int((trimap == 255).sum()) + 1)[2] == [1]
  np.testing.assert_array_equal(labels[0] == 1, trimap == 255)
  np.testing.assert_array_equal(labels[0] == 255, trimap == 128)
  # A job with an eval split writes them beside the records; an older output without them
  # is told how to get them.
  shards = [f for f in os.listdir(prep / "records") if f.startswith(source_records.SPLIT)]
  assert shards == [f"{source_records.SPLIT}-00000-of-00001.tfrecord"]


def test_a_1536_pixel_image_is_evaluated_in_bounded_memory(tmp_path):
  """The whole evaluation of a 1536x1536 GrabCut-format image, in its own
  process: peak memory under 3 GB (every tensor is [B, H, W])."""
  _grabcut_set(tmp_path / "GrabCut", [(1536, 1536)])
  prep = tmp_path / "prep"
  _prep_eval_only(tmp_path / "GrabCut", prep)
  script = (
    "import resource, sys\n"
    "from train import cli\n"
    "try:\n  cli.main(sys.argv[1:])\nexcept SystemExit as e:\n  code = e.code\n"
    "print('PEAK_MB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)\n"
    "sys.exit(code)\n"
  )
  run = subprocess.run(
    [
      sys.executable,
      "-c",
      script,
      "evaluate",
      "--data",
      str(prep),
      "--output",
      str(tmp_path / "noc"),
      "--max-clicks",
      "3",
    ],
    capture_output=True,
    text=True,
    cwd=ROOT,
    timeout=600,
  )
  assert run.returncode == 0, run.stdout + run.stderr
  peak = int(run.stdout.split("PEAK_MB")[1].split()[0])
  assert peak < 3000, peak
  report = json.load(open(tmp_path / "noc" / "noc.json"))
  assert [(r["height"], r["width"]) for r in report["objects"]] == [(1536, 1536)]


def test_flip_averaging_mirrors_image_clicks_and_previous_mask():
  """--flip: the mean of the prediction and the mirrored image's, mirrored back."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from train.evaluate.source_eval import flip_averaged  # pylint: disable=g-import-not-at-top

  h, w = 5, 7
  calls = []

  def probabilities(image, positive, negative, previous):
    calls.append(
      (int(image[0, 0, 0]), positive.numpy().tolist(), negative.numpy().tolist(), previous.numpy())
    )
    ramp = tf.cast(tf.range(w), tf.float32) / (w - 1)  # left 0 .. right 1
    return tf.tile(ramp[None], [h, 1]) * tf.cast(tf.reduce_max(image), tf.float32) / 255

  image = np.zeros((h, w, 3), np.uint8)
  image[:, -1] = 255  # the right column is bright, so the mirror's first pixel is
  previous = np.zeros((h, w), np.uint8)
  previous[:, :2] = 1
  out = flip_averaged(probabilities)(
    tf.constant(image), tf.constant([[1, 2]]), tf.constant([[6, 0]]), tf.constant(previous)
  )
  np.testing.assert_allclose(out.numpy(), 0.5)  # a ramp and its mirror average out
  (first, pos, neg, prev), (mirror, mpos, mneg, mprev) = sorted(calls, key=lambda c: c[0])
  assert (first, mirror) == (0, 255)
  assert (pos, neg, mpos, mneg) == ([[1, 2]], [[6, 0]], [[5, 2]], [[0, 0]])
  np.testing.assert_array_equal(mprev, prev[:, ::-1])
