"""The previous mask as a model input (mask guidance, RITM: Sofiiuk et al. 2021).

`prev_mask` declares the model's view of the previous prediction: uint8
[H, W, 1] in the records' frame, 1 where the last prediction was object.
Before the first click there is none, so the records hold zeros (a few
bytes once compressed). The trainer fills it in its step with the model's own
prediction (`train.tasks.segmentation`, `--mask-rounds`); at serving the twin
takes the request's `previous_mask`, which the geometric op's twin has
already put into the records' frame (crop or resize); without one, zeros.
"""

import numpy as np

from beam_prep import keys
from beam_prep.features import Feature
from beam_prep.ops.registry import register_op

PREV_MASK = Feature("uint8", channels=1, role="model_input", encoding="zlib")


def prev_mask_twin(ex):
  """`prev_mask` in TensorFlow: the request's previous mask in the records'
  frame (bool or uint8 [H, W]), else zeros."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  shape = tf.shape(ex[keys.IMAGE])
  previous = ex.get(keys.PREVIOUS_MASK)
  if previous is None:
    mask = tf.zeros(tf.stack([shape[0], shape[1], 1]), tf.uint8)
  else:
    mask = tf.expand_dims(tf.cast(tf.cast(previous, tf.bool), tf.uint8), -1)
  return dict(ex, **{keys.PREV_MASK: mask})


@register_op(
  "prev_mask", reads=(keys.IMAGE,), produces={keys.PREV_MASK: PREV_MASK}, twin=prev_mask_twin
)
def prev_mask():
  """Adds `prev_mask`: no previous prediction yet, zeros [H, W, 1]."""

  def fn(ex):
    h, w = ex[keys.IMAGE].shape[:2]
    return dict(ex, **{keys.PREV_MASK: np.zeros((h, w, 1), np.uint8)})

  return fn
