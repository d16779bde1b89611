"""Feature declarations and the table a chain's declarations make."""

import json

import numpy as np
import pytest
import tensorflow as tf

from beam_prep import keys
from beam_prep.config import PrepConfig
from beam_prep.features import Entry, Feature, FeatureError, FeatureTable
from beam_prep.ops import registry
from beam_prep.record_codec import RecordCodec


def test_feature_validation_says_what_is_wrong():
  with pytest.raises(FeatureError, match="either channels"):
    Feature("uint8")
  with pytest.raises(FeatureError, match="role must be"):
    Feature("uint8", channels=1, role="input")
  with pytest.raises(FeatureError, match="per-pixel feature's dtype"):
    Feature("string", channels=1)
  with pytest.raises(FeatureError, match="normalize"):
    Feature("uint8", channels=1, normalize="minmax")
  with pytest.raises(FeatureError, match="only model inputs"):
    Feature("uint8", channels=1, role="label", normalize=255)
  assert Feature("uint8", channels=2, normalize=255).normalize == "scale(255.0)"
  assert Feature("uint8", channels=2, normalize=255).scale == 255.0
  assert Feature("int64", shape=(-1, 2), role="metadata").shape == (None, 2)


def test_default_chain_table_in_declared_order():
  config = PrepConfig.from_dict(dict(input="x", output="y", image_size=32, click_encoding="both"))
  table = config.features()
  assert table.keys("model_input") == [keys.IMAGE, keys.DISTANCE_MAPS, keys.CLICK_DISKS]
  assert table.input_channels == 7
  assert table.keys("label") == [keys.MASK]
  assert table.keys()[0] == keys.IMAGE_ID and table[keys.IMAGE_ID].op == "read"
  assert table[keys.DISTANCE_MAPS].op == "distance_maps"
  assert table[keys.IMAGE].shape(table.image_size) == [32, 32, 3]
  d = json.loads(table.to_json())
  assert {"features", "chain", "ops_module"} <= set(d)
  assert [f["key"] for f in d["features"]] == table.keys()
  for f in d["features"]:
    assert {"key", "dtype", "shape", "role", "normalize"} <= set(f)
  assert FeatureTable.from_dict(d).to_dict() == d
  # An output of an older format (its resize stretched images) is refused, saying why.
  with pytest.raises(ValueError, match="aspect ratio.*run beam-prep again"):
    FeatureTable.from_dict({k: v for k, v in d.items() if k != "format"})
  classification = PrepConfig(input="x", output="y", task="classification").features()
  assert classification.keys("model_input") == [keys.IMAGE]
  assert classification.keys("label") == [keys.LABEL]


def test_a_later_declaration_of_a_key_wins_but_keeps_the_position():
  registry.import_ops_modules("tests.fixtures.user_ops")
  config = PrepConfig(
    input="x", output="y", ops="cap_distance(8)|brighten", ops_module="tests.fixtures.user_ops"
  )
  table = config.features()
  assert table.keys("model_input") == [keys.IMAGE, keys.DISTANCE_MAPS]
  assert table[keys.DISTANCE_MAPS].op == "cap_distance" and table[keys.IMAGE].op == "brighten"
  assert table.ops_module == "tests.fixtures.user_ops"


def _table():
  return FeatureTable(
    [
      Entry("id", Feature("string", shape=(), role="metadata"), "read"),
      Entry("img", Feature("uint8", channels=3), "decode"),
      Entry("depth", Feature("float32", channels=1, normalize="standardize"), "depth_op"),
      Entry("pts", Feature("int64", shape=(None, 2), role="metadata"), "clicks"),
      Entry("vec", Feature("float32", shape=(3,), role="metadata"), "vec_op"),
    ],
    (4, 5),
    "segmentation",
  )


def _example():
  rng = np.random.default_rng(0)
  return {
    "id": "a",
    "img": rng.integers(0, 255, (4, 5, 3), dtype=np.uint8),
    "depth": rng.normal(size=(4, 5)).astype(np.float32),
    "pts": np.array([[1, 2], [3, 0]]),
    "vec": [0.5, 1.5, 2.5],
    "extra": "ignored",
  }


def test_encode_decode_round_trip_and_the_raw_spec():
  table, ex = _table(), _example()
  data = RecordCodec(table).encode(ex)
  back = RecordCodec(table).decode_numpy(data)
  assert back["id"] == "a"
  np.testing.assert_array_equal(back["img"], ex["img"])
  np.testing.assert_array_equal(back["depth"][..., 0], ex["depth"])
  np.testing.assert_array_equal(back["pts"], ex["pts"])
  np.testing.assert_allclose(back["vec"], ex["vec"])
  parsed = tf.io.parse_single_example(data, table.raw_feature_spec())
  assert sorted(parsed) == ["depth", "id", "img", "pts", "vec"]
  assert isinstance(parsed["pts"], tf.SparseTensor) and parsed["vec"].shape == (3,)
  assert "extra" not in tf.train.Example.FromString(data).features.feature


@pytest.mark.parametrize(
  "change,message",
  [
    (lambda ex: ex.pop("img"), "op 'decode' declares feature 'img' but the example has no"),
    (
      lambda ex: ex.update(img=ex["img"].astype(np.float32)),
      "op 'decode'.*declared uint8.*float32",
    ),
    (lambda ex: ex.update(img=ex["img"][:3]), r"op 'decode'.*declared \[4, 5, 3\].*\[3, 5, 3\]"),
    (lambda ex: ex.update(pts=np.zeros((2, 3), int)), "op 'clicks'.*shape"),
    (lambda ex: ex.update(vec=[1.0]), "op 'vec_op'.*shape"),
    (lambda ex: ex.update(id=3), "op 'read'.*string feature 'id'"),
  ],
)
def test_encoder_refuses_a_mismatch_naming_the_op_and_key(change, message):
  ex = _example()
  change(ex)
  with pytest.raises(FeatureError, match=message):
    RecordCodec(_table()).encode(ex)


def test_encoding_is_deterministic_whatever_the_key_order():
  table, ex = _table(), _example()
  reordered = dict(reversed(list(ex.items())))
  assert RecordCodec(table).encode(ex) == RecordCodec(table).encode(reordered)


def test_the_records_size_is_the_one_the_chains_geometric_op_makes():
  """features.json's image size is read from the chain's op that sets it (its
  serving side), not declared beside it: a user op that resizes again wins."""
  chain = registry.parse_chain("decode|resize(40, width=24)|split_objects")
  assert registry.image_size(chain) == (40, 24)
  assert registry.image_size(registry.parse_chain("decode|split_objects")) is None
  config = PrepConfig.from_dict(
    dict(input="x", output="y", image_size=32, crop="none", task="segmentation")
  )
  assert config.features().image_size == (32, 32)
  crop = PrepConfig(input="x", output="y", image_size=48)
  assert crop.features().image_size == (48, 48)
  again = PrepConfig(input="x", output="y", image_size=48, ops="resize(20)")
  assert again.features().image_size == (20, 20)


def test_a_features_json_cut_short_is_named(tmp_path):
  table = PrepConfig(input="i", output="o").features()
  (tmp_path / "features.json").write_text(table.to_json()[:200])  # A copy cut short.
  with pytest.raises(ValueError, match=r"features\.json is not JSON: "):
    FeatureTable.load(str(tmp_path))
  (tmp_path / "features.json").write_text(table.to_json())
  assert FeatureTable.load(str(tmp_path)).to_json() == table.to_json()
