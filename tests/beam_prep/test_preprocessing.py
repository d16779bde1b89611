"""The generated preprocessing_fn, analyzed for real by tf.Transform on Beam."""

import numpy as np
import pytest
import tensorflow_transform.beam as tft_beam
from tensorflow_transform.tf_metadata import dataset_metadata

from beam_prep import keys, preprocessing
from beam_prep.features import Entry, Feature, FeatureTable
from beam_prep.record_codec import RecordCodec


def _analyze_and_transform(tmp_path, rows, table, fn):
  meta = dataset_metadata.DatasetMetadata(table.raw_schema())
  with tft_beam.Context(temp_dir=str(tmp_path)):
    (out, _), _ = (rows, meta) | tft_beam.AnalyzeAndTransformDataset(fn)
  return out


def _table(h, w, task="segmentation", extra=()):
  entries = [Entry(keys.IMAGE, Feature("uint8", channels=3, normalize="standardize"), "decode")]
  entries += list(extra)
  if task == "segmentation":
    entries.append(Entry(keys.MASK, Feature("uint8", channels=1, role="label"), "split_objects"))
  else:
    entries.append(Entry(keys.LABEL, Feature("string", shape=(), role="label"), "require_label"))
  return FeatureTable(entries, (h, w), task)


def test_every_declared_model_input_is_normalized_as_declared(tmp_path):
  rng = np.random.default_rng(0)
  h = w = 4
  table = _table(
    h,
    w,
    extra=[
      Entry("maps", Feature("uint8", channels=2, normalize=255), "distance_maps"),
      Entry("disks", Feature("uint8", channels=2), "click_disks"),
      Entry("depth", Feature("float32", channels=1, normalize="standardize"), "user_op"),
      Entry("note", Feature("int64", shape=(), role="metadata"), "user_op"),
    ],
  )
  rows = []
  for i in range(6):
    image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    image[..., 2] = 7  # a constant channel must not divide by zero
    mask = np.zeros((h, w), np.uint8)
    mask[1:3, 1:3] = 1
    mask[0, 0] = keys.IGNORE
    rows.append(
      {
        keys.IMAGE: image.tobytes(),
        "maps": np.full((h, w, 2), 51 * (i % 5), np.uint8).tobytes(),
        "disks": np.eye(4, dtype=np.uint8)[..., None].repeat(2, -1).tobytes(),
        "depth": rng.normal(10.0, 3.0, (h, w, 1)).astype("<f4").tobytes(),
        "note": i,
        keys.MASK: mask.tobytes(),
      }
    )
  out = _analyze_and_transform(tmp_path, rows, table, preprocessing.make_preprocessing_fn(table))
  assert set(out[0]) == {keys.IMAGE, "maps", "disks", "depth", keys.LABEL, keys.LABEL_WEIGHT}
  images = np.stack([o[keys.IMAGE] for o in out]).reshape(-1, 3)
  np.testing.assert_allclose(images[:, :2].mean(0), 0, atol=1e-4)
  np.testing.assert_allclose(images[:, :2].std(0), 1, atol=1e-3)
  assert np.isfinite(images).all() and np.allclose(images[:, 2], 0)
  maps = np.stack([o["maps"] for o in out])
  assert maps.min() == 0 and np.isclose(maps.max(), 204 / 255)
  np.testing.assert_array_equal(out[0]["disks"].reshape(h, w, 2)[..., 0], np.eye(4))
  depth = np.stack([o["depth"] for o in out]).ravel()
  assert abs(depth.mean()) < 1e-4 and abs(depth.std() - 1) < 1e-3
  label = out[0][keys.LABEL].reshape(h, w)
  weight = out[0][keys.LABEL_WEIGHT].reshape(h, w)
  assert label.sum() == 4 and weight[0, 0] == 0 and weight.sum() == 15


def test_a_users_preprocessing_fn_by_module_and_name(tmp_path):
  table = _table(2, 2)
  fn = preprocessing.preprocessing_fn_for(table, "tests.fixtures.user_preprocessing:halve")
  rows = [
    {
      keys.IMAGE: np.full((2, 2, 3), 100, np.uint8).tobytes(),
      keys.MASK: np.ones((2, 2), np.uint8).tobytes(),
    }
  ]
  out = _analyze_and_transform(tmp_path, rows, table, fn)
  np.testing.assert_allclose(out[0][keys.IMAGE], 50.0)
  assert out[0][keys.LABEL].sum() == 4
  with pytest.raises(ValueError, match="has no function 'nope'"):
    preprocessing.preprocessing_fn_for(table, "tests.fixtures.user_preprocessing:nope")


def _analyze_to_dir(path, rows, spec, fn):
  from tensorflow_transform.tf_metadata import schema_utils  # pylint: disable=g-import-not-at-top

  meta = dataset_metadata.DatasetMetadata(schema_utils.schema_from_feature_spec(spec))
  with tft_beam.Context(temp_dir=str(path) + "_tmp"):
    transform_fn = (rows, meta) | tft_beam.AnalyzeDataset(fn)
    _ = transform_fn | tft_beam.WriteTransformFn(str(path))
  import tensorflow_transform as tft  # pylint: disable=g-import-not-at-top

  return tft.TFTransformOutput(str(path))


def test_summary_rows_analyze_to_the_same_graph_as_full_records(tmp_path):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(1)
  h, w = 6, 5
  table = _table(
    h,
    w,
    extra=[
      Entry("depth", Feature("float32", channels=1, normalize="standardize"), "user_op"),
      Entry("maps", Feature("uint8", channels=2, normalize=255), "distance_maps"),
    ],
  )
  examples = []
  for i in range(5):
    image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    examples.append(
      {
        keys.IMAGE: image,
        "depth": rng.normal(i, 2.0, (h, w, 1)).astype("<f4"),
        "maps": np.full((h, w, 2), 9 * i, np.uint8),
        keys.MASK: (rng.random((h, w, 1)) < 0.5).astype(np.uint8),
      }
    )
  full = [{k: v.tobytes() for k, v in ex.items()} for ex in examples]
  summary = [tf.train.Example.FromString(RecordCodec(table).summary_row(ex)) for ex in examples]
  assert all(len(s.SerializeToString()) < 200 for s in summary)  # a few floats, no pixels
  spec = RecordCodec(table).analysis_feature_spec()
  summary_rows = [
    {
      k: (
        np.array(list(s.features.feature[k].float_list.value), np.float32)
        if k not in table.keys()
        else b""
      )
      for k in spec
    }
    for s in summary
  ]
  fn = preprocessing.make_preprocessing_fn(table)
  by_records = _analyze_to_dir(tmp_path / "records", full, table.raw_feature_spec(), fn)
  by_summaries = _analyze_to_dir(tmp_path / "summaries", summary_rows, spec, fn)
  batch = {k: tf.constant([r[k] for r in full]) for k in full[0]}
  a = by_records.transform_features_layer()(batch)
  b = by_summaries.transform_features_layer()(batch)  # summaries absent: not needed
  for key in (keys.IMAGE, "depth", "maps", keys.LABEL):
    np.testing.assert_allclose(a[key].numpy(), b[key].numpy(), rtol=1e-4, atol=1e-4)
  assert abs(float(np.mean(b["depth"].numpy()))) < 1e-4
