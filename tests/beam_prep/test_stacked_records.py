"""Records that hold an object once with its click variants stacked (format 3)."""

import zlib

import numpy as np
import pytest
import tensorflow as tf

from beam_prep import keys
from beam_prep.config import PrepConfig
from beam_prep.features import FeatureError, FeatureTable
from beam_prep.kernel import Kernel
from beam_prep.ops import registry
from beam_prep.preprocessing import decode_feature
from beam_prep.record_codec import RecordCodec
from tests.helpers import png, scene
from train.fit.data import Decoder

SIZE, VARIANTS = 48, 3


def _kernel(tmp_path, **kw):
  config = PrepConfig.from_dict(
    dict(
      input=str(tmp_path),
      output="unused",
      layout="folders",
      image_size=SIZE,
      variants=VARIANTS,
      **kw,
    )
  )
  registry.import_ops_modules(config.ops_module)
  table = config.features()
  return Kernel(config.layout, config.stages, config.ops_module, table), table


def _pointer(tmp_path, boxes=((4, 4, 30, 30),)):
  for sub in ("images", "masks"):
    (tmp_path / sub).mkdir(exist_ok=True)
  img, inst = scene(SIZE, boxes)
  (tmp_path / "images" / "a.png").write_bytes(png(img))
  (tmp_path / "masks" / "a.png").write_bytes(png(inst, "L"))
  return {
    "image_id": "a",
    "source": str(tmp_path / "images" / "a.png"),
    "mask_source": str(tmp_path / "masks" / "a.png"),
  }


def test_a_record_holds_the_object_once_and_every_variant(tmp_path):
  kernel, table = _kernel(tmp_path)
  # What differs per variant is derived from the stages, not listed.
  assert {e.key for e in table.stacked} == {
    keys.POSITIVE_CLICKS,
    keys.NEGATIVE_CLICKS,
    keys.NEGATIVE_STRATEGY,
    keys.VARIANT,
    keys.DISTANCE_MAPS,
  }
  assert table.to_dict()["variants"] == VARIANTS
  [record] = kernel.process(_pointer(tmp_path)).records
  f = tf.train.Example.FromString(record).features.feature
  assert len(f[keys.IMAGE].bytes_list.value) == len(f[keys.MASK].bytes_list.value) == 1
  assert len(f[keys.DISTANCE_MAPS].bytes_list.value) == VARIANTS
  examples = RecordCodec(table).decode_examples(record)
  assert [int(ex[keys.VARIANT]) for ex in examples] == list(range(VARIANTS))
  assert all(ex[keys.IMAGE] is examples[0][keys.IMAGE] for ex in examples)
  # The same examples as the layout before: one example-view record each.
  view = table.example_view
  for ex in examples:
    back = RecordCodec(view).decode_numpy(RecordCodec(table).encode(ex))
    for k, v in ex.items():
      np.testing.assert_array_equal(back[k], v)
  assert len(record) < 0.5 * sum(len(RecordCodec(table).encode(ex)) for ex in examples)


def test_counts_add_up_when_a_variant_fails(tmp_path):
  kernel, table = _kernel(tmp_path, ops="drop_variant(1)", ops_module="tests.fixtures.variant_ops")
  result = kernel.process(_pointer(tmp_path))
  c = result.tally.counts
  assert (c["examples_made"], c["example_errors"]) == (VARIANTS, 1)
  assert (c["examples/train"], c["records/train"]) == (VARIANTS - 1, 1)
  assert [e["reason"] for e in result.errors] == ["dropped_variant"]
  assert result.tally.accounting(VARIANTS, splits_objects=True)["accounted"]
  [record] = result.records
  assert [int(ex[keys.VARIANT]) for ex in RecordCodec(table).decode_examples(record)] == [0, 2]


def test_the_reader_picks_each_variant_as_the_layout_before_gives_it(tmp_path):
  kernel, table = _kernel(tmp_path)
  [record] = kernel.process(_pointer(tmp_path)).records
  examples = RecordCodec(table).decode_examples(record)
  wanted = (
    table.keys("model_input")
    + table.keys("label")
    + [keys.POSITIVE_CLICKS, keys.NEGATIVE_CLICKS, keys.VARIANT]
  )
  # The layout before: a record per (object, variant), every array raw.
  before = Decoder(table.example_view, wanted).decode(
    tf.constant([RecordCodec(table).encode(ex) for ex in examples]), training=False
  )
  decoder = Decoder(table, wanted, seed=1)

  def variant_view(raw, i):
    return {
      k: tf.sparse.to_dense(v)[i].numpy() if isinstance(v, tf.SparseTensor) else v[i].numpy()
      for k, v in raw.items()
    }

  want = [variant_view(before, i) for i in range(VARIANTS)]
  every = decoder.decode(tf.constant([record]), training=False)
  for i in range(VARIANTS):  # Evaluation: every variant, in order, byte for byte.
    got = variant_view(every, i)
    assert sorted(got) == sorted(want[i])
    for k in got:
      np.testing.assert_array_equal(got[k], want[i][k], err_msg=k)
  seen = []
  for _ in range(4):  # Training: a variant picked per record and step.
    picked = decoder.decode(tf.constant([record] * 16), training=True)
    for b in range(16):
      got = variant_view(picked, b)
      i = int(got[keys.VARIANT])
      seen.append(i)
      for k in got:
        np.testing.assert_array_equal(got[k], want[i][k], err_msg=k)
  assert sorted(set(seen)) == list(range(VARIANTS))
  assert len(set(tuple(seen[i : i + 16]) for i in range(0, 64, 16))) > 1  # Steps differ.


def _trainer_values(table, record):
  """Every feature of every variant of a record as the trainer's Decoder
  gives it (example view), in numpy: per-pixel ones decoded by the graph."""
  raw = Decoder(table).decode(tf.constant([record]), training=False)
  out = {}
  for e in table:
    v = raw[e.key]
    if e.feature.per_pixel:
      out[e.key] = decode_feature(v, e, table.image_size).numpy()
    elif isinstance(v, tf.SparseTensor):
      rows = tf.RaggedTensor.from_sparse(v)
      out[e.key] = [
        rows[i].numpy().reshape([-1, *e.feature.shape[1:]]) for i in range(rows.shape[0])
      ]
    else:
      out[e.key] = v.numpy()
  return out


def test_the_numpy_reader_gives_what_the_trainer_reads(tmp_path):
  kernel, table = _kernel(tmp_path)
  # Stacked and not, raw and compressed per-pixel features, numbers and strings.
  assert {(e.stacked, e.feature.encoding) for e in table if e.feature.per_pixel} == {
    (False, "raw"),
    (False, "zlib"),
    (True, "zlib"),
  }
  [record] = kernel.process(_pointer(tmp_path)).records
  [other] = kernel.process(_pointer(tmp_path, boxes=((10, 12, 40, 44),))).records
  examples = RecordCodec(table).decode_examples(record)
  trainer = _trainer_values(table, record)
  assert len(examples) == VARIANTS
  for i, ex in enumerate(examples):
    assert list(ex) == [e.key for e in table if not e.stacked] + [e.key for e in table.stacked]
    for e in table:
      want = trainer[e.key][i]
      if e.feature.dtype == "string":
        assert ex[e.key] == want.decode(), e.key
        continue
      assert isinstance(ex[e.key], np.ndarray), e.key
      assert ex[e.key].dtype == (
        e.feature.stored_dtype if e.feature.per_pixel else np.dtype(e.feature.dtype)
      ), e.key
      assert ex[e.key].shape == tuple(
        e.shape(table.image_size) if e.feature.per_pixel else np.shape(want)
      ), e.key
      np.testing.assert_array_equal(ex[e.key], want, err_msg=e.key)
  # Many records in one call: the same examples as one call each.
  for batch, single in zip(
    RecordCodec(table).decode_records([record, other]),
    [examples, RecordCodec(table).decode_examples(other)],
  ):
    assert len(batch) == len(single)
    for a, b in zip(batch, single):
      assert list(a) == list(b)
      for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_a_record_that_does_not_match_its_declarations_is_refused(tmp_path):
  kernel, table = _kernel(tmp_path)
  [record] = kernel.process(_pointer(tmp_path)).records

  def changed(change):
    example = tf.train.Example.FromString(record)
    change(example.features.feature)
    return example.SerializeToString()

  def short_map(f):
    f[keys.DISTANCE_MAPS].bytes_list.value[1] = zlib.compress(b"\0" * 10)

  with pytest.raises(
    FeatureError,
    match=r"feature 'distance_maps' holds 10 bytes, but "
    r"features.json declares \[48, 48, 2\] uint8 \(4608 bytes\) at 48x48",
  ):
    RecordCodec(table).decode_examples(changed(short_map))

  def long_image(f):
    f[keys.IMAGE].bytes_list.value[0] += b"\0"

  with pytest.raises(FeatureError, match=r"feature 'image' holds 6913 bytes"):
    RecordCodec(table).decode_examples(changed(long_image))

  def no_mask(f):
    del f[keys.MASK]

  with pytest.raises(ValueError, match=r"the record has no feature 'mask' \(declared by op "):
    RecordCodec(table).decode_examples(changed(no_mask))


def test_classification_records_are_one_example_each(tmp_path):
  (tmp_path / "cat").mkdir()
  img, _ = scene(SIZE)
  (tmp_path / "cat" / "x.png").write_bytes(png(img))
  config = PrepConfig(
    input=str(tmp_path), output="unused", task="classification", layout="classes", image_size=32
  )
  table = config.features()
  assert not table.stacked
  kernel = Kernel(config.layout, config.stages, "", table)
  [record] = kernel.process(
    {"image_id": "cat/x", "source": str(tmp_path / "cat" / "x.png"), "label": "cat"}
  ).records
  # The record is the example view itself, as before format 3.
  assert record == RecordCodec(table).encode(RecordCodec(table).decode_numpy(record))
  parsed = tf.io.parse_single_example(record, table.raw_feature_spec())
  assert parsed[keys.LABEL].numpy() == b"cat"


def test_an_older_features_json_is_refused_with_the_reason(tmp_path):
  _, table = _kernel(tmp_path)
  old = dict(table.to_dict(), format=2)
  with pytest.raises(
    ValueError,
    match="format 2.*since format 3 a record holds an object once "
    "with all its click variants stacked.*run beam-prep again",
  ):
    FeatureTable.from_dict(old)
  assert FeatureTable.from_dict(table.to_dict()).to_json() == table.to_json()
