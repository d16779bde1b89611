"""TFLite and ONNX exports: written by beam-train export, equal to the
SavedModel at any image size and click count, run by beam-train predict."""

import os

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from beam_prep import keys
from beam_prep.prep_output import PrepOutput
from train import cli
from train.export import portable
from train.export import signatures as sig
from train.export.portable_model import PortableModel, open_model
from train.export.served import InvalidInput, ServedModel
from train.export.serving_inputs import transform_tables


def _cli(argv) -> int:
  with pytest.raises(SystemExit) as e:
    cli.main(argv)
  return e.value.code


@pytest.fixture
def exported(portable_export):
  return portable_export


def _requests():
  """Requests of several image sizes and click counts, up to 24 clicks."""
  rng = np.random.default_rng(5)
  for h, w, n_pos, n_neg in [(64, 64, 1, 0), (37, 121, 2, 3), (150, 90, 12, 12), (301, 203, 1, 5)]:
    image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    image[h // 4 : h // 2, w // 4 : w // 2] = (220, 40, 40)
    pos = np.stack([rng.integers(w // 4, w // 2, n_pos), rng.integers(h // 4, h // 2, n_pos)], 1)
    neg = np.stack([rng.integers(0, w, n_neg), rng.integers(0, h, n_neg)], 1)
    yield image, pos.astype(np.int32), neg.astype(np.int32).reshape(-1, 2)


def test_export_writes_each_format_and_no_saved_model_unless_asked(exported):
  names = [portable.file_name(s, f) for f in ("tflite", "onnx") for s in portable.SIGNATURES]
  assert sorted(os.listdir(exported)) == sorted(names)
  iterative = PortableModel(os.path.join(exported, "serve_iterative.onnx"))
  assert set(iterative.inputs) == {*sig.CLICK_INPUTS, sig.PREVIOUS_MASK}
  assert set(PortableModel(os.path.join(exported, "serving_default.tflite")).inputs) == set(
    sig.CLICK_INPUTS
  )


@pytest.mark.parametrize("fmt", ["tflite", "onnx"])
def test_portable_files_answer_as_the_saved_model(exported, trained_served, fmt):
  served = trained_served  # The same model's SavedModel, written by fit.
  first = PortableModel(os.path.join(exported, portable.file_name(sig.SERVING_DEFAULT, fmt)))
  again = PortableModel(os.path.join(exported, portable.file_name(sig.SERVE_ITERATIVE, fmt)))
  for image, pos, neg in _requests():
    want = served.segment(image, pos, neg)
    got = first.segment(image, pos, neg)
    assert got[sig.MASK].dtype == np.uint8 and got[sig.PROBABILITIES].dtype == np.float32
    assert portable.at_parity(want, got), portable.parity(want, got)
    np.testing.assert_allclose(got[sig.PROBABILITIES], want[sig.PROBABILITIES], atol=2e-3)
    # The next click, with the previous mask (a crop around it, not the whole image).
    previous = want[sig.MASK]
    if previous.any():
      want = served.segment(image, pos, neg, previous)
      got = again.segment(image, pos, neg, previous)
      assert portable.at_parity(want, got), portable.parity(want, got)
      np.testing.assert_allclose(got[sig.PROBABILITIES], want[sig.PROBABILITIES], atol=2e-3)


def test_portable_model_refuses_what_the_saved_model_refuses(exported, tmp_path):
  model = PortableModel(os.path.join(exported, "serving_default.onnx"))
  image = np.zeros((20, 30, 3), np.uint8)
  with pytest.raises(InvalidInput, match="positive_clicks: at least one positive click"):
    model.segment(image, [], [[1, 1]])
  with pytest.raises(InvalidInput, match="image: the image is empty"):
    model.segment(np.zeros((0, 5, 3), np.uint8), [[0, 0]], [])
  with pytest.raises(InvalidInput, match="box: .* takes no box"):
    model.segment(image, [[2, 2]], [], box=(0, 0, 5, 5))
  with pytest.raises(InvalidInput, match="previous_mask: .* takes none"):
    model.segment(image, [[2, 2]], [], np.ones((20, 30), np.uint8))
  iterative = PortableModel(os.path.join(exported, "serve_iterative.tflite"))
  with pytest.raises(InvalidInput, match="previous_mask: must have the image's height and width"):
    iterative.segment(image, [[2, 2]], [], np.ones((5, 5), np.uint8))
  broken = str(tmp_path / "broken.tflite")  # Not beside the shared export, which others list.
  with open(broken, "wb") as f:
    f.write(b"not a flatbuffer")
  with pytest.raises(ValueError, match="cannot load .*broken.tflite"):
    PortableModel(broken)
  cut = str(tmp_path / "cut.onnx")  # An ONNX file cut short: onnxruntime's own error.
  with open(os.path.join(exported, "serving_default.onnx"), "rb") as f, open(cut, "wb") as g:
    g.write(f.read()[:500])
  with pytest.raises(ValueError, match="cannot load .*cut.onnx: InvalidProtobuf"):
    PortableModel(cut)


def test_predict_runs_a_portable_file(exported, trained, tmp_path):
  image = next(_requests())[0]
  Image.fromarray(image).save(tmp_path / "in.png")
  masks = {}
  for model in ("serving_default.tflite", "serving_default.onnx", ""):
    out = tmp_path / f"mask_{model or 'savedmodel'}.png"
    argv = ["predict", "--model", os.path.join(exported, model) if model else trained, "--image"]
    argv += [str(tmp_path / "in.png"), "--positive", "24,24", "--output", str(out)]
    assert _cli(argv) == 0
    masks[model] = np.asarray(Image.open(out))
  assert masks[""].any()
  for model, mask in masks.items():
    assert np.mean(mask == masks[""]) >= 0.99, model  # Few pixels so near the threshold.
  assert isinstance(open_model(trained), ServedModel)


def test_format_flags(tmp_path, caplog, capsys):
  assert portable.parse_formats([]) == ("savedmodel",)
  assert portable.parse_formats(["onnx,tflite", "ONNX"]) == ("tflite", "onnx")
  assert portable.parse_formats(["all"]) == portable.FORMATS
  with pytest.raises(ValueError, match="--format keras: unknown"):
    portable.parse_formats(["keras"])
  argv = ["export", "--data", str(tmp_path), "--model-dir", str(tmp_path), "--format", "pb"]
  assert _cli(argv) == 2  # Refused, as any bad option is.
  # The command's logger prints to stdout once a command in this process has
  # set it up (`beam_prep.console.quiet`), else the record reaches the root.
  shown = caplog.text + capsys.readouterr().out
  assert "--format pb: unknown; one of savedmodel, tflite, onnx or all" in shown


def test_a_transform_that_is_no_table_of_pixel_values_is_not_portable(prep_dir):
  prep = PrepOutput(prep_dir)
  layer = prep.tft_output.transform_features_layer()
  tables, why = transform_tables(prep.table, layer)
  assert why == "" and set(tables) == set(prep.table.keys("model_input"))
  assert tables[keys.IMAGE].shape == (256 * 3,)

  def per_image(raw):  # Each image less its own mean: not a function of a pixel's value.
    out = dict(layer(raw))
    image = out[keys.IMAGE]
    out[keys.IMAGE] = image - tf.reduce_mean(image, axis=[1, 2, 3], keepdims=True)
    return out

  tables, why = transform_tables(prep.table, per_image)
  assert tables is None
  assert why == "the transform does not map each pixel of model input 'image' by its own value"


def test_an_onnx_optimizer_failing_is_run_again_tf2onnx_s_own_way(monkeypatch):
  """The conversion without tf2onnx's copies before each optimizer: an
  optimizer that fails makes it convert again with them, and the model
  still answers (the failing optimizer skipped); the environment is left as it was."""
  import onnxruntime  # pylint: disable=g-import-not-at-top
  from tf2onnx import constants, optimizer  # pylint: disable=g-import-not-at-top
  from tf2onnx.optimizer.optimizer_base import GraphOptimizerBase  # pylint: disable=g-import-not-at-top

  ran = []

  class Failing(GraphOptimizerBase):
    def _optimize(self, graph):
      ran.append(True)
      raise RuntimeError("an optimizer's own bug")

  monkeypatch.setitem(optimizer._optimizers, "failing", Failing)  # pylint: disable=protected-access
  monkeypatch.delenv(constants.ENV_TF2ONNX_CATCH_ERRORS, raising=False)
  f = tf.function(lambda x: x * 2.0 + 1.0, input_signature=[tf.TensorSpec([None], tf.float32)])
  session = onnxruntime.InferenceSession(portable.to_onnx(f, "f"))
  (out,) = session.run(None, {session.get_inputs()[0].name: np.arange(3, dtype=np.float32)})
  np.testing.assert_array_equal(out, [1.0, 3.0, 5.0])
  assert len(ran) >= 2  # Failed the fast way, then again where tf2onnx keeps the graph.
  assert constants.ENV_TF2ONNX_CATCH_ERRORS not in os.environ
