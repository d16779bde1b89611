"""The simulated user and the no-model baseline, in the graph.

Click protocol (RITM's clicker; `train.noc` runs it in a loop):

1. The first click is positive, at the object's pixel farthest from its
   boundary (the image border counts as boundary).
2. After each prediction, the errors are split into false negatives (object
   pixels predicted background) and false positives; ignore pixels are never
   errors. Each error mask gets its exact Euclidean distance transform (to
   the nearest non-error pixel, the image border included) with pixels
   already clicked set to 0. The next click goes to the pixel farthest from
   its error boundary: positive when the false negatives hold the largest
   distance, negative otherwise (row-major first pixel on ties). With no
   error left, no click is added.

Clicks, batched over objects:
  clicks  int64 [B, K, 2], (x, y) = (column, row)
  kinds   int32 [B, K]: POSITIVE (1), NEGATIVE (-1), NONE (0: unused slot)
Labels: uint8 [B, H, W], 1 object, 0 background, keys.IGNORE ignore.

The nearest-click baseline (`nearest_click_logits`): a pixel is object when
it is nearer a positive than a negative click; no model. The trainer's eval
reads it from the records' clicks (`dense_clicks`), the NoC loop from its own.

`iou` is the one IoU of the trainer's eval and the NoC evaluation.

This module imports nothing of `train`.
"""

import numpy as np
import tensorflow as tf

from beam_prep import keys

NONE, POSITIVE, NEGATIVE = 0, 1, -1


def iou(pred: tf.Tensor, truth: tf.Tensor, care: tf.Tensor) -> tf.Tensor:
  """float32 [B]: IoU of bool masks [B, ...] over the pixels `care` marks (1 if both empty)."""
  axes = tf.range(1, tf.rank(pred))
  inter = tf.reduce_sum(tf.cast(pred & truth & care, tf.float32), axis=axes)
  union = tf.reduce_sum(tf.cast((pred | truth) & care, tf.float32), axis=axes)
  return tf.where(union > 0, inter / tf.maximum(union, 1.0), 1.0)


def label_iou(pred: tf.Tensor, label: tf.Tensor) -> tf.Tensor:
  """float32 [B]: `iou` of bool masks [B, H, W] with a uint8 label (1 object, IGNORE ignored)."""
  return iou(pred, tf.equal(label, 1), tf.not_equal(label, keys.IGNORE))


def edt_squared(mask: tf.Tensor) -> tf.Tensor:
  """Exact squared Euclidean distance transform, int32 [B, H, W].

  For each True pixel of bool `mask` [B, H, W], the squared distance to the
  nearest False pixel, the outside of the image counting as False (scipy's
  `distance_transform_edt` of the mask padded by one False pixel); 0 on False
  pixels. Two exact passes: per row, the distance to the nearest False pixel
  of the row; then per column, the minimum of dy^2 + that^2 over rows.
  """
  shape = tf.shape(mask)
  h, w = shape[1], shape[2]
  big = tf.constant(1 << 20, tf.int32)
  cols = tf.range(w, dtype=tf.int32)
  rows = tf.range(h, dtype=tf.int32)
  dx = tf.abs(cols[:, None] - cols[None, :])  # [W (x), W (x')]
  g = tf.reduce_min(tf.where(tf.logical_not(mask)[:, :, None, :], dx[None, None], big), axis=-1)
  g = tf.minimum(g, tf.minimum(cols + 1, w - cols)[None, None, :])  # the border columns
  dy2 = tf.square(rows[:, None] - rows[None, :])  # [H (y), H (y')]
  e = tf.reduce_min(dy2[None, :, :, None] + tf.square(g)[:, None, :, :], axis=2)
  e = tf.minimum(e, tf.square(tf.minimum(rows + 1, h - rows))[None, :, None])  # border rows
  return tf.where(mask, e, 0)


def clicked_map(clicks: tf.Tensor, kinds: tf.Tensor, h: int, w: int) -> tf.Tensor:
  """bool [B, H, W]: the pixels clicked so far. clicks int [B, K, 2] (x, y)."""
  ys = tf.range(h, dtype=clicks.dtype)[None, None, :, None]
  xs = tf.range(w, dtype=clicks.dtype)[None, None, None, :]
  hit = ((ys == clicks[:, :, 1, None, None]) & (xs == clicks[:, :, 0, None, None])
         & (kinds != NONE)[:, :, None, None])
  return tf.reduce_any(hit, axis=1)


def next_click(pred: tf.Tensor, label: tf.Tensor, clicked: tf.Tensor):
  """The protocol's next click (module docstring, step 2).

  Args:
    pred: bool [B, H, W], the current mask.
    label: uint8 [B, H, W]: 1 object, 0 background, 255 ignore.
    clicked: bool [B, H, W], pixels already clicked.

  Returns:
    (xy int64 [B, 2] as (x, y), kind int32 [B]: 1 positive, -1 negative,
    0 when there is no error left).
  """
  gt = tf.equal(label, 1)
  care = tf.not_equal(label, keys.IGNORE)
  fn = gt & tf.logical_not(pred) & care
  fp = tf.logical_not(gt) & pred & care
  fn_d = tf.where(clicked, 0, edt_squared(fn))
  fp_d = tf.where(clicked, 0, edt_squared(fp))
  fn_max = tf.reduce_max(fn_d, axis=[1, 2])
  fp_max = tf.reduce_max(fp_d, axis=[1, 2])
  positive = fn_max > fp_max
  d = tf.where(positive[:, None, None], fn_d, fp_d)
  w = tf.shape(d)[2]
  flat = tf.argmax(tf.reshape(d, [tf.shape(d)[0], -1]), axis=1, output_type=tf.int32)
  xy = tf.cast(tf.stack([flat % w, flat // w], axis=1), tf.int64)
  kind = tf.where(tf.maximum(fn_max, fp_max) > 0,
                  tf.where(positive, POSITIVE, NEGATIVE), NONE)
  return xy, tf.cast(kind, tf.int32)


def nearest_click_logits(clicks, kinds, h, w):
  """The no-model baseline: 1.0 where the nearest click (exact Euclidean
  distance) is positive, else -1.0 (ties and no positive click: background).

  Args:
    clicks: int64 [B, K, 2] of (x, y); kinds: int32 [B, K], 1 positive,
      -1 negative, 0 unused.

  Returns:
    float32 [B, H, W].
  """
  ys = tf.range(h, dtype=tf.int64)[None, None, :, None]
  xs = tf.range(w, dtype=tf.int64)[None, None, None, :]
  d2 = (tf.square(ys - clicks[:, :, 1, None, None])
        + tf.square(xs - clicks[:, :, 0, None, None]))  # [B, K, H, W]
  far = tf.constant(np.iinfo(np.int64).max, tf.int64)
  pos = tf.reduce_min(tf.where((kinds == POSITIVE)[:, :, None, None], d2, far), axis=1)
  neg = tf.reduce_min(tf.where((kinds == NEGATIVE)[:, :, None, None], d2, far), axis=1)
  return tf.where(pos < neg, 1.0, -1.0)


def baseline_logits(images, clicks, kinds):
  """The nearest-click baseline as a NoC predictor: (images [B, H, W, 3], clicks,
  kinds) -> logits [B, H, W]."""
  shape = tf.shape(images)
  return nearest_click_logits(clicks, kinds, shape[1], shape[2])


def dense_clicks(positive: tf.SparseTensor, negative: tf.SparseTensor):
  """The records' clicks, [B, 2N] sparse (x, y) pairs of each kind, as
  (clicks int64 [B, K, 2], kinds int32 [B, K]): positives first, then negatives."""

  def dense(clicks: tf.SparseTensor, kind: int):
    flat = tf.RaggedTensor.from_sparse(clicks)
    lengths = flat.row_lengths() // 2
    xy = tf.RaggedTensor.from_row_lengths(tf.reshape(flat.values, [-1, 2]), lengths)
    xy = xy.to_tensor(shape=[None, None, 2])
    return xy, tf.where(tf.sequence_mask(lengths, tf.shape(xy, tf.int64)[1]), kind, NONE)

  pos, pos_kind = dense(positive, POSITIVE)
  neg, neg_kind = dense(negative, NEGATIVE)
  clicks = tf.concat([tf.cast(pos, tf.int64), tf.cast(neg, tf.int64)], axis=1)
  kinds = tf.cast(tf.concat([pos_kind, neg_kind], axis=1), tf.int32)
  return clicks, kinds
