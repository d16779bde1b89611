"""Bring your own model: a user's model module through `beam-train fit`, the
records in one's own Keras code (`train.dataset`), `beam-train export` of a
model trained elsewhere, and a TFX-style run_fn. Real records, real training,
real SavedModels."""

import json
import os
import shutil
import sys
import types

import numpy as np
import pytest
import tensorflow as tf

from beam_prep import keys
from beam_prep.features import FeatureTable
from tests.helpers import ROOT, assert_serving_parity
from beam_prep.prep_output import PrepOutput
from beam_prep.record_codec import RecordCodec

FIXTURES = os.path.join(ROOT, "tests", "fixtures")


def _cli(argv):
  from train import cli  # pylint: disable=g-import-not-at-top

  with pytest.raises(SystemExit) as e:
    cli.main(argv)
  return e.value.code


def _readme_holds(fixture: str) -> None:
  readme = open(os.path.join(ROOT, "docs", "training.md")).read()
  assert "```python\n" + open(os.path.join(FIXTURES, fixture)).read() + "```" in readme


@pytest.fixture()
def user_module_dir(tmp_path, monkeypatch):
  """The user's model module in a folder of its own (not a package, not on sys.path)."""
  folder = tmp_path / "my_project"
  folder.mkdir()
  shutil.copy(os.path.join(FIXTURES, "user_models.py"), folder / "my_models.py")
  monkeypatch.chdir(folder)
  yield str(folder)
  sys.modules.pop("my_models", None)


def test_user_model_module_trains_evaluates_exports_and_predicts(
  prep_dir, user_module_dir, tmp_path, monkeypatch, capsys
):
  model_dir = str(tmp_path / "model")
  assert (
    _cli(
      [
        "fit",
        "--data",
        prep_dir,
        "--model-dir",
        model_dir,
        "--model-module",
        "my_models",
        "--model",
        "tiny_unet",
        "--model-args",
        '{"filters": 4}',
        "--steps",
        "6",
        "--batch-size",
        "4",
        "--histogram-every",
        "0",
        "--noc-clicks",
        "2",
        "--noc-objects",
        "3",
        "--no-export",  # Exported below, from another folder.
      ]
    )
    == 0
  )
  assert "NoC@85" in capsys.readouterr().out  # fit's own NoC, against the baseline
  metrics = json.load(open(os.path.join(model_dir, "metrics.json")))
  assert metrics["step_traces"] == 1 and metrics["eval"]["examples"] > 0
  assert "mean_iou" in metrics["eval"]
  assert metrics["noc"]["max_clicks"] == 2 and "noc@85" in metrics["noc"]["baseline"]
  record = json.load(open(os.path.join(model_dir, "model.json")))
  assert record["name"] == "tiny_unet" and record["model_module"] == "my_models"
  assert record["model_args"] == {"filters": 4}
  assert record["input_channels"] == FeatureTable.load(prep_dir).input_channels
  assert record["module_files"]["my_models"] == os.path.join(user_module_dir, "my_models.py")

  # Elsewhere, with the module neither imported nor importable from the
  # current directory: the model dir says where it is.
  monkeypatch.chdir(tmp_path)
  sys.modules.pop("my_models", None)
  monkeypatch.setattr(sys, "path", [p for p in sys.path if p != user_module_dir])
  from train import models  # pylint: disable=g-import-not-at-top

  rebuilt = models.rebuild(model_dir)
  assert rebuilt.get_layer("enc").filters == 4  # --model-args reached the factory
  assert _cli(["export", "--data", prep_dir, "--model-dir", model_dir]) == 0
  assert_serving_parity(prep_dir, model_dir, n=3)
  assert (
    _cli(
      ["evaluate", "--model", model_dir, "--max-clicks", "3", "--max-objects", "3"]
      + ["--output", str(tmp_path / "noc")]
    )
    == 0
  )
  assert json.load(open(tmp_path / "noc" / "noc.json"))["model"]["max_clicks"] == 3
  assert metrics["noc"]["model"]["noc@85"] >= 1  # fit's own NoC ran on the user's model too

  # predict needs the SavedModel only: not the module, not the prep output.
  shutil.rmtree(user_module_dir)
  sys.modules.pop("my_models", None)
  image = os.path.join(str(tmp_path), "photo.png")
  from PIL import Image  # pylint: disable=g-import-not-at-top

  Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 56, 3), np.uint8)).save(image)
  out = str(tmp_path / "mask.png")
  assert (
    _cli(
      ["predict", "--model", model_dir, "--image", image, "--positive", "20,20", "--output", out]
    )
    == 0
  )
  assert Image.open(out).size == (56, 40)


def test_user_model_mistakes_are_refused_before_training(
  prep_dir, user_module_dir, tmp_path, capsys
):
  base = [
    "fit",
    "--data",
    prep_dir,
    "--model-dir",
    str(tmp_path / "m"),
    "--steps",
    "2",
    "--batch-size",
    "2",
    "--no-export",
  ]
  assert _cli(base + ["--model-module", "my_models", "--model", "three_channel_output"]) == 1
  out = capsys.readouterr().out
  assert "model 'three_channel_output' maps [1, 64, 64, " in out
  assert "needs mask logits [B, H, W, 1]" in out
  assert not os.path.exists(tmp_path / "m" / "checkpoints")
  assert _cli(base + ["--model-module", "my_models", "--model", "tiny_unt"]) == 1
  assert "unknown model 'tiny_unt'" in capsys.readouterr().out
  assert (
    _cli(
      base
      + ["--model-module", "my_models", "--model", "tiny_unet", "--model-args", '{"filtres": 4}']
    )
    == 1
  )
  assert "cannot be called with" in capsys.readouterr().out
  assert _cli(base + ["--model-args", "{filters: 4}"]) == 2
  assert "--model-args is not JSON" in capsys.readouterr().out
  assert _cli(base + ["--model-module", "no_such_models"]) == 1
  assert "model module 'no_such_models' not found" in capsys.readouterr().out


def test_dataset_gives_the_trainers_tensors_in_keras_form(prep_dir):
  from train import dataset  # pylint: disable=g-import-not-at-top
  from train.fit.data import InputReader  # pylint: disable=g-import-not-at-top
  from train.tasks import make_task  # pylint: disable=g-import-not-at-top

  prep = PrepOutput(prep_dir)
  table = prep.table
  # Eval: one pass in file order, so it lines up with the trainer's reader.
  inputs, label, weight = next(iter(dataset(prep_dir, "eval", batch_size=4, training=False)))
  reader = InputReader(prep, make_task(table, prep.tft_output), 4)
  want_inputs, want_labels = next(iter(reader.model_batches(keys.EVAL_SPLIT, training=False)))
  np.testing.assert_array_equal(inputs.numpy(), want_inputs.numpy())
  np.testing.assert_array_equal(label.numpy(), want_labels[keys.LABEL].numpy())
  np.testing.assert_array_equal(weight.numpy(), want_labels[keys.LABEL_WEIGHT].numpy())
  h, w = table.image_size
  assert inputs.shape == (4, h, w, table.input_channels) and label.shape == (4, h, w, 1)
  # label_weight is 0 exactly where the record's mask is ignore.
  # (In the reader's order: its shards interleaved, each record's variants in turn.)
  records = [r.numpy() for r in reader.records(keys.EVAL_SPLIT, training=False).take(4)]
  masks = [ex[keys.MASK] for r in records for ex in RecordCodec(table).decode_examples(r)][:4]
  np.testing.assert_array_equal(weight.numpy() == 0, np.stack(masks) == keys.IGNORE)
  # Training batches repeat past the end of the split, always full.
  examples = manifest_examples(prep_dir)
  train_ds = dataset(prep_dir, batch_size=4)
  batches = list(train_ds.take(examples // 4 + 3))
  assert all(b[0].shape[0] == 4 for b in batches)
  raw = next(iter(dataset(prep_dir, "eval", batch_size=2, training=False, keras_form=False)))
  assert set(raw[1]) >= {keys.LABEL, keys.LABEL_WEIGHT, keys.POSITIVE_CLICKS}


def manifest_examples(prep_dir):
  return PrepOutput(prep_dir).manifest["counts"]["examples_written"]["train"]


def test_readme_user_script_trains_and_beam_train_export_serves_it(prep_dir, tmp_path):
  _readme_holds("train_my_model.py")
  import runpy  # pylint: disable=g-import-not-at-top

  model_file = str(tmp_path / "mine.keras")
  script = os.path.join(FIXTURES, "train_my_model.py")
  argv = sys.argv
  sys.argv = [script, prep_dir, model_file, "4"]  # python train_my_model.py PREP MODEL 4
  try:
    runpy.run_path(script, run_name="__main__")
  finally:
    sys.argv = argv
  assert os.path.exists(model_file)
  export_base = str(tmp_path / "serving")
  assert (
    _cli(["export", "--model-file", model_file, "--data", prep_dir, "--output", export_base]) == 0
  )
  import keras  # pylint: disable=g-import-not-at-top

  assert_serving_parity(
    prep_dir, export_base, n=3, model=keras.saving.load_model(model_file, compile=False)
  )


def test_export_refuses_a_model_that_does_not_fit_the_records(prep_dir, tmp_path, capsys):
  import keras  # pylint: disable=g-import-not-at-top

  channels = FeatureTable.load(prep_dir).input_channels
  inputs = keras.Input((None, None, channels + 1))
  wrong = str(tmp_path / "wrong.keras")
  keras.Model(inputs, keras.layers.Conv2D(1, 1)(inputs)).save(wrong)
  assert (
    _cli(["export", "--model-file", wrong, "--data", prep_dir, "--output", str(tmp_path / "s")])
    == 1
  )
  assert f"cannot take the records' input [B, 64, 64, {channels}]" in capsys.readouterr().out
  (tmp_path / "junk.keras").write_bytes(b"not a model")
  assert (
    _cli(
      [
        "export",
        "--model-file",
        str(tmp_path / "junk.keras"),
        "--data",
        prep_dir,
        "--output",
        str(tmp_path / "s"),
      ]
    )
    == 1
  )
  assert "cannot load the Keras model" in capsys.readouterr().out
  assert not os.path.exists(tmp_path / "s")


def test_tfx_style_run_fn_reads_the_records_and_exports(prep_dir, tmp_path):
  _readme_holds("tfx_run_fn.py")
  sys.path.insert(0, FIXTURES)
  try:
    import tfx_run_fn  # pylint: disable=g-import-not-at-top
  finally:
    sys.path.remove(FIXTURES)
  fn_args = types.SimpleNamespace(  # The fields of TFX's FnArgs that run_fn reads.
    transform_output=os.path.join(prep_dir, keys.TRANSFORM_DIR),
    train_files=PrepOutput(prep_dir).files(keys.TRAIN_SPLIT),
    train_steps=3,
    serving_model_dir=str(tmp_path / "serving"),
  )
  tfx_run_fn.run_fn(fn_args)
  from train.export.saved_model import latest_export  # pylint: disable=g-import-not-at-top

  serving = tf.saved_model.load(latest_export(fn_args.serving_model_dir))
  out = serving.signatures["serving_default"](
    image=tf.zeros([30, 40, 3], tf.uint8),
    positive_clicks=tf.constant([[5, 5]], tf.int32),
    negative_clicks=tf.zeros([0, 2], tf.int32),
  )
  assert out["mask"].shape == (30, 40)
