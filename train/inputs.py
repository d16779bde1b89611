"""The model's input from transformed features: one definition for the
trainer's reader, the serving graph and the NoC evaluation."""

from typing import Dict

import tensorflow as tf

from beam_prep.features import FeatureTable


def model_inputs(table: FeatureTable, transformed: Dict[str, tf.Tensor]) -> tf.Tensor:
  """The model's input: the transformed model inputs, concatenated in declared order."""
  parts = [transformed[e.key] for e in table.model_inputs]
  return parts[0] if len(parts) == 1 else tf.concat(parts, axis=-1)
