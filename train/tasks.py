"""The training side of the built-in tasks (segmentation, classification).

A task is declared once, by its module in `beam_prep.tasks`; its `trainer`
names the class here ("train.tasks:SegmentationTask") that trains it. An
instance is built from the prep output's `features.json` (its `task` field)
and the tf.Transform output. It names the raw features the
transform reads and those evaluation needs, builds the model (input channels
from the declared model inputs), turns transformed features into labels,
gives the per-example loss, and turns eval batches into per-example counts
that `summarize` reduces to metrics.
"""

import importlib
from typing import Any, Dict, List

import numpy as np
import tensorflow as tf
import tensorflow_transform as tft

from beam_prep import keys
from beam_prep import tasks as prep_tasks
from beam_prep.features import FeatureTable
from train import clicker, servers
from train.config import TrainConfig


class SegmentationTask:
  """Mask logits [B, H, W, 1]; weighted sigmoid cross-entropy; IoU (`clicker.iou`)."""
  default_model = "segmentation_fcn"
  transform_in_step = True  # uint8 bytes to the device, transformed there
  server = servers.SegmentationServer  # the serving signatures
  evaluators = ("noc",)  # what `fit` runs at the end besides the eval metrics

  def __init__(self, table: FeatureTable, tft_output: tft.TFTransformOutput):
    del tft_output
    self.name = table.task
    self.table = table
    self.image_size = table.image_size
    self.transform_keys: List[str] = table.keys("model_input") + table.keys("label")
    # The nearest-click baseline needs the clicks (declared by sample_clicks).
    self.eval_keys: List[str] = [k for k in (keys.POSITIVE_CLICKS, keys.NEGATIVE_CLICKS)
                                 if k in table]

  def model_spec(self, config: TrainConfig) -> Dict[str, Any]:
    """The arguments of `models.build_model` for this run."""
    return _model_spec(self, config)

  def check_model(self, model, name: str) -> None:
    """Raises ValueError unless `model` maps the records' inputs to [B, H, W, 1] logits."""
    h, w = self.image_size
    _check_output(model, name, self.table.input_channels, (h, w), (h, w, 1),
                  "mask logits [B, H, W, 1]")

  def labels(self, transformed: Dict[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
    return {keys.LABEL: transformed[keys.LABEL], keys.LABEL_WEIGHT: transformed[keys.LABEL_WEIGHT]}

  def flip_labels(self, labels: Dict[str, tf.Tensor], flip: tf.Tensor) -> Dict[str, tf.Tensor]:
    return {k: tf.where(flip, tf.reverse(v, axis=[2]), v) for k, v in labels.items()}

  def keras_form(self, inputs, labels):
    """(inputs, label, per-pixel sample weight): what Keras `fit` takes."""
    return inputs, labels[keys.LABEL], labels[keys.LABEL_WEIGHT]

  def loss(self, labels: Dict[str, tf.Tensor], logits: tf.Tensor) -> tf.Tensor:
    """Per example, over non-ignored pixels: cross-entropy + soft-IoU loss, [B].

    The soft-IoU (Jaccard) term optimizes the metric itself; cross-entropy
    alone is dominated by the background when objects are small.
    """
    logits = tf.cast(logits, tf.float32)
    y, w = labels[keys.LABEL], labels[keys.LABEL_WEIGHT]
    per_pixel = tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logits)
    bce = tf.reduce_sum(per_pixel * w, axis=[1, 2, 3]) / tf.maximum(
        tf.reduce_sum(w, axis=[1, 2, 3]), 1.0)
    p = tf.sigmoid(logits) * w
    inter = tf.reduce_sum(p * y, axis=[1, 2, 3])
    union = tf.reduce_sum(p + y * w, axis=[1, 2, 3]) - inter
    return bce + 1.0 - (inter + 1.0) / (union + 1.0)

  def counts(self, inputs: tf.Tensor, labels, logits: tf.Tensor) -> tf.Tensor:
    """Per example [B, 4]: the model's IoU, its correct and counted pixels, and
    the IoU of the nearest-click baseline on the records' clicks (0 without clicks)."""
    del inputs
    model = _mask_counts(labels, logits)
    if not self.eval_keys:
      return tf.concat([model, tf.zeros_like(model[:, :1])], axis=1)
    clicks, kinds = clicker.dense_clicks(labels[keys.POSITIVE_CLICKS],
                                         labels[keys.NEGATIVE_CLICKS])
    h, w = self.image_size
    base = _mask_counts(labels, clicker.nearest_click_logits(clicks, kinds, h, w)[..., None])
    return tf.concat([model, base[:, :1]], axis=1)

  def summarize(self, c: np.ndarray) -> Dict[str, Any]:
    out = {"examples": int(c.shape[0]), "mean_iou": float(c[:, 0].mean()),
           "pixel_accuracy": float(c[:, 1].sum() / max(c[:, 2].sum(), 1))}
    if self.eval_keys:
      out["baseline_nearest_click_mean_iou"] = float(c[:, 3].mean())
    return out

  @staticmethod
  def eval_line(ev: Dict[str, Any]) -> str:
    """What `beam-train fit` says of `summarize`'s figures."""
    baseline = ev.get("baseline_nearest_click_mean_iou")
    return (f"{ev['examples']} examples, mean IoU {ev['mean_iou']:.3f}"
            + ("" if baseline is None else f" (nearest-click baseline {baseline:.3f})")
            + f", pixel accuracy {ev['pixel_accuracy']:.3f}")


def _mask_counts(labels, logits) -> tf.Tensor:
  """Per example [B, 3]: IoU, correct pixels, counted pixels (label_weight > 0)."""
  pred = logits > 0
  y, w = labels[keys.LABEL], labels[keys.LABEL_WEIGHT]
  score = clicker.iou(pred, y > 0.5, w > 0)
  correct = tf.reduce_sum(tf.cast(tf.equal(tf.cast(pred, tf.float32), y), tf.float32) * w,
                          axis=[1, 2, 3])
  return tf.stack([score, correct, tf.reduce_sum(w, axis=[1, 2, 3])], axis=1)


class ClassificationTask:
  """Class logits [B, C]; sparse softmax cross-entropy; accuracy."""
  default_model = "cnn_classifier"
  transform_in_step = False  # the vocabulary table runs in tf.data
  server = servers.ClassificationServer
  evaluators = ()

  def __init__(self, table: FeatureTable, tft_output: tft.TFTransformOutput):
    self.name = table.task
    self.table = table
    self.image_size = table.image_size
    self.transform_keys: List[str] = table.keys("model_input") + table.keys("label")
    self.eval_keys: List[str] = []
    self.labels_vocabulary = [v.decode() if isinstance(v, bytes) else v
                              for v in tft_output.vocabulary_by_name(keys.LABEL_VOCABULARY)]

  def model_spec(self, config: TrainConfig) -> Dict[str, Any]:
    """The arguments of `models.build_model` for this run."""
    return dict(_model_spec(self, config), num_classes=len(self.labels_vocabulary))

  def check_model(self, model, name: str) -> None:
    """Raises ValueError unless `model` maps the records' inputs to [B, K] logits."""
    k = len(self.labels_vocabulary)
    _check_output(model, name, self.table.input_channels, self.image_size, (k,),
                  f"class logits [B, {k}] ({k} classes in the vocabulary)")

  def labels(self, transformed: Dict[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
    return {keys.LABEL: transformed[keys.LABEL]}

  def flip_labels(self, labels: Dict[str, tf.Tensor], flip: tf.Tensor) -> Dict[str, tf.Tensor]:
    del flip  # A class does not change with a mirrored image.
    return labels

  def keras_form(self, inputs, labels):
    """(inputs, label): what Keras `fit` takes."""
    return inputs, labels[keys.LABEL]

  def loss(self, labels, logits) -> tf.Tensor:
    return tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels[keys.LABEL], logits=tf.cast(logits, tf.float32))

  def counts(self, inputs, labels, logits) -> tf.Tensor:
    del inputs
    correct = tf.equal(tf.argmax(logits, axis=-1), labels[keys.LABEL])
    return tf.cast(correct, tf.float32)[:, None]

  def summarize(self, c: np.ndarray) -> Dict[str, Any]:
    return {"examples": int(c.shape[0]), "accuracy": float(c[:, 0].mean()),
            "classes": len(self.labels_vocabulary)}

  @staticmethod
  def eval_line(ev: Dict[str, Any]) -> str:
    """What `beam-train fit` says of `summarize`'s figures."""
    return f"{ev['examples']} examples, accuracy {ev['accuracy']:.3f} over {ev['classes']} classes"


def _model_spec(task, config: TrainConfig) -> Dict[str, Any]:
  return {"name": config.model or task.default_model,
          "input_channels": task.table.input_channels,
          "image_size": list(task.image_size),
          "model_args": dict(config.model_args),
          "builtin": {"width": config.width, "depth": config.depth,
                      "backbone_weights": config.backbone_weights}}


def _check_output(model, name: str, channels: int, image_size, want, what: str) -> None:
  """Runs `model` on one zero input of the records' shape and checks its output."""
  h, w = image_size
  try:
    out = model(tf.zeros([1, h, w, channels]), training=False)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f"model {name!r} cannot take the records' input [B, {h}, {w}, {channels}]"
                     f" (features.json's model inputs): {type(e).__name__}: {e}") from None
  if not hasattr(out, "shape"):
    raise ValueError(f"model {name!r} returns {type(out).__name__}, not one tensor")
  got = tuple(out.shape[1:])
  if got != tuple(want):
    raise ValueError(f"model {name!r} maps [1, {h}, {w}, {channels}] to {[1, *got]}; this task "
                     f"needs {what}")


def task_class(name: str):
  """The training side of the task named `name` (features.json's `task`): the
  class its declaration in `beam_prep.tasks` names as `trainer`."""
  task = prep_tasks.get_task(name)
  module, _, attr = task.trainer.partition(":")
  if not (module and attr):
    raise ValueError(f"task {name!r} declares no training side (its `trainer`, "
                     "'module:Class', is empty)")
  return getattr(importlib.import_module(module), attr)


def make_task(table: FeatureTable, tft_output: tft.TFTransformOutput):
  """The task named by features.json, for this run."""
  return task_class(table.task)(table, tft_output)
