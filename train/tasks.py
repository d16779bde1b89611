"""What differs between segmentation and classification training.

A task builds its model, gives the per-example loss, and turns eval batches
into per-example counts that `summarize` reduces to metrics.
"""

from typing import Any, Dict

import numpy as np
import tensorflow as tf
import tensorflow_transform as tft

from beam_prep import keys
from train import models
from train.config import TrainConfig
from train.data import CLASSIFICATION, SEGMENTATION, task_of


class SegmentationTask:
  """Mask logits [B, H, W, 1]; weighted sigmoid cross-entropy; IoU."""
  name = SEGMENTATION
  default_model = "segmentation_fcn"

  def __init__(self, tft_output: tft.TFTransformOutput):
    self.image_size = int(tft_output.transformed_feature_spec()[keys.IMAGE].shape[0])

  def build_model(self, config: TrainConfig):
    return models.build_model(config.model or self.default_model, width=config.width,
                              depth=config.depth)

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
    """Per example: the model's and the click baseline's IoU counts, [B, 6]."""
    model = _mask_counts(labels, logits)
    # Baseline: no model at all; each pixel takes the kind of its nearest
    # click (positive if nearer a positive click than a negative one).
    baseline_logits = inputs[..., 4:5] - inputs[..., 3:4]
    base = _mask_counts(labels, baseline_logits)
    return tf.concat([model, base[:, :2]], axis=1)

  def summarize(self, c: np.ndarray) -> Dict[str, Any]:
    iou = np.where(c[:, 1] > 0, c[:, 0] / np.maximum(c[:, 1], 1), 1.0)
    base = np.where(c[:, 5] > 0, c[:, 4] / np.maximum(c[:, 5], 1), 1.0)
    return {"examples": int(c.shape[0]), "mean_iou": float(iou.mean()),
            "pixel_accuracy": float(c[:, 2].sum() / max(c[:, 3].sum(), 1)),
            "baseline_nearest_click_mean_iou": float(base.mean())}


def _mask_counts(labels, logits) -> tf.Tensor:
  """Per example [B, 4]: intersection, union, correct pixels, counted pixels."""
  pred = tf.cast(logits > 0, tf.float32)
  y, w = labels[keys.LABEL], labels[keys.LABEL_WEIGHT]
  inter = tf.reduce_sum(pred * y * w, axis=[1, 2, 3])
  union = tf.reduce_sum(tf.maximum(pred, y) * w, axis=[1, 2, 3])
  correct = tf.reduce_sum(tf.cast(tf.equal(pred, y), tf.float32) * w, axis=[1, 2, 3])
  return tf.stack([inter, union, correct, tf.reduce_sum(w, axis=[1, 2, 3])], axis=1)


class ClassificationTask:
  """Class logits [B, C]; sparse softmax cross-entropy; accuracy."""
  name = CLASSIFICATION
  default_model = "cnn_classifier"

  def __init__(self, tft_output: tft.TFTransformOutput):
    self.image_size = int(tft_output.transformed_feature_spec()[keys.IMAGE].shape[0])
    self.labels = [v.decode() if isinstance(v, bytes) else v
                   for v in tft_output.vocabulary_by_name(keys.LABEL_VOCABULARY)]

  def build_model(self, config: TrainConfig):
    return models.build_model(config.model or self.default_model,
                              num_classes=len(self.labels), width=config.width,
                              depth=config.depth)

  def loss(self, labels, logits) -> tf.Tensor:
    return tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels[keys.LABEL], logits=tf.cast(logits, tf.float32))

  def counts(self, inputs, labels, logits) -> tf.Tensor:
    correct = tf.equal(tf.argmax(logits, axis=-1), labels[keys.LABEL])
    return tf.cast(correct, tf.float32)[:, None]

  def summarize(self, c: np.ndarray) -> Dict[str, Any]:
    return {"examples": int(c.shape[0]), "accuracy": float(c[:, 0].mean()),
            "classes": len(self.labels)}


def make_task(tft_output: tft.TFTransformOutput):
  if task_of(tft_output) == SEGMENTATION:
    return SegmentationTask(tft_output)
  return ClassificationTask(tft_output)
