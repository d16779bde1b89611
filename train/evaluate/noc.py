"""NoC evaluation: how many clicks a simulated user needs, model vs no model.

The protocol of the interactive segmentation literature (DIOS, Xu et al.
2016; RITM, Sofiiuk et al. 2021; SimpleClick, 2023), here as RITM's clicker
runs it (`train.evaluate.clicker`: the first click at the object's interior point
farthest from its boundary, then each click at the error pixel farthest from
its error region's boundary). After each click the click encodings are
computed again from all clicks so far, by the TensorFlow twins of the ops
that wrote the records (whatever features.json names), and the model
predicts again, up to `max_clicks`.

NoC@t is the mean over objects of the first click count whose IoU reaches t
(`max_clicks` when never); `>=K@t` counts the objects whose NoC is K =
`max_clicks` (reached at the last click, or never), as RITM's tables do, beside
`never_reached@t`, the share never reaching t. The mask is the model's
probability above `--pred-thr` (RITM's 0.49). Everything from the click step to the encodings
and the model runs in one `tf.function` per click, batched over objects and
traced once per input shape, so it runs at inference speed and on the GPU
when there is one. The nearest-click baseline (a pixel is object when it is
nearer a positive than a negative click; no model) runs the same loop.

Evaluation runs at the records' resolution, on one record per eval object
(its lowest variant): the image and label the records hold.
"""

import json
import os
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf
from PIL import Image, ImageDraw

from beam_prep import drawing, keys
from beam_prep.prep_output import PrepOutput
from train.evaluate import clicker, protocol
from train import graphs
from train.model_layout import NOC_FILE, noc_key, threshold_name
from train.export.servers import SegmentationServer

IOU_AT = (1, 2, 3, 5, 10, 20)
PROTOCOL = (
  "RITM's clicker: the first click at the object's interior point farthest from its "
  "boundary, then at the error pixel farthest from its error region's boundary "
  "(negative at (0, 0) when no error is left); the mask is probability > pred_thr; "
  "IoU over non-ignore pixels, an empty union never reaching a threshold; NoC is "
  "max_clicks when never reached"
)
SHEET_CLICKS = (1, 3, 5)
PLOT_FILE = "iou_by_clicks.png"
SHEET_FILE = "contact_sheet.png"


class ModelPredictor:
  """The model on images and clicks through the serving graph's own path
  (`SegmentationServer.probabilities`: the twins of the records' ops,
  tf.Transform, the model, and for crop records the crop of the previous
  mask), as logits."""

  uses_previous_mask = True

  def __init__(self, model, tft_output, table):
    self._server = SegmentationServer(model, tft_output, table)

  def __call__(self, images, clicks, kinds, previous):
    return logits_per_image(self._server.probabilities, images, clicks, kinds, previous)


def logits_per_image(probabilities, images, clicks, kinds, previous):
  """A loop predictor from `probabilities(image, positive_clicks,
  negative_clicks, previous_mask)` -> [H, W] of one image: mapped over the
  batch, the clicks split by kind, the probabilities turned into logits
  (clipped to 1e-7 from 0 and 1: finite)."""

  def one(args):
    image, xy, kind, prev = args
    prob = probabilities(
      image,
      tf.boolean_mask(xy, tf.equal(kind, clicker.POSITIVE)),
      tf.boolean_mask(xy, tf.equal(kind, clicker.NEGATIVE)),
      prev,
    )
    prob = tf.clip_by_value(prob, 1e-7, 1 - 1e-7)
    return tf.math.log(prob) - tf.math.log1p(-prob)

  return tf.map_fn(
    one,
    (images, clicks, kinds, previous),
    fn_output_signature=tf.TensorSpec([None, None], tf.float32),
  )


class ClickLoop:
  """The click loop of one predictor, two traced functions (first click, step).

  Args:
    predictor: (images uint8 [B, H, W, 3], clicks int64 [B, K, 2], kinds
      int32 [B, K]) -> logits [B, H, W]; one whose `uses_previous_mask` is
      True also gets the previous click's mask, bool [B, H, W] (all False
      at the first click).
    image_size: (H, W) of every batch (the records'), or None: any size (the
      source images; traced once for all sizes).
    max_clicks: K.
    pred_thr: a pixel is object where the probability exceeds it.
  """

  def __init__(
    self, predictor: Callable, image_size, max_clicks: int, pred_thr: float = clicker.PRED_THR
  ):
    h, w = image_size or (None, None)
    above = clicker.logit_threshold(pred_thr)
    self.max_clicks = k = max_clicks
    self.traces = {"first": 0, "step": 0}
    images = tf.TensorSpec([None, h, w, 3], tf.uint8)
    labels = tf.TensorSpec([None, h, w], tf.uint8)
    clicks = tf.TensorSpec([None, k, 2], tf.int64)
    kinds = tf.TensorSpec([None, k], tf.int32)

    def first(labels_):
      self.traces["first"] += 1
      none = tf.zeros(tf.shape(labels_), tf.bool)
      xy, kind = clicker.next_click(none, labels_, none)
      return _put(
        xy,
        kind,
        tf.zeros([tf.shape(labels_)[0], k, 2], tf.int64),
        tf.zeros([tf.shape(labels_)[0], k], tf.int32),
        0,
      )

    with_previous = getattr(predictor, "uses_previous_mask", False)

    def step(images_, labels_, clicks_, kinds_, previous_, n):
      """Predicts with the clicks so far (n of them), then adds click n+1."""
      self.traces["step"] += 1
      args = (images_, clicks_, kinds_) + ((previous_,) if with_previous else ())
      pred = predictor(*args) > above
      scores = clicker.label_iou(pred, labels_)
      shape = tf.shape(labels_)
      clicked = clicker.clicked_map(clicks_, kinds_, shape[1], shape[2])
      xy, kind = clicker.next_click(pred, labels_, clicked)
      return (scores, pred) + _put(xy, kind, clicks_, kinds_, n)

    self._first = graphs.function(first, input_signature=[labels])
    self._step = graphs.function(
      step,
      input_signature=[
        images,
        labels,
        clicks,
        kinds,
        tf.TensorSpec([None, h, w], tf.bool),
        tf.TensorSpec([], tf.int32),
      ],
    )

  def run(self, images: np.ndarray, labels: np.ndarray, keep: int = 0):
    """-> (IoU float32 [B, K] after 1..K clicks, clicks, kinds, kept masks).

    kept masks: {clicks: bool [keep, H, W]} after each of SHEET_CLICKS, for
    the first `keep` objects.
    """
    clicks, kinds = self._first(labels)
    scores, kept = [], {}
    pred = tf.zeros(labels.shape, tf.bool)
    for n in range(1, self.max_clicks + 1):
      s, pred, clicks, kinds = self._step(images, labels, clicks, kinds, pred, tf.constant(n))
      scores.append(s.numpy())
      if keep and n in SHEET_CLICKS:
        kept[n] = pred.numpy()[:keep]
    return np.stack(scores, axis=1), clicks.numpy(), kinds.numpy(), kept


def _put(xy, kind, clicks, kinds, n):
  """Clicks and kinds with click `n` (0-based; none past the last slot) set."""
  k = tf.shape(kinds)[1]
  slot = tf.one_hot(tf.minimum(n, k - 1), k, on_value=True, off_value=False, dtype=tf.bool)[
    None, :
  ] & (n < k)
  return (tf.where(slot[..., None], xy[:, None, :], clicks), tf.where(slot, kind[:, None], kinds))


def object_noc(scores: np.ndarray, t: float) -> np.ndarray:
  """int [N]: each object's NoC@t from its IoUs [N, K] after 1..K clicks (K when never)."""
  reached = scores >= t
  return np.where(reached.any(axis=1), reached.argmax(axis=1) + 1, scores.shape[1])


def summarize(scores: np.ndarray, thresholds: Sequence[float]) -> Dict[str, Any]:
  """NoC@t, the share never reaching t, and mean IoU by clicks, from [N, K] IoUs."""
  n, k = scores.shape
  out: Dict[str, Any] = {"objects": int(n), "max_clicks": int(k)}
  for t in thresholds:
    reached = scores >= t
    first = object_noc(scores, t)
    name = threshold_name(t)
    out[noc_key(t)] = float(first.mean()) if n else None
    out[f">={k}@{name}"] = int((first >= k).sum())
    out[f"never_reached@{name}"] = float(1 - reached.any(axis=1).mean()) if n else None
  out["mean_iou_by_clicks"] = (
    {str(c): float(scores[:, c - 1].mean()) for c in IOU_AT if c <= k} if n else {}
  )
  out["mean_iou_curve"] = scores.mean(axis=0).round(6).tolist() if n else []
  return out


def eval_objects(prep: PrepOutput, max_objects: int = 0):
  """One record per eval object (its lowest variant), in (image id, object id) order.

  Returns:
    (images uint8 [N, H, W, 3], labels uint8 [N, H, W], names ["image_id/object_id"]).

  Raises:
    FileNotFoundError: the eval split holds no record.
  """
  best = {}
  for rec in prep.read_numpy(
    keys.EVAL_SPLIT, [keys.IMAGE_ID, keys.OBJECT_ID, keys.VARIANT, keys.IMAGE, keys.MASK]
  ):
    key = (str(rec[keys.IMAGE_ID]), int(np.ravel(rec[keys.OBJECT_ID])[0]))
    variant = int(np.ravel(rec.get(keys.VARIANT, 0))[0])
    if key not in best or variant < best[key][0]:
      best[key] = (variant, rec[keys.IMAGE], rec[keys.MASK][..., 0])
  if not best:
    raise FileNotFoundError(
      f"{prep.no_records(keys.EVAL_SPLIT)}; NoC needs an eval split (beam-prep --eval-percent)"
    )
  chosen = sorted(best)
  if max_objects:
    chosen = chosen[:max_objects]
  return (
    np.stack([best[k][1] for k in chosen]),
    np.stack([best[k][2] for k in chosen]),
    [f"{i}/{o}" for i, o in chosen],
  )


def evaluate(
  model,
  prep: PrepOutput,
  out_dir: str,
  max_clicks: int = protocol.NOC_MAX_CLICKS,
  thresholds: Sequence[float] = protocol.NOC_IOU_THRESHOLDS,
  batch_size: int = 16,
  max_objects: int = 0,
  sheet_objects: int = 4,
  summary_dir: Optional[str] = None,
  step: int = 0,
  pred_thr: float = clicker.PRED_THR,
  trained_on: Optional[PrepOutput] = None,
) -> Dict[str, Any]:
  """NoC of `model` and of the nearest-click baseline on the eval objects of `prep`.

  The model's inputs are made as for the data it was trained on, `trained_on`
  (default: `prep`): its twins and its tf.Transform. Writes OUT_DIR/noc.json,
  the IoU-by-clicks plot and the contact sheet, and NoC scalars to
  TensorBoard under `summary_dir` (when given).
  """
  trained_on = trained_on or prep
  table = trained_on.table
  images, labels, names = eval_objects(prep, max_objects)
  predictors = {
    "model": ModelPredictor(model, trained_on.tft_output, table),
    "baseline": clicker.baseline_logits,
  }
  report: Dict[str, Any] = {
    "protocol": PROTOCOL,
    "pred_thr": pred_thr,
    "thresholds": list(thresholds),
    "image_size": list(prep.table.image_size),
  }
  curves, traces, sheet = {}, {}, None
  for name, predictor in predictors.items():
    loop = ClickLoop(predictor, prep.table.image_size, max_clicks, pred_thr)
    # The contact sheet shows the model's masks only.
    scores, kept = _run_loop(
      loop, images, labels, batch_size, sheet_objects if name == "model" else 0
    )
    sheet = kept if kept is not None else sheet
    report[name] = summarize(scores, thresholds)
    curves[name] = scores.mean(axis=0)
    traces[name] = dict(loop.traces)
  report["step_traces"] = traces
  report["objects"] = names
  write_report(report, curves, out_dir, summary_dir, step)
  if sheet is not None:
    n = min(sheet_objects, len(images))
    write_sheet(images[:n], labels[:n], names[:n], sheet, os.path.join(out_dir, SHEET_FILE))
  return report


def _run_loop(loop: ClickLoop, images, labels, batch_size: int, sheet_objects: int):
  """The click loop over all objects, in batches.

  Returns:
    (IoU [N, K] after 1..K clicks, and for the first `sheet_objects` objects
    ({clicks: masks}, clicks, kinds), or None when `sheet_objects` is 0).
  """
  scores, kept, click_sets = [], {}, []
  for start in range(0, len(images), batch_size):
    keep = max(0, sheet_objects - start)
    s, clicks, kinds, k = loop.run(
      images[start : start + batch_size], labels[start : start + batch_size], keep=keep
    )
    scores.append(s)
    if keep:
      click_sets.append((clicks[:keep], kinds[:keep]))
      for c, masks in k.items():
        kept.setdefault(c, []).append(masks)
  sheet = None
  if click_sets:
    sheet = (
      {c: np.concatenate(v) for c, v in kept.items()},
      np.concatenate([c for c, _ in click_sets]),
      np.concatenate([k for _, k in click_sets]),
    )
  return np.concatenate(scores), sheet


def write_report(
  report: Dict[str, Any],
  curves: Dict[str, np.ndarray],
  out_dir: str,
  summary_dir: Optional[str],
  step: int,
) -> None:
  """noc.json and the plot in `out_dir`; NoC scalars to TensorBoard under `summary_dir`."""
  tf.io.gfile.makedirs(out_dir)
  with tf.io.gfile.GFile(os.path.join(out_dir, NOC_FILE), "w") as f:
    json.dump(report, f, indent=2)
  write_plot(curves, os.path.join(out_dir, PLOT_FILE))
  if summary_dir:
    writer = tf.summary.create_file_writer(summary_dir)
    with writer.as_default(step=step):
      for name in curves:
        for t in report["thresholds"]:
          tf.summary.scalar(f"{noc_key(t)}/{name}", report[name][noc_key(t)])
    writer.flush()


def brief(report: Dict[str, Any]) -> Dict[str, Any]:
  """The headline numbers of a report, model and baseline (for metrics.json and logs)."""
  out = {"objects": report["baseline"]["objects"], "max_clicks": report["baseline"]["max_clicks"]}
  for name in ("model", "baseline"):
    if name in report:
      out[name] = {
        k: v for k, v in report[name].items() if k.startswith(("noc@", "never_reached@", ">="))
      }
  return out


def lines(brief: Dict[str, Any]) -> List[str]:
  """NoC of the model beside the baseline's, from `brief`: what the commands print."""
  out = []
  b = brief["baseline"]
  for key in sorted(k for k in b if k.startswith("noc@")):
    t = key.split("@")[1]
    over = f">={brief['max_clicks']}@{t}"
    said = {
      name: f"{r[key]:.2f} ({over} {r[over]}, never reached {100 * r['never_reached@' + t]:.0f}%)"
      for name, r in brief.items()
      if name in ("model", "baseline")
    }
    text = (
      f"NoC@{t} {said['model']} vs nearest-click baseline {said['baseline']}"
      if "model" in said
      else f"NoC@{t} of the nearest-click baseline {said['baseline']}"
    )
    out.append(f"{text}, {brief['objects']} objects, up to {brief['max_clicks']} clicks")
  return out


def write_plot(curves: Dict[str, np.ndarray], path: str) -> None:
  """Mean IoU against the number of clicks, one line per predictor."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.ticker  # pylint: disable=g-import-not-at-top,unused-import
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, ax = plt.subplots(figsize=(6, 4))
  for name, curve in curves.items():
    ax.plot(
      np.arange(1, len(curve) + 1),
      curve,
      marker="o",
      markersize=3,
      label="nearest-click baseline (no model)" if name == "baseline" else name,
    )
  ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
  ax.set_xlabel("clicks")
  ax.set_ylabel("mean IoU")
  ax.set_ylim(0, 1)
  ax.grid(alpha=0.3)
  ax.legend(loc="lower right")
  fig.tight_layout()
  with tf.io.gfile.GFile(path, "wb") as f:
    fig.savefig(f, format="png", dpi=100)
  plt.close(fig)


def write_sheet(images, labels, names: List[str], kept, path: str, panel: int = 192) -> None:
  """A few objects: the truth, then the mask and clicks after 1, 3 and 5 clicks."""
  masks, clicks, kinds = kept
  steps = [c for c in SHEET_CLICKS if c in masks]
  h, w = images.shape[1:3]
  scale = max(1, panel // max(h, w))
  ph, pw, top = h * scale, w * scale, 18
  sheet = Image.new("RGB", (pw * (1 + len(steps)), top + ph * len(images)), "white")
  draw = ImageDraw.Draw(sheet)
  for c, title in enumerate(["truth"] + [f"after {s} click{'s' * (s > 1)}" for s in steps]):
    draw.text((c * pw + 4, 3), title, fill="black")
  for r in range(len(images)):
    ignore = labels[r] == keys.IGNORE
    sheet.paste(
      drawing.overlay(images[r], labels[r] == 1, scale=scale, ignore=ignore), (0, top + r * ph)
    )
    for c, n in enumerate(steps, start=1):
      xy, kind = clicks[r][:n], kinds[r][:n]
      im = drawing.overlay(
        images[r],
        masks[n][r],
        xy[kind == clicker.POSITIVE],
        xy[kind == clicker.NEGATIVE],
        scale,
        ignore,
      )
      sheet.paste(im, (c * pw, top + r * ph))
    draw.text((4, top + r * ph + ph - 14), names[r], fill="white")
  with tf.io.gfile.GFile(path, "wb") as f:
    sheet.save(f, format="PNG")
