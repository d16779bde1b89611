"""Distance maps from clicks (Xu et al., "Deep Interactive Object Selection").

For each click kind (positive, negative) a map holds, per pixel, the Euclidean
distance to the nearest click of that kind, rounded half to even and capped at
`keys.MAX_DISTANCE` (255); an empty click set gives 255 everywhere. Stored as
uint8 [H, W, 2], channel 0 positive, channel 1 negative.

The computation is a brute-force minimum over the few clicks of a sample, in
integer arithmetic until one final float32 square root: exact (it equals
`scipy.ndimage.distance_transform_edt` of the click image, rounded) and much
cheaper than a full distance transform when there are a handful of clicks. The
TensorFlow twin (`distance_maps_twin`, used by the serving graph) does the same
arithmetic and is tested equal to it.
"""

import numpy as np

from beam_prep import keys
from beam_prep.features import Feature
from beam_prep.ops.registry import combine_click, register_op


def distance_map(
  clicks_xy: np.ndarray, height: int, width: int, cap: int = keys.MAX_DISTANCE
) -> np.ndarray:
  """Distance from each pixel to the nearest click, as uint8 capped at `cap`.

  Args:
    clicks_xy: int array [N, 2] of (x, y) = (column, row) pixel coordinates,
      all inside the image.
    height: map height.
    width: map width.
    cap: largest stored distance.

  Returns:
    uint8 [height, width].
  """
  clicks_xy = np.asarray(clicks_xy, dtype=np.int64).reshape(-1, 2)
  if clicks_xy.shape[0] == 0:
    return np.full((height, width), cap, np.uint8)
  rows = np.arange(height, dtype=np.int32)
  cols = np.arange(width, dtype=np.int32)
  # Squared distances capped at (cap + 1)^2: enough to decide the cap and
  # keeps int32 safe for any image size.
  limit = np.int32((cap + 1) ** 2)
  best = np.full((height, width), limit, np.int32)
  for x, y in clicks_xy.tolist():
    dy2 = np.minimum((rows - y) ** 2, limit)
    dx2 = np.minimum((cols - x) ** 2, limit)
    np.minimum(best, dy2[:, None] + dx2[None, :], out=best)
  dist = np.rint(np.sqrt(best.astype(np.float32)))
  return np.minimum(dist, cap).astype(np.uint8)


def distance_maps(
  positive_xy: np.ndarray, negative_xy: np.ndarray, height: int, width: int
) -> np.ndarray:
  """Both maps stacked: uint8 [height, width, 2] (positive, negative)."""
  return np.stack(
    [distance_map(positive_xy, height, width), distance_map(negative_xy, height, width)], axis=-1
  )


def tf_distance_map(clicks_xy, height, width, cap: int = keys.MAX_DISTANCE):
  """`distance_map` in TensorFlow: uint8 [height, width], the same values.

  Args:
    clicks_xy: int [N, 2] of (x, y), inside the image; N may be 0 (all `cap`).
    height: map height (scalar).
    width: map width (scalar).
    cap: largest stored distance.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  clicks = tf.cast(tf.reshape(clicks_xy, [-1, 2]), tf.int32)
  limit = (cap + 1) ** 2
  rows = tf.range(height, dtype=tf.int32)
  cols = tf.range(width, dtype=tf.int32)
  dy2 = tf.minimum(tf.square(rows[None, :] - clicks[:, 1:2]), limit)  # [N, H]
  dx2 = tf.minimum(tf.square(cols[None, :] - clicks[:, 0:1]), limit)  # [N, W]
  d2 = tf.reduce_min(dy2[:, :, None] + dx2[:, None, :], axis=0)  # [H, W]; empty: int max
  d2 = tf.minimum(d2, limit)
  dist = tf.round(tf.sqrt(tf.cast(d2, tf.float32)))
  return tf.cast(tf.minimum(dist, cap), tf.uint8)


def distance_maps_twin(ex):
  """`distance_maps` in TensorFlow, on one example's tensors."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  shape = tf.shape(ex[keys.IMAGE])
  h, w = shape[0], shape[1]
  out = dict(ex)
  out[keys.DISTANCE_MAPS] = tf.stack(
    [
      tf_distance_map(ex[keys.POSITIVE_CLICKS], h, w),
      tf_distance_map(ex[keys.NEGATIVE_CLICKS], h, w),
    ],
    axis=-1,
  )
  return out


def distance_maps_add_click(value, click_xy, positive, cap: int = keys.MAX_DISTANCE):
  """One more click in distance maps [B, H, W, 2] (float32 of the stored
  values): its kind's channel becomes the minimum with the click's own
  distance map, which is what the maps of all clicks are (the rounding and
  the cap are monotone, so they commute with the minimum)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  return combine_click(
    value, click_xy, positive, lambda xy, h, w: tf_distance_map(xy, h, w, cap), tf.minimum
  )


@register_op(
  "distance_maps",
  reads=(keys.IMAGE, keys.POSITIVE_CLICKS, keys.NEGATIVE_CLICKS),
  produces={
    keys.DISTANCE_MAPS: Feature(
      "uint8", channels=2, role="model_input", normalize=keys.MAX_DISTANCE, encoding="zlib"
    )
  },
  twin=distance_maps_twin,
  add_click=distance_maps_add_click,
)
def distance_maps_op():
  """Adds `distance_maps` (Xu et al. 2016) from `positive_clicks` and `negative_clicks`."""

  def fn(ex):
    h, w = ex[keys.IMAGE].shape[:2]
    out = dict(ex)
    out[keys.DISTANCE_MAPS] = distance_maps(
      ex[keys.POSITIVE_CLICKS], ex[keys.NEGATIVE_CLICKS], h, w
    )
    return out

  return fn
