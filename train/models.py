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

`segmentation_fcn`: a small U-Net-style fully convolutional net. H and W
must be multiples of 2**depth.

`cnn_classifier`: global-pooled CNN, class logits.

What built a run's model is written to MODEL_DIR/model.json, so that
`rebuild(model_dir)` builds it again (importing the user's module from where
it was found) and restores its weights.
"""

import importlib
import inspect
import json
import os
import sys
from typing import Any, Callable, Dict, Optional, Tuple

import keras

_MODELS: Dict[str, Callable[..., keras.Model]] = {}
MODEL_FILE = "model.json"
# Arguments of the built-in models that come from TrainConfig fields.
_BUILTIN_ARGS = ("width", "depth")
# The arguments of build_model, as model.json records them.
BUILD_KEYS = ("name", "input_channels", "num_classes", "image_size", "model_args", "builtin")


def register_model(name: str):
  """Decorator: `@register_model("my_unet")` makes a factory buildable by name."""
  def decorator(fn):
    _MODELS[name] = fn
    return fn
  return decorator


def import_model_modules(spec: str, search: Tuple[str, ...] = ()) -> Dict[str, str]:
  """Imports a module (or comma-separated modules) that registers models.

  The current directory is searched too, as `python -m` would, then
  `search` (the folders a model dir recorded).

  Returns:
    module name -> the file it was imported from.

  Raises:
    ImportError: naming the module and where it was looked for.
  """
  files = {}
  for name in filter(None, (m.strip() for m in (spec or "").split(","))):
    try:
      module = importlib.import_module(name)
    except ModuleNotFoundError as e:
      if e.name != name.split(".")[0] and e.name != name:
        raise  # The module exists; something it imports does not.
      extra = [d for d in (os.getcwd(), *search) if d and d not in sys.path]
      sys.path[:0] = extra
      try:
        module = importlib.import_module(name)
      except ModuleNotFoundError:
        raise ImportError(
            f"model module {name!r} not found on the Python path, in {os.getcwd()} or in "
            f"{', '.join(search) or 'no recorded folder'}") from None
    files[name] = os.path.abspath(getattr(module, "__file__", "") or "")
  return files


def model_factory(name: str) -> Callable[..., keras.Model]:
  try:
    return _MODELS[name]
  except KeyError:
    raise ValueError(f"unknown model {name!r}; registered: {sorted(_MODELS)} (a model of your "
                     "own: --model-module M, where M registers it)") from None


def build_model(name: str, input_channels: int, num_classes: Optional[int] = None,
                image_size: Optional[Tuple[int, int]] = None,
                model_args: Optional[Dict[str, Any]] = None,
                builtin: Optional[Dict[str, Any]] = None) -> keras.Model:
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
    for k in _BUILTIN_ARGS:
      if k in builtin and builtin[k] is not None:
        kwargs.setdefault(k, builtin[k])
  where = f"{factory.__module__}.{factory.__qualname__}"
  try:
    model = factory(**kwargs)
  except TypeError as e:
    raise ValueError(f"model {name!r} ({where}) cannot be called with {sorted(kwargs)}: {e} "
                     "(--model-args passes the rest as a JSON object)") from None
  if not isinstance(model, keras.Model):
    raise ValueError(f"model {name!r} ({where}) returned {type(model).__name__}, not a "
                     "keras.Model")
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
  import_model_modules(rec.get("model_module", ""),
                       tuple(sorted({os.path.dirname(f) for f in files.values() if f})))
  model = build_model(**{k: rec.get(k) for k in BUILD_KEYS})
  ckpt = tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints"))
  if not ckpt:
    raise FileNotFoundError(f"no checkpoint under {model_dir}/checkpoints")
  tf.train.Checkpoint(model=model).restore(ckpt).expect_partial()
  return model


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
def cnn_classifier(input_channels: int, num_classes: int, width: int = 16,
                   depth: int = 3) -> keras.Model:
  """A small CNN: `depth` conv blocks, global average pooling, class logits."""
  inputs = keras.Input((None, None, input_channels), name="inputs")
  x = inputs
  for i in range(depth):
    x = _block(x, width * 2**i, f"block{i}")
    x = keras.layers.MaxPooling2D(name=f"pool{i}")(x)
  x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
  logits = keras.layers.Dense(num_classes, name="logits", dtype="float32")(x)
  return keras.Model(inputs, logits, name="cnn_classifier")
