"""The simulated user and the no-model baseline, in the graph.

Click protocol (RITM's clicker; `train.evaluate.noc` runs it in a loop):

1. The first click is positive, at the object's pixel farthest from its
   boundary (the image border counts as boundary).
2. After each prediction, the errors are split into false negatives (object
   pixels predicted background) and false positives; ignore pixels are never
   errors. Each error mask gets its exact Euclidean distance transform (to
   the nearest non-error pixel, the image border included) with pixels
   already clicked set to 0. The next click goes to the pixel farthest from
   its error boundary: positive when the false negatives hold the largest
   distance, negative otherwise (row-major first pixel on ties). With no
   error left, the click is negative at (0, 0), as RITM's clicker gives it.
3. The mask is the served probability (the model's, refined by
   `train.export.guided_filter` at source resolution) above `PRED_THR` (0.49,
   RITM's evaluation threshold); IoU is over non-ignore pixels, and an empty union
   (nothing to find, nothing predicted) never reaches a threshold (RITM's
   0/0 is NaN).

Clicks, batched over objects:
  clicks  int64 [B, K, 2], (x, y) = (column, row)
  kinds   int32 [B, K]: POSITIVE (1), NEGATIVE (-1), NONE (0: unused slot)
Labels: uint8 [B, H, W], 1 object, 0 background, keys.IGNORE ignore.

The nearest-click baseline (`nearest_click_logits`): a pixel is object when
it is nearer a positive than a negative click; no model. The trainer's eval
reads it from the records' clicks (`dense_clicks`), the NoC loop from its own.

`iou` is the one IoU of the trainer's eval, the NoC evaluation and the page.

This module imports nothing of `train`.
"""

import numpy as np
import tensorflow as tf

from beam_prep import keys
from train.evaluate import protocol

NONE, POSITIVE, NEGATIVE = 0, 1, -1
PRED_THR = protocol.PRED_THR


def logit_threshold(pred_thr: float = PRED_THR) -> float:
  """The logit above which the probability exceeds `pred_thr`."""
  if not 0.0 < pred_thr < 1.0:
    raise ValueError(f"--pred-thr must be in (0, 1), got {pred_thr}")
  return float(np.log(pred_thr / (1.0 - pred_thr)))


def iou(pred: tf.Tensor, truth: tf.Tensor, care: tf.Tensor) -> tf.Tensor:
  """float32 [B]: IoU of bool masks [B, ...] over the pixels `care` marks; 0
  when both are empty there (RITM's NaN: it never reaches a threshold)."""
  axes = tf.range(1, tf.rank(pred))
  inter = tf.reduce_sum(tf.cast(pred & truth & care, tf.float32), axis=axes)
  union = tf.reduce_sum(tf.cast((pred | truth) & care, tf.float32), axis=axes)
  return inter / tf.maximum(union, 1.0)


def label_iou(pred: tf.Tensor, label: tf.Tensor) -> tf.Tensor:
  """float32 [B]: `iou` of bool masks [B, H, W] with a uint8 label (1 object, IGNORE ignored)."""
  return iou(pred, tf.equal(label, 1), tf.not_equal(label, keys.IGNORE))


def edt_squared(mask: tf.Tensor) -> tf.Tensor:
  """Exact squared Euclidean distance transform, int32 [B, H, W].

  For each True pixel of bool `mask` [B, H, W], the squared distance to the
  nearest False pixel, the outside of the image counting as False (scipy's
  `distance_transform_edt` of the mask padded by one False pixel); 0 on False
  pixels. Memory is linear in the pixels either way: on a GPU it runs in the
  graph (`edt_squared_graph`), on the CPU scipy's (faster there) runs on the
  host. Chosen when traced.
  """
  if tf.config.list_logical_devices("GPU"):
    return edt_squared_graph(mask)
  out = tf.numpy_function(_edt_squared_scipy, [mask], tf.int32, stateful=False)
  return tf.ensure_shape(out, mask.shape)


def _edt_squared_scipy(mask: np.ndarray) -> np.ndarray:
  from beam_prep.ops.clicks import edt_outside_padded  # pylint: disable=g-import-not-at-top

  out = np.zeros(mask.shape, np.int32)
  for i, m in enumerate(mask):
    if m.any():
      out[i] = np.rint(edt_outside_padded(m) ** 2)
  return out


def edt_squared_graph(mask: tf.Tensor) -> tf.Tensor:
  """`edt_squared` in TensorFlow ops, memory linear in the pixels.

  Two exact passes over the mask padded by False: per row, the distance g to
  the nearest False pixel of the row (offsets dx = 1, 2, ... until every
  pixel has one); then per column, the minimum of dy^2 + g^2 over rows at
  offset dy, until dy^2 exceeds every pixel's best. Rolling wraps around,
  but a wrapped candidate is never nearer than the padded border. Time grows
  with the largest distance, not with H x W per pixel.
  """
  m = tf.pad(mask, [[0, 0], [1, 1], [1, 1]])
  big = tf.constant(1 << 30, tf.int32)
  g = tf.where(m, big, 0)

  def rows(dx, g):
    near = tf.logical_not(tf.roll(m, dx, axis=2)) | tf.logical_not(tf.roll(m, -dx, axis=2))
    return dx + 1, tf.minimum(g, tf.where(near, dx, big))

  _, g = tf.while_loop(lambda dx, g: dx <= tf.reduce_max(g), rows, [tf.constant(1), g])
  g2 = tf.square(g)

  def cols(dy, e):
    other = tf.minimum(tf.roll(g2, dy, axis=1), tf.roll(g2, -dy, axis=1))
    return dy + 1, tf.minimum(e, other + dy * dy)

  _, e = tf.while_loop(lambda dy, e: dy * dy <= tf.reduce_max(e), cols, [tf.constant(1), g2])
  return tf.where(mask, e[:, 1:-1, 1:-1], 0)


def clicked_map(clicks: tf.Tensor, kinds: tf.Tensor, h, w) -> tf.Tensor:
  """bool [B, H, W]: the pixels clicked so far. clicks int [B, K, 2] (x, y)."""
  used = tf.where(tf.not_equal(kinds, NONE))  # [n, 2]: (b, k)
  xy = tf.cast(tf.gather_nd(clicks, used), tf.int64)
  at = tf.stack([used[:, 0], xy[:, 1], xy[:, 0]], axis=1)
  shape = tf.cast(tf.stack([tf.shape(kinds)[0], h, w]), tf.int64)
  return tf.scatter_nd(at, tf.ones([tf.shape(at)[0]], tf.int32), shape) > 0


def next_click(pred: tf.Tensor, label: tf.Tensor, clicked: tf.Tensor):
  """The protocol's next click (module docstring, step 2).

  Args:
    pred: bool [B, H, W], the current mask.
    label: uint8 [B, H, W]: 1 object, 0 background, 255 ignore.
    clicked: bool [B, H, W], pixels already clicked.

  Returns:
    (xy int64 [B, 2] as (x, y), kind int32 [B]: 1 positive, -1 negative;
    negative at (0, 0) when no error is left).
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
  flat_d = tf.reshape(d, [tf.shape(d)[0], -1])
  at = tf.range(tf.shape(flat_d)[1])[None, :]
  # The row-major first pixel of the largest distance (tf.argmax leaves ties open).
  best = tf.reduce_max(flat_d, axis=1, keepdims=True)
  flat = tf.reduce_min(tf.where(flat_d == best, at, tf.shape(flat_d)[1]), axis=1)
  xy = tf.cast(tf.stack([flat % w, flat // w], axis=1), tf.int64)
  return xy, tf.where(positive, POSITIVE, NEGATIVE)


def next_click_of(pred: np.ndarray, label: np.ndarray, positive, negative):
  """`next_click` of one object, on arrays: the simulated user's click after
  the clicks so far (the page's "next click", the engine benchmark's annotator).

  Args:
    pred: bool [H, W], the current mask.
    label: uint8 [H, W]: 1 object, 0 background, 255 ignore.
    positive, negative: the clicks so far, [[x, y], ...].

  Returns:
    ((x, y), kind): kind POSITIVE or NEGATIVE; (None, None) when no error is left.
  """
  pred, label = tf.constant(pred[None]), tf.constant(label[None])
  if not bool(has_error(pred, label)[0]):
    return None, None
  h, w = label.shape[1:]
  xy = np.asarray(list(positive) + list(negative), np.int64).reshape(1, -1, 2)
  kinds = np.array([[POSITIVE] * len(positive) + [NEGATIVE] * len(negative)], np.int32).reshape(
    1, -1
  )
  clicked = clicked_map(tf.constant(xy), tf.constant(kinds), h, w)
  at, kind = next_click(pred, label, clicked)
  return tuple(int(v) for v in at[0].numpy()), int(kind[0])


def training_click(pred: tf.Tensor, truth: tf.Tensor, care: tf.Tensor, seed=None):
  """RITM's corrective click while training (`get_next_points`), in the graph.

  Of the false negatives and false positives, the region holding the pixel
  farthest from its boundary (exact distance transform, the image border
  counting as boundary) gets the click, at a random pixel of its inner half
  (distance above half its largest).

  Args:
    pred, truth, care: bool [B, H, W]: the mask, the object, the pixels that count.
    seed: seed of the random pixel.

  Returns:
    (xy int64 [B, 2] as (x, y), positive bool [B], valid bool [B]: False
    where no error is left, and no click is given).
  """
  fn = truth & tf.logical_not(pred) & care
  fp = tf.logical_not(truth) & pred & care
  fn_d, fp_d = edt_squared_graph(fn), edt_squared_graph(fp)
  positive = tf.reduce_max(fn_d, axis=[1, 2]) > tf.reduce_max(fp_d, axis=[1, 2])
  d = tf.where(positive[:, None, None], fn_d, fp_d)
  top = tf.reduce_max(d, axis=[1, 2])
  inner = 4 * d > top[:, None, None]  # distance > max / 2, on squared distances
  score = tf.random.uniform(tf.shape(d), 0.5, 1.0, seed=seed) * tf.cast(inner, tf.float32)
  w = tf.shape(d)[2]
  flat = tf.argmax(tf.reshape(score, [tf.shape(d)[0], -1]), axis=1, output_type=tf.int32)
  xy = tf.cast(tf.stack([flat % w, flat // w], axis=1), tf.int64)
  return xy, positive, top > 0


def has_error(pred: tf.Tensor, label: tf.Tensor) -> tf.Tensor:
  """bool [B]: whether the mask `pred` [B, H, W] differs from `label` outside ignore."""
  care = tf.not_equal(label, keys.IGNORE)
  return tf.reduce_any(tf.not_equal(pred, tf.equal(label, 1)) & care, axis=[1, 2])


def nearest_click_logits(clicks, kinds, h, w):
  """The no-model baseline: 1.0 where the nearest click (exact Euclidean
  distance) is positive, else -1.0 (ties and no positive click: background).
  Memory is [B, H, W] whatever the number of clicks.

  Args:
    clicks: int64 [B, K, 2] of (x, y); kinds: int32 [B, K], 1 positive,
      -1 negative, 0 unused.

  Returns:
    float32 [B, H, W].
  """
  ys = tf.range(h, dtype=tf.int64)[None, :, None]
  xs = tf.range(w, dtype=tf.int64)[None, None, :]
  far = tf.constant(np.iinfo(np.int64).max, tf.int64)
  start = tf.fill(tf.stack([tf.shape(kinds)[0], h, w]), far)

  def one_click(k, pos, neg):  # One [B, H, W] at a time.
    d2 = tf.square(ys - clicks[:, k, 1, None, None]) + tf.square(xs - clicks[:, k, 0, None, None])
    kind = kinds[:, k, None, None]
    return (
      k + 1,
      tf.where(kind == POSITIVE, tf.minimum(pos, d2), pos),
      tf.where(kind == NEGATIVE, tf.minimum(neg, d2), neg),
    )

  _, pos, neg = tf.while_loop(
    lambda k, *_: k < tf.shape(kinds)[1], one_click, [tf.constant(0), start, start]
  )
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
