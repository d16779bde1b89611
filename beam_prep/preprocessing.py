"""The tf.Transform side: the preprocessing_fn generated from declared features.

Records keep the heavy features compact (raw bytes of the arrays); the cheap
part that depends on full-pass statistics is the exported graph, which the
trainer and the serving model both apply. The default `preprocessing_fn`
covers every declared feature (see `beam_prep.features`):

- each `model_input`, decoded to float32 [B, H, W, C] and normalized as
  declared ("standardize": per-channel mean and standard deviation over the
  analyzed split, by full-pass analyzers; `scale(s)`: divided by s; "none"),
  under its own key. The job feeds the analysis one small row per train
  image (`RecordCodec.summary_row`: the channel means and means of squares
  of its standardized inputs), so every image weighs once and no pixel is
  analyzed twice; the same function analyzes full records as well;
- the `label`, turned into label outputs by its kind (`label_outputs`): a
  per-pixel mask gives `label` (1 on the object) and `label_weight` (0 on
  ignore pixels), a class name its index in a vocabulary (most frequent first);
- `metadata` is not used.

A team may give its own preprocessing_fn (`--preprocessing-fn
module:function`): it is called as `fn(inputs)`, or `fn(inputs, features)`
with the run's `FeatureTable` when it takes two arguments, and must output
the same keys (every model input under its key, and the task's labels).
`decode_feature` turns a raw per-pixel input into a tensor for it.

The graph reads the example view (`FeatureTable.raw_feature_spec`): every
per-pixel feature as its raw bytes. A record may store one compressed
(`Feature.encoding`); `beam_prep.record_decoder.raw_bytes` is the one place
that undoes that, before the graph (in the records' Decoder), so the exported graph and the
serving graph, which computes raw bytes from a request, stay as they were.
"""

import importlib
import inspect
from typing import Callable, Dict, Optional, Tuple

import tensorflow as tf
import tensorflow_transform as tft

from beam_prep import keys
from beam_prep.features import Entry, FeatureError, FeatureTable
from beam_prep.record_codec import RecordCodec

PreprocessingFn = Callable[[Dict[str, tf.Tensor]], Dict[str, tf.Tensor]]


def decode_feature(raw: tf.Tensor, entry: Entry, image_size: Tuple[int, int]) -> tf.Tensor:
  """[B] raw bytes of a per-pixel feature -> [B, H, W, C] of its declared dtype."""
  dtype = tf.as_dtype(entry.feature.dtype)
  flat = tf.io.decode_raw(raw, dtype, little_endian=True)
  return tf.reshape(flat, [-1, image_size[0], image_size[1], entry.feature.channels])


def standardize(
  x: tf.Tensor,
  name: str,
  example_mean: Optional[tf.Tensor] = None,
  example_mean_square: Optional[tf.Tensor] = None,
) -> tf.Tensor:
  """float32 [B, H, W, C] -> per-channel standardized, by a full-pass analyzer.

  One analyzer (`tft.mean`, one combine for the 2C values) averages
  per-example channel means and means of squares over the analyzed split (so
  each example weighs once, and with equal sizes the mean of the means is the
  pixel mean). Given `example_mean` and `example_mean_square` ([B, C],
  precomputed per example), it reads those instead of the pixels. The
  channel count must be static: tf.Transform gives its outputs a fixed shape.
  """
  if example_mean is None:
    example_mean = tf.reduce_mean(x, axis=[1, 2])
    example_mean_square = tf.reduce_mean(tf.square(x), axis=[1, 2])
  channels = example_mean.shape[-1]
  moments = tft.mean(
    tf.concat([example_mean, example_mean_square], axis=-1),
    reduce_instance_dims=False,
    name=f"{name}_moments",
  )
  mean, mean_sq = moments[:channels], moments[channels:]
  std = tf.sqrt(tf.maximum(mean_sq - tf.square(mean), 1e-6))
  return (x - mean) / std


def normalize(
  x: tf.Tensor, entry: Entry, inputs: Optional[Dict[str, tf.Tensor]] = None
) -> tf.Tensor:
  """A decoded model input, normalized as its declaration says.

  With `inputs` holding the entry's per-image summaries
  (`RecordCodec.summary_keys`), standardization analyzes those.
  """
  x = tf.cast(x, tf.float32)
  if entry.feature.normalize == "standardize":
    mean_key, square_key = RecordCodec.summary_keys(entry)
    if inputs is not None and mean_key in inputs:
      return standardize(x, entry.key, inputs[mean_key], inputs[square_key])
    return standardize(x, entry.key)
  if entry.feature.scale is not None:
    return x / entry.feature.scale
  return x


def label_outputs(inputs: Dict[str, tf.Tensor], table: FeatureTable) -> Dict[str, tf.Tensor]:
  """The label outputs of the table's one label feature, by its kind.

  A per-pixel mask (1 object, 0 background, 255 ignore) gives `label` (1 on
  the object) and `label_weight` (0 on ignore pixels), float32 [B, H, W, 1];
  a class name gives `label`, its index in the vocabulary `LABEL_VOCABULARY`
  (most frequent first).

  Raises:
    FeatureError: the table does not declare exactly one label.
  """
  labels = table.with_role("label")
  if len(labels) != 1:
    raise FeatureError(
      f"a {table.task} run needs exactly one label feature; the chain "
      f"declares {[e.key for e in labels] or 'none'}"
    )
  entry = labels[0]
  if entry.feature.per_pixel:
    mask = decode_feature(inputs[entry.key], entry, table.image_size)
    return {
      keys.LABEL: tf.cast(tf.equal(mask, 1), tf.float32),
      keys.LABEL_WEIGHT: tf.cast(tf.not_equal(mask, keys.IGNORE), tf.float32),
    }
  return {
    keys.LABEL: tft.compute_and_apply_vocabulary(
      inputs[entry.key], vocab_filename=keys.LABEL_VOCABULARY, num_oov_buckets=0, default_value=-1
    )
  }


def make_preprocessing_fn(table: FeatureTable) -> PreprocessingFn:
  """The default preprocessing_fn of a feature table (see the module docstring).

  It analyzes either full records or the job's small per-image summary rows
  (`RecordCodec.summary_row`, schema `analysis_feature_spec`): the exported
  graph transforms full records either way, and the summaries, absent at
  training and serving, are never needed there.
  """
  for entry in table.model_inputs:
    if not entry.feature.per_pixel:
      raise ValueError(
        f"model input {entry.key!r} (declared by op {entry.op!r}) is not "
        "per-pixel: the default preprocessing_fn stacks per-pixel model inputs; "
        "declare it as metadata or give --preprocessing-fn"
      )

  def preprocessing_fn(inputs):
    out = {}
    for entry in table.model_inputs:
      out[entry.key] = normalize(
        decode_feature(inputs[entry.key], entry, table.image_size), entry, inputs
      )
    out.update(label_outputs(inputs, table))
    return out

  return preprocessing_fn


def load_preprocessing_fn(spec: str, table: FeatureTable) -> PreprocessingFn:
  """`module:function` -> a preprocessing_fn (given the table if it takes two args).

  Raises:
    ValueError: the spec does not name a function.
    ImportError: the module cannot be imported.
  """
  module_name, _, fn_name = spec.partition(":")
  if not module_name or not fn_name:
    raise ValueError(f"--preprocessing-fn is module:function, got {spec!r}")
  fn = getattr(importlib.import_module(module_name), fn_name, None)
  if not callable(fn):
    raise ValueError(f"--preprocessing-fn {spec}: {module_name} has no function {fn_name!r}")
  if len(inspect.signature(fn).parameters) >= 2:
    return lambda inputs: fn(inputs, table)
  return fn


def preprocessing_fn_for(table: FeatureTable, spec: str = "") -> PreprocessingFn:
  """The user's preprocessing_fn when `spec` names one, else the default."""
  return load_preprocessing_fn(spec, table) if spec else make_preprocessing_fn(table)
