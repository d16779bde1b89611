"""The serving graph's guided filter (`train.export.guided_filter`)."""

import numpy as np
import pytest
import tensorflow as tf
from scipy.ndimage import gaussian_filter, uniform_filter

from train.export import guided_filter as gf


def _reference(guide, p, r, eps):
  """He et al.'s colour guided filter in float64, each window's 3x3 system
  solved by numpy (edges mirrored as `box_mean` mirrors them)."""
  mean = lambda x: uniform_filter(x, 2 * r + 1, mode="reflect")  # noqa: E731
  mi = np.stack([mean(guide[..., c]) for c in range(3)], -1)
  mp = mean(p)
  cov = np.stack([mean(guide[..., c] * p) for c in range(3)], -1) - mi * mp[..., None]
  var = np.empty(guide.shape[:2] + (3, 3))
  for i in range(3):
    for j in range(3):
      var[..., i, j] = mean(guide[..., i] * guide[..., j]) - mi[..., i] * mi[..., j]
  a = np.linalg.solve(var + eps * np.eye(3), cov[..., None])[..., 0]
  b = mp - (a * mi).sum(-1)
  return (np.stack([mean(a[..., c]) for c in range(3)], -1) * guide).sum(-1) + mean(b)


def _refine(image, prob, region):
  return gf.refine(
    tf.constant(image), tf.constant(prob, tf.float32), tf.constant(region, tf.int32)
  ).numpy()


def test_a_region_of_the_working_size_is_the_guided_filter_itself():
  rng = np.random.default_rng(0)
  h, w = gf.WORK_SIDE, gf.WORK_SIDE * 2 // 3  # No resizing: the working frame is the region.
  image = rng.integers(0, 256, (h + 20, w + 30, 3), dtype=np.uint8)
  prob = rng.random((h + 20, w + 30)).astype(np.float32)
  got = _refine(image, prob, [10, 5, 10 + w, 5 + h])
  want = _reference(
    image[5 : 5 + h, 10 : 10 + w] / 255.0,
    prob[5 : 5 + h, 10 : 10 + w].astype(float),
    gf.RADIUS,
    gf.EPS,
  )
  np.testing.assert_allclose(got[5 : 5 + h, 10 : 10 + w], np.clip(want, 0, 1), atol=1e-5)
  outside = np.ones(prob.shape, bool)
  outside[5 : 5 + h, 10 : 10 + w] = False
  np.testing.assert_array_equal(got[outside], prob[outside])


def _disk_scene(h, w, cy, cx, radius):
  yy, xx = np.mgrid[:h, :w]
  disk = (yy - cy) ** 2 + (xx - cx) ** 2 <= radius**2
  image = np.full((h, w, 3), (40, 90, 60), np.uint8)
  image[disk] = (200, 170, 120)
  return image, disk


def _iou(a, b):
  return (a & b).sum() / (a | b).sum()


# The last is over APPLY_SIDE: refined at that size and resized back.
@pytest.mark.parametrize("shape", [(300, 400), (480, 854), (1100, 1500)])
def test_a_blob_around_the_object_takes_the_photographs_edges(shape):
  h, w = shape
  radius = h // 5
  image, disk = _disk_scene(h, w, h // 2, w // 3, radius)
  # The model's blob: the object grown by a fifth and blurred, as a
  # low-resolution prediction resized back to the photograph looks.
  grown = _disk_scene(h, w, h // 2, w // 3, radius + radius // 5)[1]
  prob = gaussian_filter(grown.astype(float), 6)
  before = _iou(prob > 0.49, disk)
  after = _iou(_refine(image, prob, [0, 0, w, h]) > 0.49, disk)
  assert before < 0.85 and after > 0.97, (before, after)


def test_a_thin_region_is_filtered_and_the_output_stays_a_probability():
  rng = np.random.default_rng(1)
  image = rng.integers(0, 256, (60, 300, 3), dtype=np.uint8)
  prob = rng.random((60, 300)).astype(np.float32)
  got = _refine(image, prob, [0, 20, 300, 25])  # 5 rows: fewer than the radius.
  assert got.shape == prob.shape and np.isfinite(got).all()
  assert got.min() >= 0.0 and got.max() <= 1.0
  assert not np.array_equal(got[20:25], prob[20:25])
  np.testing.assert_array_equal(got[:20], prob[:20])
  np.testing.assert_array_equal(got[25:], prob[25:])


def test_the_frames_keep_the_aspect_and_their_limits():
  applied = lambda h, w: tuple(gf.applied_size(h, w).numpy())  # noqa: E731
  assert applied(480, 854) == (480, 854)
  assert applied(3000, 4000) == (3000 * gf.APPLY_SIDE // 4000, gf.APPLY_SIDE)
  size = lambda h, w: tuple(gf.working_size(h, w).numpy())  # noqa: E731
  assert size(480, 854) == (round(480 * gf.WORK_SIDE / 854), gf.WORK_SIDE)
  assert size(64, 64) == (gf.WORK_SIDE, gf.WORK_SIDE)
  assert size(5, 300) == (gf.RADIUS + 1, gf.WORK_SIDE)


@pytest.mark.parametrize("grey", ["texture", "black_and_white", "flat"])
def test_a_grey_photograph_is_filtered_as_the_reference_does(grey):
  """Three equal channels make the colour covariance singular but for the
  regulariser: the closed-form solve in float32 still agrees."""
  rng = np.random.default_rng(3)
  h, w = gf.WORK_SIDE, gf.WORK_SIDE * 2 // 3
  g = {
    "texture": rng.integers(0, 256, (h, w)),
    "black_and_white": (rng.random((h, w)) > 0.5) * 255,
    "flat": np.full((h, w), 77),
  }[grey].astype(np.uint8)
  image = np.repeat(g[..., None], 3, axis=-1)
  prob = rng.random((h, w)).astype(np.float32)
  want = _reference(image / 255.0, prob.astype(float), gf.RADIUS, gf.EPS)
  np.testing.assert_allclose(_refine(image, prob, [0, 0, w, h]), np.clip(want, 0, 1), atol=1e-3)
