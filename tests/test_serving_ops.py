"""The serving graph's TensorFlow twins against the Beam job's numpy ops."""

import numpy as np
import pytest
import tensorflow as tf

from beam_prep.ops.distance import distance_maps as np_distance_maps
from beam_prep.ops.image import resize_image
from train import distance
from train.export import resize_uint8, scale_clicks, to_raw_bytes


@pytest.mark.parametrize("h,w,n_pos,n_neg", [
    (64, 64, 1, 10), (37, 91, 5, 0), (128, 80, 0, 3), (200, 200, 3, 25), (1, 7, 1, 1)])
def test_tf_distance_maps_equal_numpy(h, w, n_pos, n_neg):
  rng = np.random.default_rng(h + w + n_pos)
  pos = np.stack([rng.integers(0, w, n_pos), rng.integers(0, h, n_pos)], 1).reshape(-1, 2)
  neg = np.stack([rng.integers(0, w, n_neg), rng.integers(0, h, n_neg)], 1).reshape(-1, 2)
  # Border clicks too.
  if n_neg:
    neg[0] = [w - 1, h - 1]
  want = np_distance_maps(pos, neg, h, w)
  got = distance.distance_maps(tf.constant(pos, tf.int32), tf.constant(neg, tf.int32), h, w)
  np.testing.assert_array_equal(got.numpy(), want)


def test_raw_bytes_equal_numpy_tobytes():
  x = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
  assert to_raw_bytes(tf.constant(x)).numpy() == x.tobytes()


@pytest.mark.parametrize("shape", [(64, 64), (120, 160), (37, 200), (300, 90)])
def test_tf_resize_matches_the_beam_resize(shape):
  img = np.random.default_rng(1).integers(0, 256, shape + (3,), dtype=np.uint8)
  want = resize_image(img, 64, 64)
  got = resize_uint8(tf.constant(img), 64).numpy()
  # Same arithmetic; float rounding may differ by one level on a rare pixel.
  assert np.abs(got.astype(int) - want.astype(int)).max() <= 1
  assert (got != want).mean() < 0.001


def test_scale_clicks_is_identity_at_the_record_size_and_clamps():
  clicks = tf.constant([[0, 0], [63, 10], [70, -5]], tf.int32)
  got = scale_clicks(clicks, 64, 64, 64).numpy()
  assert got.tolist() == [[0, 0], [63, 10], [63, 0]]
