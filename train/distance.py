"""TensorFlow twin of `beam_prep.ops.distance`: distance maps in the graph.

Same arithmetic as the Beam op (integer squared distances capped at 256^2, one
float32 square root, round half to even, cap 255), so the serving model builds
the very maps the records hold. A brute-force minimum over the clicks: exact,
XLA-friendly, and cheap for the handful of clicks a person gives.
"""

import tensorflow as tf

MAX_DISTANCE = 255


def distance_map(clicks_xy: tf.Tensor, height, width) -> tf.Tensor:
  """uint8 [height, width]: distance to the nearest click, capped at 255.

  Args:
    clicks_xy: int [N, 2] of (x, y) = (column, row), inside the image; N may
      be 0 (all 255).
    height: map height (scalar).
    width: map width (scalar).
  """
  clicks = tf.cast(tf.reshape(clicks_xy, [-1, 2]), tf.int32)
  limit = (MAX_DISTANCE + 1) ** 2
  rows = tf.range(height, dtype=tf.int32)
  cols = tf.range(width, dtype=tf.int32)
  dy2 = tf.minimum(tf.square(rows[None, :] - clicks[:, 1:2]), limit)  # [N, H]
  dx2 = tf.minimum(tf.square(cols[None, :] - clicks[:, 0:1]), limit)  # [N, W]
  d2 = tf.reduce_min(dy2[:, :, None] + dx2[:, None, :], axis=0)  # [H, W]; empty: int max
  d2 = tf.minimum(d2, limit)
  dist = tf.round(tf.sqrt(tf.cast(d2, tf.float32)))
  return tf.cast(tf.minimum(dist, MAX_DISTANCE), tf.uint8)


def distance_maps(positive_xy: tf.Tensor, negative_xy: tf.Tensor, height, width) -> tf.Tensor:
  """uint8 [height, width, 2]: channel 0 positive, channel 1 negative."""
  return tf.stack([distance_map(positive_xy, height, width),
                   distance_map(negative_xy, height, width)], axis=-1)
