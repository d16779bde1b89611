"""The guided filter that gives the served probabilities the photograph's edges.

The model sees a request at the records' size (128 px for the `real` preset),
so its probabilities, resized back to the photograph, are smooth blobs whose
edges fall between the object's. He, Sun and Tang's guided filter ("Guided
Image Filtering", 2010) fits the probabilities, in every window, as a linear
function of the pixel's colour: where the colour is flat the map keeps the
model's values, where the colour steps the map steps with it.

The serving graph (`train.export.servers`) refines each click's
probabilities in the region the model saw (the crop's box inside the image,
or the whole image), before the threshold, so the mask, the probabilities
and the next click's previous mask are all the refined ones. It runs as the
fast guided filter does (He and Sun, 2015): the coefficients are fitted in a
working frame whose long side is `WORK_SIDE` pixels, resized back to the
region, and applied to its full-resolution colours (up to `APPLY_SIDE`), so
thin parts keep the photograph's own edges. A pool's window is a static op attribute, so the
radius is fixed in the working frame: the window is the same share of
whatever region the model saw (8 px of a 128-px model's frame). Only TFLite
builtins are used (average pools over a symmetric pad, a closed-form 3x3
solve, `tf.unstack` instead of channel slices), so the portable exports hold
the same filter.

What it does to NoC: docs/evaluation.md, "The guided filter".
"""

import tensorflow as tf

from beam_prep.ops.image import fitted_size

# The working frame's long side, its window's radius and the regulariser
# (colours in [0, 1]); chosen on held-out photographs (docs/evaluation.md:
# a 256-px frame and a radius of 16 clicked as well, at 4 times the cost).
WORK_SIDE = 128
RADIUS = 8
EPS = 1e-3
# The largest long side the coefficients are applied at: a larger region
# (a phone's 12-megapixel photograph) is refined at this size and its
# probabilities resized back, so the filter's time and memory stay bounded.
APPLY_SIDE = 1024


def box_mean(x: tf.Tensor, r: int) -> tf.Tensor:
  """float [H, W, C] -> each channel's mean over each (2r+1)^2 window, the
  edges mirrored (H, W >= r). Two 1-D pools (one 2-D pool of the window
  costs 30 times more), over every channel at once (a pool per map costs 3
  times more)."""
  x = tf.pad(tf.expand_dims(x, 0), [[0, 0], [r, r], [r, r], [0, 0]], "SYMMETRIC")
  x = tf.nn.avg_pool2d(x, [1, 2 * r + 1], 1, "VALID")
  return tf.squeeze(tf.nn.avg_pool2d(x, [2 * r + 1, 1], 1, "VALID"), 0)


# The colour pairs of the guide's covariance (upper triangle).
_PAIRS = tuple((i, j) for i in range(3) for j in range(i, 3))


def _solve3(v, cov):
  """Per pixel, the solution a of the symmetric 3x3 system v a = cov, by its
  adjugate. v: {(i, j): [H, W]} for (i, j) in `_PAIRS`; cov: three [H, W]."""
  a11, a12, a13, a22, a23, a33 = (v[k] for k in _PAIRS)
  c11, c12, c13 = a22 * a33 - a23 * a23, a13 * a23 - a12 * a33, a12 * a23 - a13 * a22
  c22, c23, c33 = a11 * a33 - a13 * a13, a12 * a13 - a11 * a23, a11 * a22 - a12 * a12
  det = a11 * c11 + a12 * c12 + a13 * c13
  rows = ((c11, c12, c13), (c12, c22, c23), (c13, c23, c33))
  return [(r[0] * cov[0] + r[1] * cov[1] + r[2] * cov[2]) / det for r in rows]


def coefficients(guide, p, r: int = RADIUS, eps: float = EPS):
  """The guided filter's window-averaged coefficients: [H, W, 4], the three
  colours' weights and the offset, so the filtered map is
  sum(weights * colour) + offset.

  Args:
    guide: float32 [H, W, 3], colours in [0, 1] (H, W >= r).
    p: float32 [H, W], the map to filter.
  """
  c = tf.unstack(guide, num=3, axis=-1)
  maps = [*c, p, *(x * p for x in c), *(c[i] * c[j] for i, j in _PAIRS)]
  means = tf.unstack(box_mean(tf.stack(maps, axis=-1), r), num=len(maps), axis=-1)
  mean_c, mean_p, mean_cp, mean_cc = means[:3], means[3], means[4:7], means[7:]
  cov = [mean_cp[k] - mean_c[k] * mean_p for k in range(3)]
  v = {
    (i, j): m - mean_c[i] * mean_c[j] + (eps if i == j else 0.0)
    for (i, j), m in zip(_PAIRS, mean_cc)
  }
  a = _solve3(v, cov)
  b = mean_p - a[0] * mean_c[0] - a[1] * mean_c[1] - a[2] * mean_c[2]
  return box_mean(tf.stack([*a, b], axis=-1), r)


def working_size(height, width):
  """int32 [2]: the working frame of a height x width region, its long side
  `WORK_SIDE`, each side at least `RADIUS + 1` (the mirrored pad's limit)."""
  return tf.maximum(tf.stack(fitted_size(height, width, WORK_SIDE, WORK_SIDE, xp=tf)), RADIUS + 1)


def applied_size(height, width):
  """int32 [2]: where the coefficients meet the colours: the region itself,
  or, over `APPLY_SIDE` on its long side, the region fitted into it."""
  size = tf.stack([height, width])
  fitted = tf.stack(fitted_size(height, width, APPLY_SIDE, APPLY_SIDE, xp=tf))
  return tf.where(tf.reduce_max(size) > APPLY_SIDE, fitted, size)


def refine(image: tf.Tensor, prob: tf.Tensor, region: tf.Tensor) -> tf.Tensor:
  """The probabilities guided by the image inside `region`, unchanged outside.

  Args:
    image: uint8 [H, W, 3], the request's image.
    prob: float32 [H, W], the model's probabilities at the image's size.
    region: int32 [4], (x0, y0, x1, y1) inside the image (x1, y1 exclusive,
      not empty): the part of the image the model saw.

  Returns:
    float32 [H, W] in [0, 1].
  """
  x0, y0, x1, y1 = tf.unstack(region, num=4)
  size = tf.stack([y1 - y0, x1 - x0])
  applied = applied_size(size[0], size[1])
  resize = lambda x, to: tf.image.resize(x, to, method="bilinear")  # noqa: E731
  # tf.slice and tf.unstack, not [a:b] or [..., c]: TFLite's builtins refuse
  # those strided slices.
  # A float image: TFLite's builtins resize no uint8 to float.
  guide = resize(tf.cast(tf.slice(image, [y0, x0, 0], [size[0], size[1], 3]), tf.float32), applied)
  guide = guide / 255.0
  crop = resize(tf.expand_dims(tf.slice(prob, [y0, x0], size), -1), applied)
  small = resize(tf.concat([guide, crop], axis=-1), working_size(size[0], size[1]))
  small_guide, small_p = tf.split(small, [3, 1], axis=-1)
  coef = coefficients(small_guide, tf.squeeze(small_p, -1))
  *weights, offset = tf.unstack(resize(coef, applied), num=4, axis=-1)
  colours = tf.unstack(guide, num=3, axis=-1)
  refined = weights[0] * colours[0] + weights[1] * colours[1] + weights[2] * colours[2] + offset
  refined = tf.squeeze(resize(tf.expand_dims(refined, -1), size), -1)
  h, w = tf.shape(prob)[0], tf.shape(prob)[1]
  placed = tf.pad(tf.clip_by_value(refined, 0.0, 1.0), [[y0, h - y1], [x0, w - x1]])
  rows, cols = tf.range(h), tf.range(w)
  in_rows = tf.expand_dims(tf.logical_and(rows >= y0, rows < y1), 1)
  in_cols = tf.expand_dims(tf.logical_and(cols >= x0, cols < x1), 0)
  return tf.where(tf.logical_and(in_rows, in_cols), placed, prob)
