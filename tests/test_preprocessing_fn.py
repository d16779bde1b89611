"""The tf.Transform preprocessing_fn, analyzed for real by tf.Transform on Beam."""

import numpy as np
import tensorflow as tf
import tensorflow_transform.beam as tft_beam
from tensorflow_transform.tf_metadata import dataset_metadata, schema_utils

from beam_prep import keys, preprocessing


def _analyze_and_transform(tmp_path, rows, spec, fn):
  meta = dataset_metadata.DatasetMetadata(schema_utils.schema_from_feature_spec(spec))
  with tft_beam.Context(temp_dir=str(tmp_path)):
    (out, _), _ = (rows, meta) | tft_beam.AnalyzeAndTransformDataset(fn)
  return out


def test_segmentation_fn_standardizes_with_full_pass_statistics(tmp_path):
  rng = np.random.default_rng(0)
  h = w = 4
  rows = []
  for i in range(6):
    image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    image[..., 2] = 7  # a constant channel must not divide by zero
    mask = np.zeros((h, w), np.uint8)
    mask[1:3, 1:3] = 1
    mask[0, 0] = keys.IGNORE
    rows.append({keys.IMAGE: image.tobytes(),
                 keys.DISTANCE_MAPS: np.full((h, w, 2), 51 * (i % 5), np.uint8).tobytes(),
                 keys.MASK: mask.tobytes()})
  spec = {k: tf.io.FixedLenFeature([], tf.string)
          for k in (keys.IMAGE, keys.DISTANCE_MAPS, keys.MASK)}
  out = _analyze_and_transform(tmp_path, rows, spec,
                               preprocessing.make_preprocessing_fn(h, w))
  images = np.stack([o[keys.IMAGE] for o in out]).reshape(-1, 3)
  np.testing.assert_allclose(images[:, :2].mean(0), 0, atol=1e-4)
  np.testing.assert_allclose(images[:, :2].std(0), 1, atol=1e-3)
  assert np.isfinite(images).all() and np.allclose(images[:, 2], 0)
  maps = np.stack([o[keys.DISTANCE_MAPS] for o in out])
  assert maps.min() == 0 and np.isclose(maps.max(), 204 / 255)
  label = out[0][keys.LABEL].reshape(h, w)
  weight = out[0][keys.LABEL_WEIGHT].reshape(h, w)
  assert label.sum() == 4 and weight[0, 0] == 0 and weight.sum() == 15


def test_classification_fn_builds_a_label_vocabulary(tmp_path):
  rows = [{keys.IMAGE: np.full((2, 2, 3), v, np.uint8).tobytes(), keys.LABEL: label}
          for v, label in enumerate([b"cat", b"dog", b"dog", b"eel", b"dog", b"cat"])]
  spec = {keys.IMAGE: tf.io.FixedLenFeature([], tf.string),
          keys.LABEL: tf.io.FixedLenFeature([], tf.string)}
  out = _analyze_and_transform(tmp_path, rows, spec,
                               preprocessing.make_classification_preprocessing_fn(2, 2))
  assert [int(o[keys.LABEL]) for o in out] == [1, 0, 0, 2, 0, 1]
