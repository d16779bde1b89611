"""NoC at source resolution: `beam-train evaluate --data PREP [--model MODEL]`.

The field's numbers (RITM, SimpleClick, ...) place clicks and compute IoU on
the original image. This evaluation reads a prep output's source records
(`beam_prep.source_records`: each eval image at its own size with its
instance mask) and runs the click protocol (`train.evaluate.clicker`, `train.evaluate.noc`'s
loop) on every annotated object of every image, whatever its size:

- the model is asked through its exported serving graph (image and clicks
  in, probabilities at the image's size out), which carries the
  preprocessing of the data it was trained on, so a model trained on one
  prep output is evaluated on another (a benchmark set);
- the nearest-click baseline (no model) runs the same loop; without a
  model it runs alone, a check of a data set and of the protocol.

Objects of one image are batched while the batch stays under
`PIXELS_PER_BATCH` pixels; every tensor of the loop is [B, H, W] (the
distance transform too), so memory follows the image's pixels.

`noc.json` holds, per object, the image id, object id, source height and
width and its NoC at each threshold, for each predictor; the aggregates
(`train.evaluate.noc.summarize`), the protocol, the threshold and the versions used.
"""

from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from beam_prep import keys, source_records
from beam_prep.ops.image import instance_areas, listed_objects, object_label
from beam_prep.ops.registry import ExampleError
from beam_prep.prep_output import PrepOutput
from beam_prep.version import library_versions
from train.evaluate import clicker, noc, protocol
from train.export.served import ServedModel

PIXELS_PER_BATCH = 8_000_000


class ServedPredictor:
  """An exported segmentation model as a loop predictor (`train.export.served`): its
  `serve_iterative` (image, clicks and the previous mask), or
  `serving_default` for an export without it. With `flip`, each prediction
  is the mean of the image's and its mirror's (clicks and previous mask
  mirrored too), mirrored back."""

  uses_previous_mask = True

  def __init__(self, model: str, flip: bool = False):
    self.model = ServedModel(model)
    self.model.require_segmentation()
    self.path = self.model.path
    self.flip = flip

  def __call__(self, images, clicks, kinds, previous):
    probabilities = (
      flip_averaged(self.model.probabilities) if self.flip else (self.model.probabilities)
    )
    return noc.logits_per_image(probabilities, images, clicks, kinds, previous)

  def extras(self) -> Dict[str, Any]:
    """What the evaluation used besides image and clicks: the previous mask as a
    model input and object crops (zoom-in) when the export's model dir says so
    (its features.json; None: a bare export), and flip averaging."""
    table = _trained_table(self.path)
    inputs = None if table is None else table.keys("model_input")
    return {
      "previous_mask_input": None if table is None else keys.PREV_MASK in inputs,
      "zoom_in": None if table is None else _zooms_in(table),
      "flip_averaging": self.flip,
    }


def _zooms_in(table) -> Optional[bool]:
  """Whether the chain's serving side crops around the object (None: its ops
  cannot be imported here)."""
  from train.export.serving_inputs import ServingPlanError, serving_side  # pylint: disable=g-import-not-at-top

  try:
    return serving_side(table).zooms_in
  except ServingPlanError:
    return None


def flip_averaged(probabilities):
  """`probabilities(image, positive, negative, previous)` -> [H, W], averaged
  with the mirrored image's (x -> W - 1 - x), mirrored back."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  def mirror_clicks(xy, w):
    xy = tf.cast(xy, tf.int64)
    return tf.stack([tf.cast(w, tf.int64) - 1 - xy[:, 0], xy[:, 1]], axis=1)

  def averaged(image, positive, negative, previous):
    w = tf.shape(image)[1]
    mirrored = probabilities(
      tf.reverse(image, [1]),
      mirror_clicks(positive, w),
      mirror_clicks(negative, w),
      tf.reverse(previous, [1]),
    )
    return (probabilities(image, positive, negative, previous) + tf.reverse(mirrored, [1])) / 2

  return averaged


def _trained_table(export_path: str):
  """The FeatureTable of the model dir an export sits in (MODEL/export/<version>), or None."""
  import os  # pylint: disable=g-import-not-at-top
  from beam_prep.features import FEATURES_FILE, FeatureTable  # pylint: disable=g-import-not-at-top

  model_dir = os.path.dirname(os.path.dirname(os.path.abspath(export_path)))
  if not os.path.exists(os.path.join(model_dir, FEATURES_FILE)):
    return None
  return FeatureTable.load(model_dir)


def source_images(prep: PrepOutput) -> Iterator[Dict[str, Any]]:
  """The source records of `prep`, decoded, in file order.

  Raises:
    FileNotFoundError: the output has none (written by an older job, or no
      eval split), saying how to make them.
  """
  files = prep.files(source_records.SPLIT)
  if not files or not prep.has_records(source_records.SPLIT):
    raise FileNotFoundError(
      f"{prep.path} has no source records ({keys.RECORDS_DIR}/{source_records.SPLIT}-*): "
      "they are written for the eval split by beam-prep segmentation (--eval-percent N; "
      "100 for a whole benchmark set)"
    )
  for serialized in prep.dataset(source_records.SPLIT):
    yield source_records.decode(serialized.numpy())


def object_labels(
  instance_mask: np.ndarray, min_area: int = 0
) -> Tuple[List[int], np.ndarray, List[int]]:
  """(object ids, labels uint8 [N, H, W]: 1 the object, 0 background, IGNORE
  kept, and the ids of objects under `min_area` pixels, left out)."""
  areas = instance_areas(instance_mask)
  try:
    present = listed_objects({keys.SOURCE_AREAS: areas})
  except ExampleError:  # Background and ignore pixels only.
    present = []
  small = [i for i in present if areas[i] < min_area]
  ids = [i for i in present if areas[i] >= min_area]
  labels = (
    np.stack([object_label(instance_mask, i) for i in ids])
    if ids
    else np.zeros((0,) + instance_mask.shape, np.uint8)
  )
  return ids, labels, small


def _batches(n: int, pixels: int) -> Iterator[slice]:
  size = max(1, PIXELS_PER_BATCH // max(pixels, 1))
  for start in range(0, n, size):
    yield slice(start, min(start + size, n))


def run(
  prep: PrepOutput,
  predictors: Dict[str, Any],
  max_clicks: int,
  thresholds: Sequence[float],
  pred_thr: float,
  max_objects: int = 0,
  min_area: int = 0,
  skipped: Optional[List[Dict[str, Any]]] = None,
):
  """The loop of each predictor over every object -> (per-object rows, scores
  by predictor); objects under `min_area` pixels are appended to `skipped`."""
  loops = {name: noc.ClickLoop(p, None, max_clicks, pred_thr) for name, p in predictors.items()}
  rows, scores = [], {name: [] for name in predictors}
  for image in source_images(prep):
    ids, labels, small = object_labels(image[keys.INSTANCE_MASK], min_area)
    if skipped is not None:
      skipped += [{"image_id": image[keys.IMAGE_ID], "object_id": i} for i in small]
    if max_objects:
      ids, labels = (
        ids[: max(max_objects - len(rows), 0)],
        labels[: max(max_objects - len(rows), 0)],
      )
    h, w = labels.shape[1:]
    images = np.broadcast_to(image[keys.IMAGE], (len(ids), h, w, 3))
    got = {name: [] for name in predictors}
    for part in _batches(len(ids), h * w):
      for name, loop in loops.items():
        got[name].append(loop.run(np.ascontiguousarray(images[part]), labels[part])[0])
    for name in predictors:
      s = np.concatenate(got[name]) if got[name] else np.zeros((0, max_clicks), np.float32)
      scores[name].append(s)
    nocs = {
      name: {noc.noc_key(t): noc.object_noc(scores[name][-1], t) for t in thresholds}
      for name in predictors
    }
    for i, object_id in enumerate(ids):
      rows.append(
        {
          "image_id": image[keys.IMAGE_ID],
          "object_id": object_id,
          "height": h,
          "width": w,
          **{name: {k: int(v[i]) for k, v in by_t.items()} for name, by_t in nocs.items()},
        }
      )
    if max_objects and len(rows) >= max_objects:
      break
  return rows, {
    name: np.concatenate(v) if v else np.zeros((0, max_clicks)) for name, v in scores.items()
  }


def evaluate(
  prep: PrepOutput,
  out_dir: str,
  model: Optional[str] = None,
  max_clicks: int = protocol.NOC_MAX_CLICKS,
  thresholds: Sequence[float] = protocol.NOC_IOU_THRESHOLDS,
  pred_thr: float = clicker.PRED_THR,
  max_objects: int = 0,
  min_area: int = 0,
  flip: bool = False,
) -> Dict[str, Any]:
  """NoC at source resolution of `model` (an export or a model dir; None: the
  baseline alone) and of the nearest-click baseline; writes OUT_DIR/noc.json
  and the IoU-by-clicks plot. Returns the report.

  Every object is evaluated unless `min_area` (pixels) is given: smaller
  objects are then left out and listed in the report's `skipped_objects`.
  `flip`: the model's predictions are averaged with the mirrored image's;
  the report's `extras` name what the model used besides image and clicks.
  """
  prep.check_complete()
  predictors = {}
  if model:
    served = ServedPredictor(model, flip)
    predictors["model"] = served
  predictors["baseline"] = clicker.baseline_logits
  skipped: List[Dict[str, Any]] = []
  rows, scores = run(
    prep, predictors, max_clicks, thresholds, pred_thr, max_objects, min_area, skipped
  )
  if not rows:
    raise FileNotFoundError(
      f"{prep.path}: its source records hold no object"
      + (f" of --min-area {min_area} pixels or more ({len(skipped)} smaller)" if skipped else "")
    )
  report: Dict[str, Any] = {
    "protocol": noc.PROTOCOL,
    "pred_thr": pred_thr,
    "thresholds": list(thresholds),
    "resolution": "source",
    "data": prep.path,
    "model_path": served.path if model else None,
    "versions": library_versions(),
    "extras": served.extras() if model else {},
    "min_area": min_area,
    "skipped_objects": skipped,
  }
  for name, s in scores.items():
    report[name] = noc.summarize(s, thresholds)
  report["objects"] = rows
  noc.write_report(
    report, {name: s.mean(axis=0) for name, s in scores.items()}, out_dir, summary_dir=None, step=0
  )
  return report
