"""The model's input, from the records or from a request: one definition for
the trainer, the serving export and the NoC evaluation.

The trainer's input is the exported tf.Transform graph applied to the raw
bytes the records hold, its model inputs (features.json, role
`model_input`) concatenated in declared order (`model_inputs`). At serving
time those raw bytes are computed from the request by the TensorFlow twins
of the ops of the chain (`serving_plan`, `run_plan`), then go through the
same transform and concatenation; the chain's op that changes the image's
geometry says how a request is framed and its prediction placed back
(`serving_side`).

This module imports nothing of `train`.
"""

from typing import Callable, Dict, List, Sequence, Tuple, Union

import tensorflow as tf

from beam_prep import keys
from beam_prep.features import FeatureTable
from beam_prep.ops import registry
from beam_prep.ops.serving import ServingSide

Example = Dict[str, tf.Tensor]

# raw bytes <-> tensors: the records hold `ndarray.tobytes()` (little-endian);
# in the graph, a tensor becomes those same bytes by joining one-byte strings.
_BYTE_TABLE = [bytes([i]) for i in range(256)]


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
  out = {}
  for e in table.model_inputs:
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
    out[e.key] = to_raw_bytes(value)
  return out
