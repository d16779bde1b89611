"""The training side of interactive segmentation: mask logits, their loss and
IoU, the serving module, NoC at the end of `fit`, and the lines `fit` prints."""

import dataclasses
import os
from typing import Any, Dict, List

import numpy as np
import tensorflow as tf
import tensorflow_transform as tft

from beam_prep import keys
from beam_prep.kit import option
from beam_prep.features import FeatureTable
from train.evaluate import clicker, noc, protocol
from train import logs, model_layout
from train.export import servers
from train.fit import step_inputs
from train.config import TrainConfig
from train.export.serving_inputs import ServingPlanError
from train.tasks import register_trainer
from train.tasks.base import TrainingTask, check_output, fit_options, model_spec


LOSSES = ("bce_iou", "normalized_focal")


@dataclasses.dataclass(frozen=True)
class SegmentationFitOptions:
  """segmentation's own `beam-train fit` settings."""

  noc_clicks: int = option(
    protocol.NOC_MAX_CLICKS,
    "segmentation: NoC evaluation at the end with "
    "up to N simulated clicks per eval object (0: skip it)",
  )
  noc_objects: int = option(0, "segmentation: NoC on the first N eval objects only (0: all)")
  mask_rounds: int = option(
    3,
    "segmentation: each step draws 0 to N rounds in which the "
    "model, without gradients, predicts; its mask becomes the previous "
    "mask (records with beam-prep --previous-mask) and, with "
    "--corrective-clicks, its largest error gets a click (RITM's "
    "iterative training)",
  )
  loss: str = option(
    "bce_iou",
    "segmentation: bce_iou (cross-entropy + soft IoU) or "
    "normalized_focal (RITM's normalized focal loss, alpha 0.5, gamma 2)",
    choices=LOSSES,
  )
  corrective_clicks: bool = option(
    False,
    "segmentation: each round of --mask-rounds adds "
    "a click in the larger error region, and the click "
    "encodings are updated in the step",
  )

  def __post_init__(self):
    if self.noc_clicks < 0:
      raise ValueError(f"--noc-clicks must be >= 0, got {self.noc_clicks}")
    if self.noc_objects < 0:
      raise ValueError(f"--noc-objects must be >= 0, got {self.noc_objects}")
    if self.mask_rounds < 0:
      raise ValueError(f"--mask-rounds must be >= 0, got {self.mask_rounds}")
    if self.loss not in LOSSES:
      raise ValueError(f"--loss must be one of {', '.join(LOSSES)}, got {self.loss!r}")


@register_trainer("segmentation")
class SegmentationTask(TrainingTask):
  """Mask logits [B, H, W, 1]; weighted sigmoid cross-entropy; IoU (`clicker.iou`)."""

  default_model = "segmentation_fcn"
  transform_in_step = True  # uint8 bytes to the device, transformed there
  server = servers.SegmentationServer  # the serving signatures
  evaluators = ("noc",)  # what `fit` runs at the end besides the eval metrics
  options = SegmentationFitOptions

  def __init__(
    self, table: FeatureTable, tft_output: tft.TFTransformOutput, settings: Dict[str, Any] = None
  ):
    self.settings = fit_options(type(self), settings or {})
    self.name = table.task
    self.table = table
    self.image_size = table.image_size
    self.transform_keys: List[str] = table.transform_keys
    # The nearest-click baseline needs the clicks (declared by sample_clicks).
    self.eval_keys: List[str] = [
      k for k in (keys.POSITIVE_CLICKS, keys.NEGATIVE_CLICKS) if k in table
    ]
    self._prev_channel = step_inputs.channel_of(table, keys.PREV_MASK)
    self._click_updates = (
      _corrective_inputs(table, tft_output, self.transform_keys)
      if self.settings.corrective_clicks
      else []
    )

  def model_spec(self, config: TrainConfig) -> Dict[str, Any]:
    """The arguments of `models.build_model` for this run."""
    return model_spec(self, config)

  def check_model(self, model, name: str) -> None:
    """Raises ValueError unless `model` maps the records' inputs to [B, H, W, 1] logits."""
    h, w = self.image_size
    check_output(
      model, name, self.table.input_channels, (h, w), (h, w, 1), "mask logits [B, H, W, 1]"
    )

  def labels(self, transformed: Dict[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
    return {keys.LABEL: transformed[keys.LABEL], keys.LABEL_WEIGHT: transformed[keys.LABEL_WEIGHT]}

  def flip_labels(self, labels: Dict[str, tf.Tensor], flip: tf.Tensor) -> Dict[str, tf.Tensor]:
    return {k: tf.where(flip, tf.reverse(v, axis=[2]), v) for k, v in labels.items()}

  def keras_form(self, inputs, labels):
    """(inputs, label, per-pixel sample weight): what Keras `fit` takes."""
    return inputs, labels[keys.LABEL], labels[keys.LABEL_WEIGHT]

  def loss(self, labels: Dict[str, tf.Tensor], logits: tf.Tensor) -> tf.Tensor:
    """Per example, over non-ignored pixels, [B]: --loss."""
    y, w = labels[keys.LABEL], labels[keys.LABEL_WEIGHT]
    logits = tf.cast(logits, tf.float32)
    if self.settings.loss == "normalized_focal":
      return normalized_focal_loss(y, w, logits)
    return bce_iou_loss(y, w, logits)

  def counts(self, inputs: tf.Tensor, labels, logits: tf.Tensor) -> tf.Tensor:
    """Per example [B, 4]: the model's IoU, its correct and counted pixels, and
    the IoU of the nearest-click baseline on the records' clicks (0 without clicks)."""
    del inputs
    model = _mask_counts(labels, logits)
    if not self.eval_keys:
      return tf.concat([model, tf.zeros_like(model[:, :1])], axis=1)
    clicks, kinds = clicker.dense_clicks(labels[keys.POSITIVE_CLICKS], labels[keys.NEGATIVE_CLICKS])
    h, w = self.image_size
    base = _mask_counts(labels, clicker.nearest_click_logits(clicks, kinds, h, w)[..., None])
    return tf.concat([model, base[:, :1]], axis=1)

  def summarize(self, c: np.ndarray) -> Dict[str, Any]:
    out = {
      "examples": int(c.shape[0]),
      "mean_iou": float(c[:, 0].mean()),
      "pixel_accuracy": float(c[:, 1].sum() / max(c[:, 2].sum(), 1)),
    }
    if self.eval_keys:
      out["baseline_nearest_click_mean_iou"] = float(c[:, 3].mean())
    return out

  def iterate(self, model, inputs, labels):
    """RITM's iterative training: 0 to --mask-rounds rounds (drawn per step) of
    predicting without gradients. Each prediction (thresholded as served)
    becomes the previous mask of the next round when the records have that
    input (they hold zeros: no click yet), and with --corrective-clicks its
    larger error region gets a click (`clicker.training_click`), added to
    the click encodings by their ops' `add_click`."""
    rounds = self.settings.mask_rounds
    if not rounds or (self._prev_channel is None and not self._click_updates):
      return inputs
    threshold = clicker.logit_threshold()
    if self._click_updates:
      truth, care = labels[keys.LABEL][..., 0] > 0.5, labels[keys.LABEL_WEIGHT][..., 0] > 0

    def one_round(i, x):
      pred = tf.cast(model(x, training=False), tf.float32) > threshold
      if self._prev_channel is not None:
        x = step_inputs.put(x, self._prev_channel, 1, tf.cast(pred, x.dtype))
      if self._click_updates:
        x = step_inputs.add_click(
          x, self._click_updates, *clicker.training_click(pred[..., 0], truth, care)
        )
      return i + 1, x

    n = tf.random.uniform([], 0, rounds + 1, dtype=tf.int32)
    _, out = tf.while_loop(
      lambda i, x: i < n, one_round, (tf.constant(0), inputs), maximum_iterations=rounds
    )
    return tf.stop_gradient(out)

  def end_evaluations(self) -> Dict[str, str]:
    return {"noc": "NoC"} if self.settings.noc_clicks else {}

  def evaluate_end(self, model, prep, model_dir: str, log_dir: str, step: int) -> Dict[str, Any]:
    """{"noc": headline numbers} of the NoC evaluation, or {"noc_skipped": why}.

    NoC recomputes the click encodings with the ops' twins; without them (a
    run with --no-export may have an op without one) it is skipped, saying why.
    """
    o = self.settings
    logs.get().info("eval: NoC with up to %d simulated clicks per eval object", o.noc_clicks)
    try:
      report = noc.evaluate(
        model,
        prep,
        os.path.join(model_dir, model_layout.EVAL_DIR),
        o.noc_clicks,
        max_objects=o.noc_objects,
        summary_dir=os.path.join(log_dir, model_layout.TENSORBOARD_DIR, model_layout.EVAL_DIR),
        step=step,
      )
    except ServingPlanError as e:
      why = f"the clicks' model inputs cannot be recomputed ({e})"
      logs.get().info("eval: NoC skipped: %s", why)
      return {"noc_skipped": why}
    return {"noc": noc.brief(report)}

  @staticmethod
  def eval_line(ev: Dict[str, Any]) -> str:
    """What `beam-train fit` says of `summarize`'s figures."""
    baseline = ev.get("baseline_nearest_click_mean_iou")
    return (
      f"{ev['examples']} examples, mean IoU {ev['mean_iou']:.3f}"
      + ("" if baseline is None else f" (nearest-click baseline {baseline:.3f})")
      + f", pixel accuracy {ev['pixel_accuracy']:.3f}"
    )

  @staticmethod
  def summary_lines(metrics: Dict[str, Any], model_dir: str) -> List[str]:
    """The eval line, NoC beside the baseline's, and where the NoC report is."""
    lines = [SegmentationTask.eval_line(metrics["eval"])] if metrics["eval"].get("examples") else []
    if "noc" in metrics:
      lines += noc.lines(metrics["noc"])
      lines.append(f"NoC report, plot and contact sheet -> {os.path.join(model_dir, 'eval')}")
    return lines


def bce_iou_loss(y: tf.Tensor, w: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
  """Cross-entropy + soft-IoU loss per example [B], over the pixels of weight `w`.

  The soft-IoU (Jaccard) term optimizes the metric itself; cross-entropy
  alone is dominated by the background when objects are small.
  """
  per_pixel = tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logits)
  bce = tf.reduce_sum(per_pixel * w, axis=[1, 2, 3]) / tf.maximum(
    tf.reduce_sum(w, axis=[1, 2, 3]), 1.0
  )
  p = tf.sigmoid(logits) * w
  inter = tf.reduce_sum(p * y, axis=[1, 2, 3])
  union = tf.reduce_sum(p + y * w, axis=[1, 2, 3]) - inter
  return bce + 1.0 - (inter + 1.0) / (union + 1.0)


def normalized_focal_loss(
  y: tf.Tensor,
  w: tf.Tensor,
  logits: tf.Tensor,
  alpha: float = 0.5,
  gamma: float = 2.0,
  eps: float = 1e-8,
) -> tf.Tensor:
  """RITM's normalized focal loss per example [B] (`NormalizedFocalLossSigmoid`):
  the focal weights (1 - p_t)^gamma rescaled to sum to the counted pixels (the
  factor without gradient), the sum over pixels divided by their count."""
  p = tf.sigmoid(logits)
  obj, care = y > 0.5, w > 0
  alpha_t = tf.where(obj, alpha, 1.0 - alpha) * w
  pt = tf.where(care, tf.where(obj, p, 1.0 - p), tf.ones_like(p))
  beta = tf.pow(1.0 - pt, gamma)
  counted = tf.reduce_sum(w, axis=[1, 2, 3], keepdims=True)
  beta = beta * tf.stop_gradient(
    counted / (tf.reduce_sum(beta, axis=[1, 2, 3], keepdims=True) + eps)
  )
  loss = -alpha_t * beta * tf.math.log(tf.clip_by_value(pt, eps, 1.0)) * w
  return tf.reduce_sum(loss, axis=[1, 2, 3]) / (counted[:, 0, 0, 0] + eps)


def _corrective_inputs(
  table: FeatureTable, tft_output: tft.TFTransformOutput, transform_keys: List[str]
) -> List[step_inputs.ClickInput]:
  """The model inputs made from the clicks, for corrective clicks in the step,
  updated exactly (`step_inputs.exact`).

  Raises:
    ValueError: one has no `add_click`, or is standardized (its update is
      exact only through a fixed scale), or its transform is not that scale.
  """
  inputs = step_inputs.click_inputs(table)
  for c in inputs:
    if c.add is None or c.scale is None:
      raise ValueError(
        f"--corrective-clicks: model input {c.key!r} is made from the clicks "
        f"by op {c.op!r}, which "
        + ("declares no add_click" if c.add is None else "is standardized")
      )
  try:
    return step_inputs.exact(inputs, tft_output.transform_features_layer(), table, transform_keys)
  except ValueError as e:
    raise ValueError(f"--corrective-clicks: {e}") from None


def _mask_counts(labels, logits) -> tf.Tensor:
  """Per example [B, 3]: IoU, correct pixels, counted pixels (label_weight > 0)."""
  pred = logits > 0
  y, w = labels[keys.LABEL], labels[keys.LABEL_WEIGHT]
  score = clicker.iou(pred, y > 0.5, w > 0)
  correct = tf.reduce_sum(
    tf.cast(tf.equal(tf.cast(pred, tf.float32), y), tf.float32) * w, axis=[1, 2, 3]
  )
  return tf.stack([score, correct, tf.reduce_sum(w, axis=[1, 2, 3])], axis=1)
