"""Models, registered by name; a user's module registers more.

A model factory is registered with `@register_model(NAME)` (`from train
import register_model`) and called as

    segmentation:    factory(input_channels=C, **model_args)
    classification:  factory(input_channels=C, num_classes=K, **model_args)

It returns a Keras model from float32 [B, H, W, C] (the model inputs
declared in the prep output's features.json, concatenated: C = 5 for RGB and
two distance maps, 7 with click disks too, ...) to mask logits [B, H, W, 1]
or class logits [B, K]. A factory that names an `image_size` parameter also
gets the records' (height, width). The built-in models take `width` and
`depth` from `--width` and `--depth`; a user's model takes only what
`--model-args` gives it, so its own defaults hold.

`segmentation_fcn`: a small U-Net-style fully convolutional net.

`unet_mobilenetv2`, `unet_resnet50`: U-Net decoders (skip connections at
1/2..1/16) on `keras.applications` encoders.

The U-Nets take any H and W: they pad the input at the bottom and right to
the multiple their pooling needs (2**depth, 32) and crop the logits back,
so any `--image-size` of the Beam job trains.
`--backbone-weights imagenet` (the default; downloads them), `none`, or a
weights file of the 3-channel backbone (`save_weights` of
`keras.applications.ResNet50(include_top=False)`, say). The first
convolution takes the extra click channels: its RGB part comes from the
pretrained weights, the click channels start at zero, as DIOS did with its
FCN. The inputs are standardized per channel by tf.Transform, not by the
backbone's ImageNet preprocessing; fine-tuning adapts.

`cnn_classifier`: global-pooled CNN, class logits.

What built a run's model is written to MODEL_DIR/model.json, so that
`rebuild(model_dir)` builds it again (importing the user's module from where
it was found) and restores its weights.
"""

import inspect
import json
import os
from typing import Any, Callable, Dict, Optional, Tuple

import keras

from beam_prep import plugins
from train import model_layout

_MODELS: Dict[str, Callable[..., keras.Model]] = {}
MODEL_FILE = "model.json"
# Arguments of the built-in models that come from TrainConfig fields.
BUILTIN_ARGS = ("width", "depth", "backbone_weights")
# The arguments of build_model, as model.json records them.
BUILD_KEYS = ("name", "input_channels", "num_classes", "image_size", "model_args", "builtin")


def register_model(name: str):
  """Decorator: `@register_model("my_unet")` makes a factory buildable by name."""

  def decorator(fn):
    _MODELS[name] = fn
    return fn

  return decorator


def import_model_modules(spec: str, search: Tuple[str, ...] = ()) -> Dict[str, str]:
  """Imports the module(s) that register models (`beam_prep.plugins`'s rule);
  returns module name -> the file it was imported from."""
  return plugins.import_modules(spec, "model module", search)


def model_factory(name: str) -> Callable[..., keras.Model]:
  try:
    return _MODELS[name]
  except KeyError:
    raise ValueError(
      f"unknown model {name!r}; registered: {sorted(_MODELS)} (a model of your "
      "own: --model-module M, where M registers it)"
    ) from None


def build_model(
  name: str,
  input_channels: int,
  num_classes: Optional[int] = None,
  image_size: Optional[Tuple[int, int]] = None,
  model_args: Optional[Dict[str, Any]] = None,
  builtin: Optional[Dict[str, Any]] = None,
) -> keras.Model:
  """Calls the factory registered as `name` (see the module docstring).

  Args:
    builtin: `width`, `depth`: passed to the built-in models only.
  """
  builtin = builtin or {}
  factory = model_factory(name)
  kwargs = dict(model_args or {})
  kwargs["input_channels"] = input_channels
  if num_classes is not None:
    kwargs["num_classes"] = num_classes
  params = inspect.signature(factory).parameters
  if image_size is not None and "image_size" in params:
    kwargs.setdefault("image_size", tuple(image_size))
  if factory.__module__ == __name__:
    for k in BUILTIN_ARGS:
      if k in params and builtin.get(k) is not None:
        kwargs.setdefault(k, builtin[k])
  where = f"{factory.__module__}.{factory.__qualname__}"
  try:
    model = factory(**kwargs)
  except TypeError as e:
    raise ValueError(
      f"model {name!r} ({where}) cannot be called with {sorted(kwargs)}: {e} "
      "(--model-args passes the rest as a JSON object)"
    ) from None
  if not isinstance(model, keras.Model):
    raise ValueError(f"model {name!r} ({where}) returned {type(model).__name__}, not a keras.Model")
  return model


def write_model_file(model_dir: str, record: Dict[str, Any]) -> None:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  with tf.io.gfile.GFile(os.path.join(model_dir, MODEL_FILE), "w") as f:
    json.dump(record, f, indent=2, sort_keys=True)


def read_model_file(model_dir: str) -> Dict[str, Any]:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  path = os.path.join(model_dir, MODEL_FILE)
  if not tf.io.gfile.exists(path):
    raise FileNotFoundError(f"{path} not found: {model_dir} is not a beam-train model dir")
  with tf.io.gfile.GFile(path) as f:
    return json.load(f)


def rebuild(model_dir: str) -> keras.Model:
  """The model a `beam-train fit` run trained, with its newest checkpoint's weights."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  rec = read_model_file(model_dir)
  files = rec.get("module_files") or {}
  import_model_modules(
    rec.get("model_module", ""), tuple(sorted({os.path.dirname(f) for f in files.values() if f}))
  )
  args = {k: rec.get(k) for k in BUILD_KEYS}
  # The checkpoint holds every weight: no pretrained backbone to fetch again.
  args["builtin"] = dict(args.get("builtin") or {}, backbone_weights="none")
  model = build_model(**args)
  ckpt = tf.train.latest_checkpoint(os.path.join(model_dir, model_layout.CHECKPOINTS_DIR))
  if not ckpt:
    raise FileNotFoundError(f"no checkpoint under {model_dir}/checkpoints")
  tf.train.Checkpoint(model=model).restore(ckpt).expect_partial()
  return model


@keras.saving.register_keras_serializable(package="beam_prep")
class PadToMultiple(keras.layers.Layer):
  """Pads [B, H, W, C] with zeros at the bottom and right to multiples of `multiple`."""

  def __init__(self, multiple: int, **kwargs):
    super().__init__(**kwargs)
    self.multiple = multiple

  def call(self, x):
    h, w = keras.ops.shape(x)[1], keras.ops.shape(x)[2]
    return keras.ops.pad(x, [[0, 0], [0, (-h) % self.multiple], [0, (-w) % self.multiple], [0, 0]])

  def get_config(self):
    return dict(super().get_config(), multiple=self.multiple)


@keras.saving.register_keras_serializable(package="beam_prep")
class CropLike(keras.layers.Layer):
  """Crops [B, H', W', C] to the height and width of a reference tensor."""

  def call(self, x, reference):
    return x[:, : keras.ops.shape(reference)[1], : keras.ops.shape(reference)[2]]


def _block(x, filters: int, name: str):
  for i in (1, 2):
    x = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"{name}_conv{i}")(x)
    # Momentum 0.9: short runs must still end with usable moving statistics.
    x = keras.layers.BatchNormalization(momentum=0.9, name=f"{name}_bn{i}")(x)
    x = keras.layers.ReLU(name=f"{name}_relu{i}")(x)
  return x


@register_model("segmentation_fcn")
def segmentation_fcn(input_channels: int, width: int = 16, depth: int = 3) -> keras.Model:
  """U-Net-style encoder/decoder returning per-pixel mask logits."""
  inputs = keras.Input((None, None, input_channels), name="inputs")
  x, skips = PadToMultiple(2**depth, name="pad")(inputs), []
  for i in range(depth):
    x = _block(x, width * 2**i, f"down{i}")
    skips.append(x)
    x = keras.layers.MaxPooling2D(name=f"pool{i}")(x)
  x = _block(x, width * 2**depth, "bottom")
  for i in reversed(range(depth)):
    x = keras.layers.Conv2DTranspose(width * 2**i, 2, strides=2, name=f"up{i}_deconv")(x)
    x = keras.layers.Concatenate(name=f"up{i}_concat")([x, skips[i]])
    x = _block(x, width * 2**i, f"up{i}")
  # float32 logits even under mixed precision: the loss needs the range.
  logits = keras.layers.Conv2D(1, 1, name="logits", dtype="float32")(x)
  return keras.Model(inputs, CropLike(name="crop")(logits, inputs), name="segmentation_fcn")


@register_model("cnn_classifier")
def cnn_classifier(
  input_channels: int, num_classes: int, width: int = 16, depth: int = 3
) -> keras.Model:
  """A small CNN: `depth` conv blocks, global average pooling, class logits."""
  inputs = keras.Input((None, None, input_channels), name="inputs")
  x = inputs
  for i in range(depth):
    x = _block(x, width * 2**i, f"block{i}")
    x = keras.layers.MaxPooling2D(name=f"pool{i}")(x)
  x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
  logits = keras.layers.Dense(num_classes, name="logits", dtype="float32")(x)
  return keras.Model(inputs, logits, name="cnn_classifier")


# U-Net decoders on keras.applications encoders. The skips are the encoder's
# last activations at 1/2, 1/4, 1/8 and 1/16 of the input; the bottom is at
# 1/32, so H and W must be multiples of 32.
_BACKBONES = {
  "mobilenetv2": (
    "MobileNetV2",
    "Conv1",
    ("block_1_expand_relu", "block_3_expand_relu", "block_6_expand_relu", "block_13_expand_relu"),
    "out_relu",
  ),
  "resnet50": (
    "ResNet50",
    "conv1_conv",
    ("conv1_relu", "conv2_block3_out", "conv3_block4_out", "conv4_block6_out"),
    "conv5_block3_out",
  ),
}


def _encoder(backbone: str, input_channels: int, weights: str) -> keras.Model:
  """The backbone taking `input_channels`; pretrained weights (ImageNet or a
  file of the 3-channel backbone) go to every layer, and the first
  convolution's RGB part; its extra (click) channels start at zero."""
  import numpy as np  # pylint: disable=g-import-not-at-top

  cls_name, first_conv, _, _ = _BACKBONES[backbone]
  cls = getattr(keras.applications, cls_name)
  model = cls(input_shape=(None, None, input_channels), include_top=False, weights=None)
  if weights in ("", "none", None):
    return model
  try:
    source = cls(
      input_shape=(None, None, 3),
      include_top=False,
      weights="imagenet" if weights == "imagenet" else weights,
    )
  except Exception as e:  # pylint: disable=broad-except
    where = (
      "downloading the ImageNet weights (needs the internet)"
      if weights == "imagenet"
      else f"reading the weights file {weights} (a {cls_name}(include_top=False) "
      "model's save_weights, *.weights.h5)"
    )
    raise ValueError(
      f"backbone {backbone}: {where} failed: {type(e).__name__}: {e}; pass "
      "--backbone-weights none to start from random weights"
    ) from None
  for layer in model.layers:
    if not layer.weights:
      continue
    values = source.get_layer(layer.name).get_weights()
    if layer.name == first_conv and input_channels != 3:
      kernel = np.zeros(
        values[0].shape[:2] + (input_channels,) + values[0].shape[3:], values[0].dtype
      )
      kernel[:, :, : min(3, input_channels)] = values[0][:, :, : min(3, input_channels)]
      values = [kernel] + values[1:]
    layer.set_weights(values)
  return model


def _backbone_unet(
  backbone: str, input_channels: int, width: int, backbone_weights: str
) -> keras.Model:
  _, _, skip_names, bottom_name = _BACKBONES[backbone]
  encoder = _encoder(backbone, input_channels, backbone_weights)
  features = keras.Model(
    encoder.input,
    [encoder.get_layer(n).output for n in skip_names] + [encoder.get_layer(bottom_name).output],
    name=f"{backbone}_encoder",
  )
  inputs = keras.Input((None, None, input_channels), name="inputs")
  *skips, x = features(PadToMultiple(32, name="pad")(inputs))
  for i in reversed(range(len(skips))):
    x = keras.layers.UpSampling2D(name=f"up{i}_resize")(x)
    x = keras.layers.Concatenate(name=f"up{i}_concat")([x, skips[i]])
    x = _block(x, width * 2**i, f"up{i}")
  x = keras.layers.UpSampling2D(name="full_resize")(x)
  x = _block(x, width, "full")
  logits = keras.layers.Conv2D(1, 1, name="logits", dtype="float32")(x)
  return keras.Model(inputs, CropLike(name="crop")(logits, inputs), name=f"unet_{backbone}")


@register_model("unet_mobilenetv2")
def unet_mobilenetv2(
  input_channels: int, width: int = 16, backbone_weights: str = "imagenet"
) -> keras.Model:
  """U-Net decoder on a MobileNetV2 encoder (keras.applications)."""
  return _backbone_unet("mobilenetv2", input_channels, width, backbone_weights)


@register_model("unet_resnet50")
def unet_resnet50(
  input_channels: int, width: int = 16, backbone_weights: str = "imagenet"
) -> keras.Model:
  """U-Net decoder on a ResNet50 encoder (keras.applications)."""
  return _backbone_unet("resnet50", input_channels, width, backbone_weights)
