"""The model's input, from the records or from a request: one definition for
the trainer, the serving export and the NoC evaluation.

The trainer's input is the exported tf.Transform graph applied to the raw
bytes the records hold, its model inputs (features.json, role
`model_input`) concatenated in declared order (`model_inputs`). At serving
time the model inputs are computed from the request by the TensorFlow twins
of the ops of the chain (`serving_plan`, `run_twins`), then normalized as
the transform does: looked up in the table of what it gives each uint8
value (`transform_tables`, `apply_tables`: no bytes, and a graph TFLite and
ONNX convert), or, for a transform that is no such table, written as raw
bytes for the same transform (`raw_inputs`); the chain's op that changes the
image's geometry says how a request is framed and its prediction placed
back (`serving_side`).

This module imports nothing of `train`.
"""

import weakref
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import tensorflow as tf

from beam_prep import keys
from beam_prep.features import Entry, FeatureTable
from beam_prep.ops import registry
from beam_prep.ops.serving import ServingSide

Example = Dict[str, tf.Tensor]
Tables = Dict[str, np.ndarray]

# raw bytes <-> tensors: the records hold `ndarray.tobytes()` (little-endian);
# in the graph, a tensor becomes those same bytes by joining one-byte strings.
_BYTE_TABLE = [bytes([i]) for i in range(256)]
PROBE_CHUNK = 16  # Examples per call of the transform in `lookup_tables`.
# What `lookup_tables` learnt of each transform, kept while the transform lives:
# {transform: {(key, image size): table or None}}. The trainer's reader, the
# task's corrective clicks and the portable export ask the same transform layer.
_PROBED = weakref.WeakKeyDictionary()


class ServingPlanError(ValueError):
  """The chain cannot be served: an op changes a model input without a twin."""


def model_inputs(table: FeatureTable, transformed: Dict[str, tf.Tensor]) -> tf.Tensor:
  """The model's input: the transformed model inputs, concatenated in declared order."""
  parts = [transformed[e.key] for e in table.model_inputs]
  return parts[0] if len(parts) == 1 else tf.concat(parts, axis=-1)


def to_raw_bytes(x: tf.Tensor) -> tf.Tensor:
  """A tensor -> scalar string of its row-major bytes (numpy's tobytes).

  Multi-byte dtypes are bitcast to bytes in the machine's order, which is
  little-endian on every platform TensorFlow ships for, as the records are.
  """
  if x.dtype != tf.uint8:
    x = tf.bitcast(x, tf.uint8)
  table = tf.constant(_BYTE_TABLE)
  return tf.strings.reduce_join(tf.gather(table, tf.reshape(tf.cast(x, tf.int32), [-1])))


def probe_inputs(
  table: FeatureTable, transform_keys, batch: int, fill: Dict[str, Sequence[Union[int, bytes]]]
) -> Dict[str, tf.Tensor]:
  """Raw inputs of the transform for `batch` made-up examples, to ask it what
  it does: example i of each per-pixel feature `key` of `fill` holds
  `fill[key][i]`, its raw bytes, or an int repeated at every byte; every other
  feature is zeros, empty or blank."""
  out = {}
  for key, spec in table.raw_feature_spec(transform_keys).items():
    e = table[key]
    if e.feature.per_pixel:
      size = e.stored_bytes(table.image_size)
      values = fill.get(key, [0] * batch)
      out[key] = tf.constant(
        [v if isinstance(v, bytes) else bytes([int(v)]) * size for v in values]
      )
    elif isinstance(spec, tf.io.VarLenFeature):
      out[key] = tf.sparse.SparseTensor(
        tf.zeros([0, 2], tf.int64), tf.zeros([0], spec.dtype), [batch, 0]
      )
    else:
      out[key] = tf.zeros([batch, *spec.shape], spec.dtype)
  return out


def _import_ops(table: FeatureTable) -> None:
  """Imports the ops module features.json names, so its ops are registered.

  Raises:
    ServingPlanError: it cannot be imported.
  """
  try:
    registry.import_ops_modules(table.ops_module)
  except ImportError as e:
    raise ServingPlanError(
      f"features.json names the ops module {table.ops_module!r}, which cannot be imported "
      f"({e}); put it on PYTHONPATH so the serving graph can use its ops' twins"
    ) from None


def serving_plan(table: FeatureTable) -> List[Tuple[str, Callable[[Example], Example]]]:
  """The twins the serving graph runs, in chain order: `[(op call, twin)]`.

  Imports the ops module that features.json names, so user ops and their
  twins are registered.

  Raises:
    ServingPlanError: an op produces or changes a model input and has no
      twin, or the ops module cannot be imported.
  """
  _import_ops(table)
  model_input_keys = set(table.keys("model_input"))
  plan = []
  for spec in registry.parse_chain(table.chain):
    entry = registry.op_entry(spec.name)
    touched = sorted(set(entry.produces) & model_input_keys)
    if not touched:
      continue
    twin = registry.build_twin(spec)
    if twin is None:
      raise ServingPlanError(
        f"op {spec.name!r} produces the model input(s) {', '.join(touched)} but has no "
        f"TensorFlow twin, so the serving graph cannot compute what the records hold. Give "
        f"it one: register_op({spec.name!r}, produces=..., twin=fn) with fn(example, "
        f"*args) doing the same on one example's tensors; or declare those features "
        f"with role='metadata' if the model does not need them at serving time; or train "
        f"with --no-export, which writes no serving model."
      )
    plan.append((str(spec), twin))
  return plan


def image_decoder(table: FeatureTable) -> Callable[[tf.Tensor], tf.Tensor]:
  """One encoded file's bytes -> its pixels [H, W, 3], by the twin of the
  chain's op that reads `image_bytes` (the records' images were decoded by
  that op): what the encoded-image signatures decode with.

  Raises:
    ServingPlanError: no op of the chain reads `image_bytes` with a twin.
  """
  _import_ops(table)
  for spec in registry.parse_chain(table.chain):
    twin = (
      registry.build_twin(spec) if keys.IMAGE_BYTES in registry.op_entry(spec.name).reads else None
    )
    if twin is not None:
      return lambda data: twin({keys.IMAGE_BYTES: data})[keys.IMAGE]
  raise ServingPlanError(
    f"no op of the chain ({table.chain}) decodes {keys.IMAGE_BYTES!r} "
    "with a TensorFlow twin, so the encoded-image signatures cannot "
    "decode a file"
  )


def serving_side(table: FeatureTable) -> ServingSide:
  """The serving side of the chain's op that changes the image's geometry
  (`beam_prep.ops.serving`; a side that does nothing when none does).

  Raises:
    ServingPlanError: more than one op of the chain changes the geometry, or
      the ops module cannot be imported.
  """
  _import_ops(table)
  sides = [
    (str(spec), side)
    for spec in registry.parse_chain(table.chain)
    for side in [registry.build_serving(spec)]
    if side is not None
  ]
  if len(sides) > 1:
    raise ServingPlanError(
      f"ops {', '.join(name for name, _ in sides)} each change the "
      "image's geometry; the serving graph places a prediction back "
      "through one"
    )
  return sides[0][1] if sides else ServingSide()


def run_plan(plan, table: FeatureTable, ex: Example) -> Dict[str, tf.Tensor]:
  """One request example through the twins -> {model input key: raw bytes (scalar)}."""
  return raw_inputs(table, run_twins(plan, ex))


def run_twins(plan, ex: Example) -> Example:
  """One request example through the twins of the plan, in order."""
  for _, twin in plan:
    ex = twin(dict(ex))
  return ex


def raw_inputs(table: FeatureTable, ex: Example) -> Dict[str, tf.Tensor]:
  """{model input key: raw bytes (scalar)} of an example the twins made."""
  return {e.key: to_raw_bytes(_model_input_value(e, ex)) for e in table.model_inputs}


def _model_input_value(e: Entry, ex: Example) -> tf.Tensor:
  """Model input `e` of an example the twins made.

  Raises:
    ServingPlanError: the twins did not make it, or made it of another dtype.
  """
  if e.key not in ex:
    raise ServingPlanError(
      f"the serving graph has no {e.key!r} after the chain's twins (declared by op {e.op!r})"
    )
  value = ex[e.key]
  if value.dtype != tf.as_dtype(e.feature.dtype):
    raise ServingPlanError(
      f"the twin of op {e.op!r} gives {e.key!r} as {value.dtype.name}; "
      f"features.json declares {e.feature.dtype}"
    )
  return value


def transform_tables(table: FeatureTable, transform: Callable) -> Tuple[Optional[Tables], str]:
  """({model input key: float32 [256 * C], the transform's value of uint8
  value v, channel c at v * C + c}, "") when the transform maps each pixel of
  every model input by its own uint8 value (the default preprocessing does:
  per-channel standardization and scaling), so it applies to tensors
  (`apply_tables`); else (None, why not).
  """
  for e in table.model_inputs:
    if not e.feature.per_pixel or e.feature.dtype != "uint8":
      return None, f"model input {e.key!r} is {e.feature.dtype}, not per-pixel uint8"
  inputs = table.keys("model_input")
  tables = lookup_tables(table, transform, inputs, inputs)
  for key, lut in tables.items():
    if lut is None:
      return None, f"the transform does not map each pixel of model input {key!r} by its own value"
  return {k: v.reshape(-1) for k, v in tables.items()}, ""


def apply_tables(table: FeatureTable, tables: Tables, ex: Example) -> tf.Tensor:
  """One example the twins made -> the model's input [1, H, W, C]: each model
  input looked up in its table (`transform_tables`), concatenated in declared
  order; what the transform gives its raw bytes, with no bytes made."""
  parts = []
  for e in table.model_inputs:
    value = _model_input_value(e, ex)
    channels = e.feature.channels
    at = tf.cast(tf.reshape(value, e.shape(table.image_size)), tf.int32) * channels
    parts.append(tf.gather(tf.constant(tables[e.key]), at + tf.range(channels)))
  return (parts[0] if len(parts) == 1 else tf.concat(parts, axis=-1))[None]


def lookup_tables(
  table: FeatureTable, transform: Callable, transform_keys: List[str], inputs: List[str]
) -> Dict[str, Optional[np.ndarray]]:
  """{key: what the transform gives each uint8 value of each channel of the
  uint8 per-pixel feature `key`, float32 [256, C]; None when it is not a
  function of the pixel's own value}.

  The transform is asked once per input for as long as it lives (`_probe`).
  """
  known = _PROBED.setdefault(transform, {})
  todo = [k for k in inputs if (k, table.image_size) not in known]
  if todo:
    got = _probe(table, transform, transform_keys, todo)
    known.update({(k, table.image_size): lut for k, lut in got.items()})
  return {k: known[(k, table.image_size)] for k in inputs}


def _probe(
  table: FeatureTable, transform: Callable, transform_keys: List[str], inputs: List[str]
) -> Dict[str, Optional[np.ndarray]]:
  """`lookup_tables` of `inputs`, asking the transform: one batch where
  example v holds v at every pixel (v = 0..255), the last one every value in
  turn, pixel after pixel, which must map through the table.
  """
  ramp = {k: np.arange(table[k].stored_bytes(table.image_size)) % 256 for k in inputs}
  fill = {k: list(range(256)) + [r.astype(np.uint8).tobytes()] for k, r in ramp.items()}
  parts = {k: [] for k in inputs}
  with tf.init_scope():
    # In chunks: the eager transform's time grows faster than its batch (at
    # 128 px, 257 examples at once took 22 s, in chunks of 16 about 2 s).
    for start in range(0, 257, PROBE_CHUNK):
      chunk = {k: v[start : start + PROBE_CHUNK] for k, v in fill.items()}
      out = transform(probe_inputs(table, transform_keys, len(next(iter(chunk.values()))), chunk))
      for k in inputs:
        parts[k].append(np.asarray(out[k], np.float32))
  got = {k: np.concatenate(v) for k, v in parts.items()}
  tables = {}
  for k in inputs:
    g, channels = got[k], table[k].feature.channels
    lut = g[:256, 0, 0, :]  # [256, C]
    ok = (
      g.shape[0] == 257
      and np.array_equal(g[:256], np.broadcast_to(lut[:, None, None, :], g[:256].shape))
      and np.array_equal(g[256], lut[ramp[k].reshape(g[256].shape), np.arange(channels)])
    )
    tables[k] = lut if ok else None
  return tables
