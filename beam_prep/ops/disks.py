"""Click disks: the click encoding of Sofiiuk et al. 2021 ("Reviving Iterative
Training with Mask Guidance for Interactive Segmentation", RITM).

For each click kind (positive, negative) a binary map holds 1 on every pixel
within `radius` of a click of that kind (squared distance <= radius^2), 0
elsewhere. Stored as uint8 [H, W, 2], channel 0 positive, channel 1 negative;
the model sees it unscaled (0 or 1). Integer arithmetic only, so the
TensorFlow twin gives the very same bytes.
"""

import numpy as np

from beam_prep import keys
from beam_prep.features import Feature
from beam_prep.ops.registry import combine_click, register_op

# RITM's disk radius in pixels: the op's, its twin's and its add_click's default.
DEFAULT_RADIUS = 5


def disk_map(clicks_xy: np.ndarray, height: int, width: int, radius: float) -> np.ndarray:
  """uint8 [height, width]: 1 within `radius` of any click, else 0."""
  clicks_xy = np.asarray(clicks_xy, dtype=np.int64).reshape(-1, 2)
  r2 = int(np.floor(radius * radius))
  out = np.zeros((height, width), np.bool_)
  rows = np.arange(height, dtype=np.int64)
  cols = np.arange(width, dtype=np.int64)
  for x, y in clicks_xy.tolist():
    out |= ((rows - y) ** 2)[:, None] + ((cols - x) ** 2)[None, :] <= r2
  return out.astype(np.uint8)


def tf_disk_map(clicks_xy, height, width, radius: float):
  """`disk_map` in TensorFlow: the same values."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  clicks = tf.cast(tf.reshape(clicks_xy, [-1, 2]), tf.int64)
  r2 = int(np.floor(radius * radius))
  rows = tf.range(tf.cast(height, tf.int64))
  cols = tf.range(tf.cast(width, tf.int64))
  dy2 = tf.square(rows[None, :] - clicks[:, 1:2])  # [N, H]
  dx2 = tf.square(cols[None, :] - clicks[:, 0:1])  # [N, W]
  inside = tf.reduce_any(dy2[:, :, None] + dx2[:, None, :] <= r2, axis=0)
  return tf.cast(inside, tf.uint8)


def click_disks_twin(ex, radius: float = DEFAULT_RADIUS):
  """`click_disks` in TensorFlow, on one example's tensors."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  shape = tf.shape(ex[keys.IMAGE])
  h, w = shape[0], shape[1]
  out = dict(ex)
  out[keys.CLICK_DISKS] = tf.stack(
    [
      tf_disk_map(ex[keys.POSITIVE_CLICKS], h, w, radius),
      tf_disk_map(ex[keys.NEGATIVE_CLICKS], h, w, radius),
    ],
    axis=-1,
  )
  return out


def click_disks_add_click(value, click_xy, positive, radius: float = DEFAULT_RADIUS):
  """One more click in disks [B, H, W, 2] (float32 0/1): its kind's channel
  is OR-ed (the maximum) with the click's disk."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  return combine_click(
    value, click_xy, positive, lambda xy, h, w: tf_disk_map(xy, h, w, radius), tf.maximum
  )


@register_op(
  "click_disks",
  reads=(keys.IMAGE, keys.POSITIVE_CLICKS, keys.NEGATIVE_CLICKS),
  produces={keys.CLICK_DISKS: Feature("uint8", channels=2, role="model_input", encoding="zlib")},
  twin=click_disks_twin,
  add_click=click_disks_add_click,
)
def click_disks(radius: float = DEFAULT_RADIUS):
  """Adds `click_disks`: binary disks of `radius` pixels around each click."""
  if not radius > 0:
    raise ValueError(f"radius must be positive, got {radius}")

  def fn(ex):
    h, w = ex[keys.IMAGE].shape[:2]
    out = dict(ex)
    out[keys.CLICK_DISKS] = np.stack(
      [
        disk_map(ex[keys.POSITIVE_CLICKS], h, w, radius),
        disk_map(ex[keys.NEGATIVE_CLICKS], h, w, radius),
      ],
      axis=-1,
    )
    return out

  return fn
