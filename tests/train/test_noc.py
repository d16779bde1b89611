"""NoC evaluation: the in-graph click step (`train.evaluate.clicker`) against a scipy
reference, the loop's counting with predictors of known quality, tracing, and
`beam-train evaluate` on a trained model."""

import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf
from scipy import ndimage

from beam_prep import keys
from beam_prep.ops.clicks import nearest_click_mask, protocol_click, protocol_clicks
from train.evaluate import clicker, noc


def _edt_sq_reference(mask):
  """scipy's EDT of the mask padded by one False pixel, squared, as integers."""
  d = ndimage.distance_transform_edt(np.pad(mask, 1))[1:-1, 1:-1]
  return np.rint(d**2).astype(np.int64)


def _blobs(rng, h, w, n):
  out = np.zeros((h, w), bool)
  for _ in range(n):
    cy, cx, r = rng.integers(0, h), rng.integers(0, w), rng.integers(1, max(2, h // 3))
    yy, xx = np.mgrid[:h, :w]
    out |= (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r
  return out


@pytest.mark.parametrize("h, w", [(17, 23), (32, 32), (1, 9)])
def test_edt_equals_scipy(h, w):
  rng = np.random.default_rng(h * w)
  masks = np.stack(
    [_blobs(rng, h, w, 3) for _ in range(6)] + [np.ones((h, w), bool), np.zeros((h, w), bool)]
  )
  for edt in (clicker.edt_squared, clicker.edt_squared_graph):  # host (CPU) and graph (GPU)
    got = edt(tf.constant(masks)).numpy()
    for m, g in zip(masks, got):
      np.testing.assert_array_equal(g, _edt_sq_reference(m))


def test_next_click_equals_the_scipy_reference():
  """train.evaluate.clicker's TensorFlow step against beam_prep's numpy/scipy clicker."""
  rng = np.random.default_rng(0)
  h, w, cases = 24, 31, 40
  preds, labels, clicked, want = [], [], [], []
  for i in range(cases):
    gt = _blobs(rng, h, w, 2)
    label = gt.astype(np.uint8)
    if i % 3 == 0:  # Ignore pixels are never errors.
      label[_blobs(rng, h, w, 1)] = keys.IGNORE
    pred = _blobs(rng, h, w, 2) if i % 4 else np.zeros((h, w), bool)
    if i % 7 == 0:
      pred = label == 1  # No error: no click.
    done = rng.random((h, w)) < 0.05
    preds.append(pred)
    labels.append(label)
    clicked.append(done)
    want.append(protocol_click(pred, label, done))
  xy, kind = clicker.next_click(
    tf.constant(np.stack(preds)), tf.constant(np.stack(labels)), tf.constant(np.stack(clicked))
  )
  got = [(int(p[0]), int(p[1]), int(k)) for p, k in zip(xy.numpy(), kind.numpy())]
  assert got == want
  assert {g[2] for g in got} == {1, -1}
  # No error left: a negative click at (0, 0), as RITM's clicker gives it.
  no_error = [i for i in range(cases) if i % 7 == 0]
  assert no_error and all(got[i] == (0, 0, -1) for i in no_error)


def _objects(n=5, h=32, w=32, seed=1):
  rng = np.random.default_rng(seed)
  labels = np.stack([_blobs(rng, h, w, 1).astype(np.uint8) for _ in range(n)])
  labels[0, :3] = keys.IGNORE
  images = np.zeros((n, h, w, 3), np.uint8)
  images[..., 0] = np.where(labels == 1, 255, 0)  # What the "perfect" predictor reads.
  return images, labels


def _perfect(images, clicks, kinds):
  del clicks, kinds
  return tf.where(images[..., 0] > 127, 1.0, -1.0)


def _never(images, clicks, kinds):
  del clicks, kinds
  return -tf.ones(tf.shape(images)[:3])


def test_a_perfect_predictor_needs_one_click():
  images, labels = _objects()
  loop = noc.ClickLoop(_perfect, labels.shape[1:], max_clicks=5)
  scores, clicks, kinds, _ = loop.run(images, labels)
  report = noc.summarize(scores, (0.85, 0.9))
  assert report["noc@85"] == report["noc@90"] == 1.0
  assert report["never_reached@90"] == 0.0
  assert (kinds[:, 0] == 1).all()
  # No error left: RITM's clicker goes on with negative clicks at (0, 0).
  assert (kinds[:, 1:] == -1).all() and (clicks[:, 1:] == 0).all()


def test_a_predictor_that_never_gets_there_counts_max_clicks():
  images, labels = _objects()
  loop = noc.ClickLoop(_never, labels.shape[1:], max_clicks=7)
  scores, clicks, kinds, _ = loop.run(images, labels)
  report = noc.summarize(scores, (0.85, 0.9))
  assert report["noc@85"] == report["noc@90"] == 7.0
  assert report["never_reached@85"] == 1.0 and report["mean_iou_by_clicks"]["5"] == 0.0
  # All clicks positive (only misses), each on a distinct object pixel.
  assert (kinds == 1).all()
  for c, label in zip(clicks, labels):
    assert len({tuple(p) for p in c}) == 7 and all(label[y, x] == 1 for x, y in c)


def test_ritms_threshold_empty_union_and_over_max_count():
  """A probability of 0.495 is object at RITM's 0.49, not at 0.5; an object
  with nothing to find never reaches a threshold; >=K@t counts NoC == K,
  reached at the last click included."""
  images, labels = _objects(n=2)
  just_above = lambda im, c, k: tf.where(im[..., 0] > 127, float(np.log(0.495 / 0.505)), -9.0)
  for thr, want in ((0.49, 1.0), (0.5, 4.0)):
    scores, *_ = noc.ClickLoop(just_above, labels.shape[1:], 4, pred_thr=thr).run(images, labels)
    assert noc.summarize(scores, (0.85,))["noc@85"] == want
  empty = np.zeros_like(labels[:1])
  empty[0, :4] = keys.IGNORE
  scores, *_ = noc.ClickLoop(_never, labels.shape[1:], 3).run(images[:1], empty)
  assert (scores == 0).all() and noc.summarize(scores, (0.85,))["never_reached@85"] == 1.0
  report = noc.summarize(np.array([[0.1, 0.9, 0.9], [0.1, 0.1, 0.9], [0.1, 0.1, 0.1]]), (0.85,))
  assert report["noc@85"] == (2 + 3 + 3) / 3
  assert report[">=3@85"] == 2 and report["never_reached@85"] == pytest.approx(1 / 3)


def test_the_loop_is_traced_once_per_input_shape():
  images, labels = _objects(n=5)
  loop = noc.ClickLoop(clicker.baseline_logits, labels.shape[1:], max_clicks=6)
  loop.run(images[:3], labels[:3])
  loop.run(images[3:], labels[3:])  # Another batch size, same image shape.
  assert loop.traces == {"first": 1, "step": 1}


def test_baseline_is_the_trainers_nearest_click_baseline():
  """NoC's baseline on its clicks equals the trainer's eval baseline on the
  records' sparse clicks (`clicker.dense_clicks`), and brute force."""
  rng = np.random.default_rng(3)
  h, w, k = 20, 26, 4
  clicks = rng.integers(0, [w, h], (3, k, 2)).astype(np.int64)
  kinds = np.array([[1, -1, 1, 0], [1, 0, 0, 0], [1, -1, -1, -1]], np.int32)
  got = (
    clicker.baseline_logits(
      tf.zeros([3, h, w, 3], tf.uint8), tf.constant(clicks), tf.constant(kinds)
    ).numpy()
    > 0
  )

  def sparse(kind):
    rows = [c[kd == kind].reshape(-1) for c, kd in zip(clicks, kinds)]
    return tf.ragged.constant(rows, dtype=tf.int64).to_sparse()

  records_clicks, records_kinds = clicker.dense_clicks(sparse(1), sparse(-1))
  trainer = clicker.nearest_click_logits(records_clicks, records_kinds, h, w).numpy() > 0
  np.testing.assert_array_equal(got, trainer)
  yy, xx = np.mgrid[:h, :w]
  for b in range(3):  # Brute force: nearer a positive than every negative click.
    d2 = [(yy - y) ** 2 + (xx - x) ** 2 for x, y in clicks[b]]
    pos = np.min([d for d, k in zip(d2, kinds[b]) if k == 1], axis=0)
    neg = np.min([d for d, k in zip(d2, kinds[b]) if k == -1] or [np.full((h, w), 1e18)], axis=0)
    np.testing.assert_array_equal(got[b], pos < neg)


def test_evaluate_writes_noc_plot_and_sheet_for_model_and_baseline(trained, tmp_path, capsys):
  """`beam-train evaluate` of a fit model dir (a copy of the session's: the
  report and its events go into it). fit's own NoC: tests/train/test_user_models.py."""
  import shutil  # pylint: disable=g-import-not-at-top

  from train import cli  # pylint: disable=g-import-not-at-top

  model_dir = str(tmp_path / "model")
  shutil.copytree(trained, model_dir)
  with pytest.raises(SystemExit) as e:
    cli.main(
      ["evaluate", "--model", model_dir, "--resolution", "records"]
      + ["--max-clicks", "4", "--iou", "0.5,0.85"]
    )
  assert e.value.code == 0
  out = capsys.readouterr().out
  assert "NoC@50" in out and "nearest-click baseline" in out
  report = json.load(open(os.path.join(model_dir, "eval", noc.NOC_FILE)))
  for name in ("model", "baseline"):
    r = report[name]
    assert r["max_clicks"] == 4 and 1 <= r["noc@50"] <= r["noc@85"] <= 4
    assert set(r["mean_iou_by_clicks"]) == {"1", "2", "3"} and len(r["mean_iou_curve"]) == 4
  assert report["step_traces"]["model"] == {"first": 1, "step": 1}
  assert report["model"]["objects"] == len(report["objects"]) > 0
  # One record per object: no object counted twice over its variants.
  assert len(set(report["objects"])) == len(report["objects"])
  from PIL import Image  # pylint: disable=g-import-not-at-top

  for f in (noc.PLOT_FILE, noc.SHEET_FILE):
    im = Image.open(os.path.join(model_dir, "eval", f))
    assert max(im.size) >= 512 and np.asarray(im.convert("L")).std() > 10
  events = tf.io.gfile.glob(os.path.join(model_dir, "tensorboard", "eval", "events.*"))
  tags = {
    v.tag for f in events for ev in tf.compat.v1.train.summary_iterator(f) for v in ev.summary.value
  }
  assert {"noc@50/model", "noc@85/baseline"} <= tags


def test_evaluate_from_another_folder_finds_the_data_the_model_was_trained_on(
  prep_dir, trained, tmp_path, monkeypatch, capsys
):
  """The session's model, as if trained in `work` on `work/prep` (fit records
  the data path absolute: test_trainer.py's empty eval split test), evaluated
  from `elsewhere`; then as a model dir from before, its paths as typed in `work`."""
  from train import cli  # pylint: disable=g-import-not-at-top

  work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
  elsewhere.mkdir()
  # Without its export: evaluate then runs the checkpoint on the records.
  shutil.copytree(trained, work / "model", ignore=shutil.ignore_patterns("export"))
  os.symlink(prep_dir, work / "prep")
  config_file = work / "model" / "config.json"
  config = dict(json.load(open(config_file)), data=str(work / "prep"))
  json.dump(config, open(config_file, "w"))
  monkeypatch.chdir(elsewhere)
  evaluate = ["evaluate", "--model", str(work / "model"), "--max-clicks", "2", "--max-objects", "2"]
  with pytest.raises(SystemExit) as e:
    cli.main(evaluate)
  assert e.value.code == 0
  assert f"on the eval objects of {work / 'prep'}" in capsys.readouterr().out
  # A model dir from before: the paths as typed in `work`, found from `elsewhere`.
  json.dump(dict(config, data="prep", model_dir="model"), open(config_file, "w"))
  with pytest.raises(SystemExit) as e:
    cli.main(evaluate)
  assert e.value.code == 0
  assert f"on the eval objects of {work / 'prep'}" in capsys.readouterr().out


def test_protocol_variants_replay_the_loop_against_the_baseline():
  """The records' strategy-4 clicks are what the evaluation loop gives the
  nearest-click baseline, click for click."""
  images, labels = _objects(n=4, seed=5)
  k = 6
  loop = noc.ClickLoop(clicker.baseline_logits, labels.shape[1:], max_clicks=k)
  _, clicks, kinds, _ = loop.run(images, labels)
  for label, c, kd in zip(labels, clicks, kinds):
    pos, neg = protocol_clicks(label, k)  # Stops when no error is left ...
    n = len(pos) + len(neg)
    assert (c[n:] == 0).all() and (kd[n:] == -1).all()  # ... where the loop clicks (0, 0).
    c, kd = c[:n], kd[:n]
    assert [tuple(p) for p, t in zip(c, kd) if t == 1] == [tuple(p) for p in pos]
    assert [tuple(p) for p, t in zip(c, kd) if t == -1] == [tuple(p) for p in neg]
  h, w = labels.shape[1:]
  np.testing.assert_array_equal(
    nearest_click_mask(pos, neg, h, w),
    clicker.baseline_logits(
      tf.zeros([1, h, w, 3], tf.uint8), tf.constant(c[None]), tf.constant(kd[None])
    ).numpy()[0]
    > 0,
  )
