"""Models, registered by name.

`segmentation_fcn`: a small U-Net-style fully convolutional net. Input
float32 [B, H, W, C], the model inputs declared in the prep output's
features.json, concatenated (C = 5 for RGB + two distance maps, 7 with click
disks too, ...); output mask logits [B, H, W, 1]. H and W must be multiples
of 2**depth.

`cnn_classifier`: global-pooled CNN, input [B, H, W, C], class logits.
"""

from typing import Callable, Dict

import keras

_MODELS: Dict[str, Callable[..., keras.Model]] = {}


def register_model(name: str):
  def decorator(fn):
    _MODELS[name] = fn
    return fn
  return decorator


def build_model(name: str, **kwargs) -> keras.Model:
  try:
    factory = _MODELS[name]
  except KeyError:
    raise ValueError(f"unknown model {name!r}; registered: {sorted(_MODELS)}") from None
  return factory(**kwargs)


def _block(x, filters: int, name: str):
  for i in (1, 2):
    x = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"{name}_conv{i}")(x)
    # Momentum 0.9: short runs must still end with usable moving statistics.
    x = keras.layers.BatchNormalization(momentum=0.9, name=f"{name}_bn{i}")(x)
    x = keras.layers.ReLU(name=f"{name}_relu{i}")(x)
  return x


@register_model("segmentation_fcn")
def segmentation_fcn(channels: int, width: int = 16, depth: int = 3) -> keras.Model:
  """U-Net-style encoder/decoder returning per-pixel mask logits."""
  inputs = keras.Input((None, None, channels), name="inputs")
  x, skips = inputs, []
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
  return keras.Model(inputs, logits, name="segmentation_fcn")


@register_model("cnn_classifier")
def cnn_classifier(num_classes: int, channels: int, width: int = 16,
                   depth: int = 3) -> keras.Model:
  """A small CNN: `depth` conv blocks, global average pooling, class logits."""
  inputs = keras.Input((None, None, channels), name="inputs")
  x = inputs
  for i in range(depth):
    x = _block(x, width * 2**i, f"block{i}")
    x = keras.layers.MaxPooling2D(name=f"pool{i}")(x)
  x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
  logits = keras.layers.Dense(num_classes, name="logits", dtype="float32")(x)
  return keras.Model(inputs, logits, name="cnn_classifier")
