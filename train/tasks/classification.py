"""The training side of image classification: class logits, cross-entropy,
accuracy, and the serving module of encoded images."""

from typing import Any, Dict, List

import numpy as np
import tensorflow as tf
import tensorflow_transform as tft

from beam_prep import keys
from beam_prep.features import FeatureTable
from train.export import servers
from train.config import TrainConfig
from train.tasks import register_trainer
from train.tasks.base import TrainingTask, check_output, model_spec


@register_trainer("classification")
class ClassificationTask(TrainingTask):
  """Class logits [B, C]; sparse softmax cross-entropy; accuracy."""

  default_model = "cnn_classifier"
  transform_in_step = False  # the vocabulary table runs in tf.data
  server = servers.ClassificationServer
  evaluators = ()

  def __init__(
    self, table: FeatureTable, tft_output: tft.TFTransformOutput, settings: Dict[str, Any] = None
  ):
    del settings  # No fit option of its own.
    self.name = table.task
    self.table = table
    self.image_size = table.image_size
    self.transform_keys: List[str] = table.transform_keys
    self.eval_keys: List[str] = []
    self.labels_vocabulary = [
      v.decode() if isinstance(v, bytes) else v
      for v in tft_output.vocabulary_by_name(keys.LABEL_VOCABULARY)
    ]

  def model_spec(self, config: TrainConfig) -> Dict[str, Any]:
    """The arguments of `models.build_model` for this run."""
    return dict(model_spec(self, config), num_classes=len(self.labels_vocabulary))

  def check_model(self, model, name: str) -> None:
    """Raises ValueError unless `model` maps the records' inputs to [B, K] logits."""
    k = len(self.labels_vocabulary)
    check_output(
      model,
      name,
      self.table.input_channels,
      self.image_size,
      (k,),
      f"class logits [B, {k}] ({k} classes in the vocabulary)",
    )

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
      labels=labels[keys.LABEL], logits=tf.cast(logits, tf.float32)
    )

  def counts(self, inputs, labels, logits) -> tf.Tensor:
    del inputs
    correct = tf.equal(tf.argmax(logits, axis=-1), labels[keys.LABEL])
    return tf.cast(correct, tf.float32)[:, None]

  def summarize(self, c: np.ndarray) -> Dict[str, Any]:
    return {
      "examples": int(c.shape[0]),
      "accuracy": float(c[:, 0].mean()),
      "classes": len(self.labels_vocabulary),
    }

  @staticmethod
  def eval_line(ev: Dict[str, Any]) -> str:
    """What `beam-train fit` says of `summarize`'s figures."""
    return f"{ev['examples']} examples, accuracy {ev['accuracy']:.3f} over {ev['classes']} classes"

  @staticmethod
  def summary_lines(metrics: Dict[str, Any], model_dir: str) -> List[str]:
    del model_dir
    ev = metrics["eval"]
    return [ClassificationTask.eval_line(ev)] if ev.get("examples") else []
