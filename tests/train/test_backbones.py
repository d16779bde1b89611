"""U-Net models on keras.applications backbones: build, pretrained-weight
transfer into the click-channel first convolution, train, export (offline:
`--backbone-weights none` and a local weights file)."""

import json
import os

import keras
import numpy as np
import pytest

from tests.helpers import assert_serving_parity
from train import models

BACKBONES = {
  "unet_mobilenetv2": ("MobileNetV2", "Conv1"),
  "unet_resnet50": ("ResNet50", "conv1_conv"),
}


def _weights_file(tmp_path, cls_name):
  """A 3-channel backbone's weights, as a user would save them."""
  source = getattr(keras.applications, cls_name)(
    input_shape=(None, None, 3), include_top=False, weights=None
  )
  path = str(tmp_path / f"{cls_name}.weights.h5")
  source.save_weights(path)
  return source, path


@pytest.mark.parametrize("name", sorted(BACKBONES))
def test_pretrained_weights_reach_every_layer_and_the_rgb_part_of_the_first_conv(name, tmp_path):
  cls_name, first_conv = BACKBONES[name]
  source, path = _weights_file(tmp_path, cls_name)
  model = models.build_model(name, 5, builtin={"width": 4, "backbone_weights": path})
  encoder = model.get_layer(name.replace("unet_", "") + "_encoder")
  kernel = encoder.get_layer(first_conv).get_weights()[0]
  want = source.get_layer(first_conv).get_weights()[0]
  np.testing.assert_array_equal(kernel[:, :, :3], want)
  assert kernel.shape[2] == 5 and not kernel[:, :, 3:].any()  # Click channels start at zero.
  deep = [layer for layer in source.layers if layer.get_weights()][-1]
  for a, b in zip(encoder.get_layer(deep.name).get_weights(), deep.get_weights()):
    np.testing.assert_array_equal(a, b)
  out = model(np.zeros((2, 64, 96, 5), np.float32))
  assert out.shape == (2, 64, 96, 1)
  random = models.build_model(name, 5, builtin={"width": 4, "backbone_weights": "none"})
  assert random.count_params() == model.count_params()
  # "none": the same layers, initialised at random, not from the file.
  drawn = random.get_layer(encoder.name).get_layer(first_conv).get_weights()[0]
  assert not np.array_equal(drawn[:, :, :3], want)


def test_a_bad_weights_file_names_the_file(tmp_path):
  with pytest.raises(ValueError, match=r"missing\.weights\.h5.*--backbone-weights none"):
    models.build_model(
      "unet_mobilenetv2", 5, builtin={"backbone_weights": str(tmp_path / "missing.weights.h5")}
    )


# The backbones' fits are load tests (`make test-all`): ResNet50 trains and
# exports in minutes on 2 CPU cores, MobileNetV2 in 1.5 (most of it its
# export); their build and weight transfer are tested above, and fit, export
# and serving parity are the same path for any Keras model (the user models'
# tests). A fit from random weights ("none") differs from one from a file by
# the weights alone, which the test above holds apart.
@pytest.mark.parametrize(
  "name, weights",
  [
    pytest.param("unet_mobilenetv2", "file", marks=pytest.mark.slow),
    pytest.param("unet_mobilenetv2", "none", marks=pytest.mark.slow),
    pytest.param("unet_resnet50", "file", marks=pytest.mark.slow),
    pytest.param("unet_resnet50", "none", marks=pytest.mark.slow),
  ],
)
def test_backbone_models_train_and_export(prep_dir, tmp_path, name, weights):
  from train import cli  # pylint: disable=g-import-not-at-top

  if weights == "file":
    _, weights = _weights_file(tmp_path, BACKBONES[name][0])
  model_dir = str(tmp_path / "model")
  with pytest.raises(SystemExit) as e:
    cli.main(
      [
        "fit",
        "--data",
        prep_dir,
        "--model-dir",
        model_dir,
        "--model",
        name,
        "--backbone-weights",
        weights,
        "--width",
        "4",
        "--steps",
        "2",
        "--batch-size",
        "2",
        "--histogram-every",
        "0",
        "--noc-clicks",
        "0",
      ]
    )
  assert e.value.code == 0
  metrics = json.load(open(os.path.join(model_dir, "metrics.json")))
  assert metrics["step_traces"] == 1 and os.path.isdir(metrics["export_dir"])
  assert (
    json.load(open(os.path.join(model_dir, "model.json")))["builtin"]["backbone_weights"] == weights
  )
  assert_serving_parity(prep_dir, model_dir, n=2)


@pytest.mark.parametrize("name", ["segmentation_fcn", "unet_mobilenetv2"])
def test_built_in_segmentation_models_take_any_image_size(name):
  """`--image-size 100` (not a multiple of the pooling) trains: the task's
  check of the model on the records' shape passes and the logits keep H, W."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from train.models import build_model  # pylint: disable=g-import-not-at-top

  builtin = {"width": 4, "depth": 3, "backbone_weights": "none"}
  model = build_model(name, input_channels=5, image_size=[100, 70], builtin=builtin)
  assert tuple(model(tf.zeros([2, 100, 70, 5])).shape) == (2, 100, 70, 1)
  assert tuple(model(tf.zeros([1, 96, 96, 5])).shape) == (1, 96, 96, 1)
