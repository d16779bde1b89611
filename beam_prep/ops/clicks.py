"""Simulated user clicks, as in Xu et al., "Deep Interactive Object Selection"
(CVPR 2016), section 3.2.

For one object (`mask` == 1) of a scene, one *variant* is one independent
sampling of:
- positive clicks: 1..5 pixels inside the object, at least `d_margin` from its
  boundary and at least `d_step` apart. An object with no pixel that far
  from its boundary (a thin one: a ski, a knife, a tie at the records' size)
  gets its clicks on its most interior pixels instead, those at the largest
  distance from its boundary it has, and its examples are marked
  `MARGIN_REDUCED` (the job counts such objects as `objects_margin_reduced`);
- negative clicks, by one strategy drawn at random from those that apply:
  1. background pixels within distance [`d_margin`, `d`] of the object,
     `d_step` apart (10 clicks);
  2. pixels on *other* objects, `d_margin` away from this one (5 clicks);
  3. pixels along the object's boundary at distance `d_margin`, spread by
     farthest-point sampling (10 clicks).

  4. (not DIOS) the clicks of the evaluation protocol (`train.evaluate.noc`), run
     against the nearest-click baseline: the first positive click at the
     object's pixel farthest from its boundary, then each next click at the
     error pixel farthest from its error region's boundary, 1 to
     `protocol_clicks` clicks in all. Such variants teach a model the click
     patterns it is measured with (one click alone; clicks on its errors).
     With `protocol_share` > 0, that share of the variants takes them, and
     the others draw among strategies 1-3.

Negative clicks keep `d_margin` from the object whatever its width. An object
is dropped (`object_too_small`) only when no pixel of it is left at the
records' size.

Clicks are int64 arrays [N, 2] of (x, y) = (column, row).

Randomness comes only from a generator seeded with (seed, image id, object id,
variant), so a sample is bit-identical whatever the runner, the worker count
or the bundle order. Distances are computed once per object in a window
around it (objects are usually far smaller than the image), and shared by all
its variants.
"""

import zlib
from typing import List, Optional, Tuple

import numpy as np
from scipy import ndimage

from beam_prep import keys
from beam_prep.features import Feature
from beam_prep.ops.registry import ExampleError, register_op

CLICKS = Feature("int64", shape=(None, 2), role="metadata")
PROTOCOL = 4  # The strategy whose clicks follow the evaluation protocol.
# On each example of an object: True when the object has no pixel `d_margin`
# from its boundary and its positive clicks keep the largest margin it allows.
MARGIN_REDUCED = "click_margin_reduced"
_INT = Feature("int64", shape=(), role="metadata")


def example_rng(seed: int, image_id: str, object_id: int, variant: int) -> np.random.Generator:
  """A generator that depends only on its arguments (stable across processes)."""
  return np.random.default_rng(
    [int(seed), zlib.crc32(image_id.encode("utf-8")), int(object_id), int(variant)]
  )


def _spaced_sample(
  candidates: np.ndarray,
  n: int,
  d_step: float,
  rng: np.random.Generator,
  accept=None,
  exact_pool=None,
) -> np.ndarray:
  """Up to `n` points pairwise >= d_step apart, uniform over the valid ones.

  Rejection sampling first: draw a row of `candidates` ([M, 2] as (y, x)),
  keep it if `accept(point)` (when given) and it is far enough from those
  kept. When that stalls, the exact pool of valid points (`exact_pool()`, or
  `candidates`) is filtered by spacing, so the result is as large as the
  spacing allows.
  """
  m = candidates.shape[0]
  if m == 0 or n <= 0:
    return np.zeros((0, 2), np.int64)
  chosen: List[np.ndarray] = []
  d2 = d_step * d_step
  tries = 0
  while len(chosen) < n and tries < 20 * n:
    tries += 1
    c = candidates[rng.integers(m)]
    if all(((c - p) ** 2).sum() >= d2 for p in chosen) and (accept is None or accept(c)):
      chosen.append(c)
  if len(chosen) < n:
    pool = exact_pool() if exact_pool is not None else candidates
    for p in chosen:
      pool = pool[((pool - p) ** 2).sum(axis=1) >= d2]
    while len(chosen) < n and pool.shape[0]:
      c = pool[rng.integers(pool.shape[0])]
      chosen.append(c)
      pool = pool[((pool - c) ** 2).sum(axis=1) >= d2]
  if not chosen:
    return np.zeros((0, 2), np.int64)
  return np.stack(chosen).astype(np.int64)


def _farthest_points(candidates: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
  """`n` candidates spread by farthest-point sampling from a random start."""
  m = candidates.shape[0]
  if m == 0 or n <= 0:
    return np.zeros((0, 2), np.int64)
  first = rng.integers(m)
  chosen = [first]
  dist = ((candidates - candidates[first]) ** 2).sum(axis=1)
  for _ in range(min(n, m) - 1):
    nxt = int(np.argmax(dist))
    if dist[nxt] == 0:
      break
    chosen.append(nxt)
    np.minimum(dist, ((candidates - candidates[nxt]) ** 2).sum(axis=1), out=dist)
  return candidates[chosen].astype(np.int64)


def edt_outside_padded(mask: np.ndarray) -> np.ndarray:
  """Distance of each True pixel to the nearest False one, the outside of the
  image counting as False (0 on False pixels)."""
  return ndimage.distance_transform_edt(np.pad(mask, 1))[1:-1, 1:-1]


def protocol_click(pred: np.ndarray, label: np.ndarray, clicked: np.ndarray):
  """The evaluation protocol's next click (RITM's clicker), numpy and scipy.

  Args:
    pred: bool [H, W], the current mask.
    label: uint8 [H, W]: 1 object, 0 background, 255 ignore (never an error).
    clicked: bool [H, W], pixels clicked already (never clicked again).

  Returns:
    (x, y, kind), kind 1 for a positive click (the false negatives hold the
    pixel farthest from their region's boundary) or -1; with no error left,
    (0, 0, -1) as RITM's clicker. Ties go to the row-major first pixel.
  """
  gt, care = label == 1, label != keys.IGNORE
  fn_d = edt_outside_padded(gt & ~pred & care)
  fp_d = edt_outside_padded(~gt & pred & care)
  # Compared as integers (squared distances), as the TensorFlow twin does.
  fn_d, fp_d = np.rint(fn_d**2).astype(np.int64), np.rint(fp_d**2).astype(np.int64)
  fn_d[clicked] = 0
  fp_d[clicked] = 0
  positive = fn_d.max() > fp_d.max()
  d = fn_d if positive else fp_d
  y, x = np.unravel_index(np.argmax(d), d.shape)
  return int(x), int(y), 1 if positive else -1


def nearest_click_mask(positive: np.ndarray, negative: np.ndarray, h: int, w: int) -> np.ndarray:
  """The no-model baseline: True where the nearest click (x, y) is positive."""
  yy, xx = np.mgrid[:h, :w]

  def nearest(points):
    if len(points) == 0:
      return np.full((h, w), np.inf)
    return np.min([(yy - y) ** 2 + (xx - x) ** 2 for x, y in points], axis=0)

  return nearest(positive) < nearest(negative)


def protocol_clicks(label: np.ndarray, n: int):
  """`n` clicks of the evaluation protocol against the nearest-click baseline
  -> (positive, negative) int64 [N, 2] of (x, y); fewer when no error is left."""
  h, w = label.shape
  pos, neg = [], []
  clicked = np.zeros((h, w), bool)
  pred = np.zeros((h, w), bool)
  care = label != keys.IGNORE
  for _ in range(n):
    if not (pred != (label == 1))[care].any():
      break  # No error left: a sampled click would say nothing.
    x, y, kind = protocol_click(pred, label, clicked)
    (pos if kind == 1 else neg).append((x, y))
    clicked[y, x] = True
    pred = nearest_click_mask(pos, neg, h, w)
  as_array = lambda p: np.asarray(p, np.int64).reshape(-1, 2)  # pylint: disable=unnecessary-lambda-assignment
  return as_array(pos), as_array(neg)


class ObjectGeometry:
  """Per-object candidate pixels, computed once and shared by all variants.

  Args:
    mask: uint8 [H, W], 1 object, 0 background, 255 ignore.
    instance_mask: uint8 [H, W] instance ids of the whole scene, or None.
    d: strategy-1 outer distance.
    d_margin: margin from the object boundary.
  """

  def __init__(
    self, mask: np.ndarray, instance_mask: Optional[np.ndarray], d: float, d_margin: float
  ):
    h, w = mask.shape
    self.mask = mask
    obj = mask == 1
    ys, xs = np.nonzero(obj)
    if ys.size == 0:
      raise ExampleError(
        "object_too_small",
        f"no pixel of the object is left at the records' size ({h}x{w}): it is smaller "
        "or thinner than one pixel there; a larger --image-size keeps it",
      )
    # Window: the object's box grown by d + 1, so every distance <= d from the
    # object is computed exactly inside it; everything outside is farther.
    pad = int(np.ceil(d)) + 1
    y0, y1 = max(ys.min() - pad, 0), min(ys.max() + pad + 1, h)
    x0, x1 = max(xs.min() - pad, 0), min(xs.max() + pad + 1, w)
    win = obj[y0:y1, x0:x1]
    outside = ndimage.distance_transform_edt(~win)
    offset = np.array([y0, x0])

    # Positive clicks need distance >= d_margin from every non-object pixel
    # (the image border counts as one). Checking a drawn pixel's disk is
    # far cheaper than a distance transform of the object; the exact
    # candidate set is computed only when drawing stalls (thin objects),
    # and an object with none falls back to its most interior pixels.
    self._obj, self._ys, self._xs = obj, ys, xs
    self.d_margin = d_margin
    r = int(np.ceil(d_margin))
    dy, dx = np.mgrid[-r : r + 1, -r : r + 1]
    near = dy * dy + dx * dx < d_margin * d_margin
    self._disk = (dy[near], dx[near])
    self._positive_pool = None
    self._inside = None

    valid = mask[y0:y1, x0:x1] != keys.IGNORE
    others_win = np.zeros_like(win)
    if instance_mask is not None:
      inst = instance_mask[y0:y1, x0:x1]
      others_win = (inst != keys.BACKGROUND) & valid & ~win
    background = valid & ~win & ~others_win
    # Strategy 1: background within [d_margin, d] of the object.
    self.strategy1 = np.argwhere(background & (outside >= d_margin) & (outside <= d)) + offset
    # Strategy 3: a band at distance ~d_margin around the object, not ignore.
    band = valid & ~win & (outside >= d_margin) & (outside < d_margin + 1)
    self.strategy3 = np.argwhere(band) + offset
    # Strategy 2: pixels of other objects, at least d_margin from this one.
    # Outside the window every pixel is farther than d >= d_margin.
    if instance_mask is not None:
      others = (instance_mask != keys.BACKGROUND) & (instance_mask != keys.IGNORE) & ~(mask == 1)
      near = np.zeros_like(others)
      near[y0:y1, x0:x1] = outside < d_margin
      self.strategy2 = np.argwhere(others & ~near)
    else:
      self.strategy2 = np.zeros((0, 2), np.int64)

  def interior(self, point: np.ndarray) -> bool:
    """Whether (y, x) is at least d_margin from every non-object pixel."""
    h, w = self._obj.shape
    yy, xx = point[0] + self._disk[0], point[1] + self._disk[1]
    if yy.min() < 0 or xx.min() < 0 or yy.max() >= h or xx.max() >= w:
      return False
    return bool(self._obj[yy, xx].all())

  def inside(self) -> Tuple[np.ndarray, np.ndarray]:
    """Distance of each pixel of the object's box to the nearest non-object
    pixel (the image border counting as one), and the box's (y, x) origin."""
    if self._inside is None:
      ys, xs = self._ys, self._xs
      by0, bx0 = ys.min(), xs.min()
      box = self._obj[by0 : ys.max() + 1, bx0 : xs.max() + 1]
      self._inside = (edt_outside_padded(box), np.array([by0, bx0]))
    return self._inside

  def positive_pool(self) -> np.ndarray:
    """Every valid positive pixel, (y, x); exact, by a distance transform."""
    if self._positive_pool is None:
      inside, origin = self.inside()
      self._positive_pool = np.argwhere(inside >= self.d_margin) + origin
    return self._positive_pool

  def deepest_pixels(self) -> Tuple[np.ndarray, float]:
    """The object's most interior pixels, (y, x), and their distance from its
    boundary: the largest margin any of its pixels keeps."""
    inside, origin = self.inside()
    margin = inside.max()
    return np.argwhere(inside == margin) + origin, float(margin)

  def sample_positive(
    self, n: int, d_step: float, rng: np.random.Generator
  ) -> Tuple[np.ndarray, float]:
    """Up to `n` (at least one) interior pixels, d_step apart, and the margin
    they keep from the boundary: `d_margin`, or for an object with no pixel
    that far, the largest it allows (its most interior pixels)."""
    pixels = np.stack([self._ys, self._xs], axis=1)
    pos = _spaced_sample(
      pixels, n, d_step, rng, accept=self.interior, exact_pool=self.positive_pool
    )
    if pos.shape[0]:
      return pos, self.d_margin
    deepest, margin = self.deepest_pixels()
    return _spaced_sample(deepest, n, d_step, rng), margin


def click_count(rng: np.random.Generator, low: int, high: int, gamma: float) -> int:
  """A number of clicks in low..high: uniform when `gamma` is 0; else, as
  RITM's MultiPointSampler draws them (`prob_gamma`), low + k with
  probability proportional to gamma^k, so few clicks are common and many rare."""
  if not gamma or high <= low:
    return int(rng.integers(low, high + 1))
  p = gamma ** np.arange(high - low + 1, dtype=np.float64)
  return low + int(rng.choice(high - low + 1, p=p / p.sum()))


def _takes_protocol(usable, protocol_share: float, rng: np.random.Generator) -> bool:
  """Whether a variant takes the protocol's clicks: with probability
  `protocol_share`, or (0) when strategy 4 is the one drawn from `usable`
  (the draw of records made before the share existed)."""
  if protocol_share:
    return bool(rng.random() < protocol_share)
  return int(usable[rng.integers(len(usable))]) == PROTOCOL


def sample_variant(
  geometry: ObjectGeometry,
  rng: np.random.Generator,
  *,
  min_positive: int,
  max_positive: int,
  negatives,
  d_step: float,
  strategies,
  protocol_clicks_max: int = 10,
  prob_gamma: float = 0.0,
  protocol_share: float = 0.0,
) -> dict:
  """Samples one variant's clicks from an object's candidates.

  With `prob_gamma` 0 the variant has min_positive..max_positive positive
  clicks (uniform) and its strategy's full number of negative ones; with
  0 < prob_gamma <= 1 both counts are drawn by `click_count` (negatives from 0).
  With `protocol_share` > 0 the variant takes the protocol's clicks with that
  probability (`_takes_protocol`), else strategy 4 is drawn as one of `strategies`.

  Returns:
    dict with `positive_clicks`, `negative_clicks` (int64 [N, 2] as (x, y)),
    `negative_strategy` (1, 2, 3, 4, or 0 if no strategy had candidates) and
    `MARGIN_REDUCED` (the object is thinner than the margin: see the module
    docstring).
  """
  n_pos = click_count(rng, min_positive, max_positive, prob_gamma)
  pos, margin = geometry.sample_positive(n_pos, d_step, rng)
  reduced = {MARGIN_REDUCED: bool(margin < geometry.d_margin)}
  pools = {1: geometry.strategy1, 2: geometry.strategy2, 3: geometry.strategy3}
  usable = [s for s in strategies if s == PROTOCOL or pools[s].shape[0] > 0]
  if PROTOCOL in usable and _takes_protocol(usable, protocol_share, rng):
    n = int(rng.integers(1, protocol_clicks_max + 1))
    pos, neg = protocol_clicks(geometry.mask, n)
    return {
      "positive_clicks": pos,
      "negative_clicks": neg,
      "negative_strategy": PROTOCOL,
      **reduced,
    }
  usable = [s for s in usable if s != PROTOCOL]
  if usable:
    strategy = int(usable[rng.integers(len(usable))])
    n_neg = int(negatives[strategy - 1])
    if prob_gamma:
      n_neg = click_count(rng, 0, n_neg, prob_gamma)
    if strategy == 3:
      neg = _farthest_points(pools[3], n_neg, rng)
    else:
      neg = _spaced_sample(pools[strategy], n_neg, d_step, rng)
  else:
    strategy, neg = 0, np.zeros((0, 2), np.int64)
  return {
    "positive_clicks": pos[:, ::-1].copy(),  # (y, x) -> (x, y)
    "negative_clicks": neg[:, ::-1].copy(),
    "negative_strategy": strategy,
    **reduced,
  }


def _check_sampling(variants: int, draw: dict) -> None:
  """`sample_clicks`' settings (`variants`, and `draw`: what it passes to
  `sample_variant`), checked: a ValueError naming the one out of range."""
  min_positive, max_positive = draw["min_positive"], draw["max_positive"]
  strategies, protocol_clicks = draw["strategies"], draw["protocol_clicks_max"]
  prob_gamma, protocol_share = draw["prob_gamma"], draw["protocol_share"]
  if variants < 1:
    raise ValueError(f"variants must be >= 1, got {variants}")
  if not 1 <= min_positive <= max_positive:
    raise ValueError(f"need 1 <= min_positive <= max_positive, got {min_positive}, {max_positive}")
  if not strategies or any(s not in (1, 2, 3, PROTOCOL) for s in strategies):
    raise ValueError(f"strategies must be a non-empty subset of (1, 2, 3, 4), got {strategies}")
  if protocol_clicks < 1:
    raise ValueError(f"protocol_clicks must be >= 1, got {protocol_clicks}")
  if not 0 <= prob_gamma <= 1:
    raise ValueError(f"prob_gamma must be in [0, 1], got {prob_gamma}")
  if not 0 <= protocol_share <= 1:
    raise ValueError(f"protocol_share must be in [0, 1], got {protocol_share}")
  if protocol_share and PROTOCOL not in strategies:
    raise ValueError(
      f"protocol_share {protocol_share} needs strategy {PROTOCOL} (the protocol's clicks) "
      f"among the strategies, got {strategies}"
    )


@register_op(
  "sample_clicks",
  reads=(keys.IMAGE_ID, keys.OBJECT_ID, keys.MASK),
  produces={
    keys.POSITIVE_CLICKS: CLICKS,
    keys.NEGATIVE_CLICKS: CLICKS,
    keys.NEGATIVE_STRATEGY: _INT,
    keys.VARIANT: _INT,
  },
  intermediate=(MARGIN_REDUCED,),
)
def sample_clicks(
  variants: int = 1,
  seed: int = 0,
  min_positive: int = 1,
  max_positive: int = 5,
  negatives=(10, 5, 10),
  d: float = 40,
  d_margin: float = 5,
  d_step: float = 10,
  strategies=(1, 2, 3),
  protocol_clicks: int = 10,
  prob_gamma: float = 0.0,
  protocol_share: float = 0.0,
):
  """Fans one object out into `variants` independent click samplings.

  Args:
    variants: samplings per object (precomputed augmentation).
    seed: global seed, combined with image id, object id and variant.
    min_positive: fewest positive clicks.
    max_positive: most positive clicks.
    negatives: clicks for strategies 1, 2 and 3.
    d: strategy-1 outer distance from the object.
    d_margin: margin from the object boundary (all clicks; an object with no
      pixel that far gets its positive clicks on its most interior pixels).
    d_step: least distance between two clicks of one kind.
    strategies: which strategies may be drawn (4: the evaluation protocol's
      clicks, see the module docstring).
    protocol_clicks: strategy 4 gives 1 to this many clicks.
    prob_gamma: 0: uniform positive counts, all of a strategy's negatives;
      else RITM's draw of both (`click_count`; its recipe: 24 clicks, 0.8).
    protocol_share: the share of variants given the protocol's clicks (4 must
      be among `strategies`); 0: strategy 4 is drawn as one of them.
  """
  draw = {
    "min_positive": min_positive,
    "max_positive": max_positive,
    "negatives": negatives,
    "d_step": d_step,
    "strategies": tuple(int(s) for s in strategies),
    "protocol_clicks_max": protocol_clicks,
    "prob_gamma": prob_gamma,
    "protocol_share": protocol_share,
  }
  _check_sampling(variants, draw)

  def fn(ex):
    geometry = ObjectGeometry(ex[keys.MASK], ex.get(keys.INSTANCE_MASK), d, d_margin)
    out = []
    for v in range(variants):
      rng = example_rng(seed, ex[keys.IMAGE_ID], ex[keys.OBJECT_ID], v)
      variant = dict(ex)
      variant.update(sample_variant(geometry, rng, **draw))
      variant[keys.VARIANT] = v
      out.append(variant)
    return out

  return fn
