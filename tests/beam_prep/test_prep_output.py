"""PrepOutput on real pipeline outputs: what it opens, a split as numpy, the
refusals of an incomplete folder, and the data path a model dir recorded."""

import glob
import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from beam_prep import keys
from beam_prep.features import FeatureTable
from beam_prep.prep_output import PrepOutput, RecordsError
from beam_prep.record_codec import RecordCodec


def test_opens_the_table_transform_shards_and_manifest(prep_dir, tmp_path, monkeypatch):
  prep = PrepOutput(prep_dir)
  assert prep.table.to_json() == FeatureTable.load(prep_dir).to_json()
  assert prep.tft_output.transform_features_layer() is not None
  assert set(prep.tft_output.raw_feature_spec()) == set(prep.table.raw_feature_spec())
  for split in (keys.TRAIN_SPLIT, keys.EVAL_SPLIT):
    want = sorted(glob.glob(os.path.join(prep_dir, keys.RECORDS_DIR, f"{split}-*")))
    assert prep.files(split) == want and len(want) > 1  # several shards (--target-shard-mb)
  assert prep.files("*") == sorted(prep.files(keys.TRAIN_SPLIT) + prep.files(keys.EVAL_SPLIT))
  with open(os.path.join(prep_dir, keys.MANIFEST_FILE)) as f:
    assert prep.manifest == json.load(f)
  prep.check_complete()
  # A relative path is made absolute: what records it does not depend on the folder.
  monkeypatch.chdir(os.path.dirname(prep_dir))
  assert PrepOutput(os.path.basename(prep_dir) + "/").path == prep_dir
  assert PrepOutput("gs://bucket/prep/").path == "gs://bucket/prep"
  assert PrepOutput(str(tmp_path / "nowhere")).manifest == {}


def test_read_numpy_decodes_a_split_in_file_order(prep_dir):
  prep = PrepOutput(prep_dir)
  written = prep.manifest["counts"]["examples_written"]
  records = list(prep.read_numpy(keys.EVAL_SPLIT))
  assert len(records) == written[keys.EVAL_SPLIT] > 0
  raw = [r.numpy() for f in prep.files(keys.EVAL_SPLIT) for r in tf.data.TFRecordDataset(f)]
  examples = [
    ex for serialized in raw for ex in RecordCodec(prep.table).decode_examples(serialized)
  ]
  assert len(examples) == len(records) > len(raw)  # Records stack an object's variants.
  for got, want in zip(records, examples):
    assert sorted(got) == sorted(want)
    for k, v in want.items():
      np.testing.assert_array_equal(got[k], v)
  h, w = prep.table.image_size
  assert records[0][keys.IMAGE].shape == (h, w, 3) and records[0][keys.IMAGE].dtype == np.uint8
  some = list(prep.read_numpy(keys.TRAIN_SPLIT, [keys.IMAGE_ID, keys.MASK], limit=3))
  assert len(some) == 3 and all(sorted(r) == [keys.IMAGE_ID, keys.MASK] for r in some)
  assert list(PrepOutput(prep_dir).read_numpy("nosuchsplit")) == []


def test_shards_with_records_and_a_shard_from_another_run(prep_dir, tmp_path):
  prep = PrepOutput(prep_dir)
  files = prep.files("*")
  holding = prep.check_shards(files)
  scan = prep.scan_shards(files)
  assert holding == [p for p in files if scan[p]["records"] > 0]
  assert sum(v["records"] for v in scan.values()) == sum(
    prep.manifest["counts"]["records_written"].values()
  )
  assert prep.has_records(keys.TRAIN_SPLIT) and prep.has_records(keys.EVAL_SPLIT)
  assert not prep.has_records("nosuchsplit")
  # A shard of other records (here: with no per-pixel feature) is named.
  other = str(tmp_path / "train-00000-of-00001.tfrecord")
  with tf.io.TFRecordWriter(other) as w:
    w.write(tf.train.Example().SerializeToString())
  with pytest.raises(RecordsError, match="does not match the features.*another run"):
    prep.check_shards([other])


def test_check_complete_names_what_is_wrong(prep_dir, tmp_path):
  missing = str(tmp_path / "missing")
  with pytest.raises(RecordsError, match="does not exist"):
    PrepOutput(missing).check_complete()
  records = os.path.join(prep_dir, keys.RECORDS_DIR)
  with pytest.raises(RecordsError) as e:
    PrepOutput(records).check_complete()
  assert f"{records} is the records/ folder" in str(e.value)
  assert f"--data {prep_dir}" in str(e.value) and "still running" not in str(e.value)
  partial = str(tmp_path / "partial")
  shutil.copytree(prep_dir, partial)
  os.remove(os.path.join(partial, keys.SUCCESS_FILE))
  with pytest.raises(RecordsError, match="_SUCCESS is missing.*still running, failed"):
    PrepOutput(partial).check_complete()


def _model_dir(root, config):
  os.makedirs(root)
  with open(os.path.join(root, "config.json"), "w") as f:
    json.dump(config, f)
  return str(root)


def test_the_data_a_model_dir_recorded_is_found_from_any_folder(prep_dir, tmp_path, monkeypatch):
  work = tmp_path / "work"
  shutil.copytree(prep_dir, work / "out" / "prep")
  # Written by fit today: absolute.
  model = _model_dir(
    work / "out" / "model", {"data": str(work / "out" / "prep"), "model_dir": "out/model"}
  )
  monkeypatch.chdir(tmp_path)
  assert PrepOutput.of_model(model).path == str(work / "out" / "prep")
  # Written by an older fit run in `work` as `--data out/prep --model-dir out/model`.
  old = _model_dir(work / "out" / "old", {"data": "out/prep", "model_dir": "./out/old"})
  assert PrepOutput.of_model(old).path == str(work / "out" / "prep")
  assert PrepOutput.of_model(os.path.relpath(old)).path == str(work / "out" / "prep")
  # A model dir moved since (its recorded name no longer ends its path): its
  # data is looked for from the model dir.
  moved = _model_dir(work / "out" / "m", {"data": "../prep", "model_dir": "runs/m1"})
  assert PrepOutput.of_model(moved).path == str(work / "out" / "prep")
  gone = _model_dir(work / "gone", {"data": "nothing/here", "model_dir": "gone"})
  with pytest.raises(FileNotFoundError, match="was trained on nothing/here.*--data"):
    PrepOutput.of_model(gone)
  with pytest.raises(FileNotFoundError, match="not a beam-train fit model dir"):
    PrepOutput.of_model(str(tmp_path))
