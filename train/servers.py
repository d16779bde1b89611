"""The serving graph's servers: twins, tf.Transform and the model in one tf.Module.

`serving_plan` lists the twins the graph runs; a server per task holds the
Keras model, the tf.Transform layer and the plan, and defines the signatures
(see `train.export` for their contract).
"""

from typing import Callable, Dict, List, Tuple

import tensorflow as tf
import tensorflow_transform as tft

from beam_prep import keys
from beam_prep.features import FeatureTable
from beam_prep.ops import registry
from beam_prep.preprocessing import decode_feature
from train.inputs import model_inputs

Example = Dict[str, tf.Tensor]

# raw bytes <-> tensors: the records hold `ndarray.tobytes()` (little-endian);
# in the graph, a tensor becomes those same bytes by joining one-byte strings.
_BYTE_TABLE = [bytes([i]) for i in range(256)]


class ServingPlanError(ValueError):
  """The chain cannot be served: an op changes a model input without a twin."""


def to_raw_bytes(x: tf.Tensor) -> tf.Tensor:
  """A tensor -> scalar string of its row-major bytes (numpy's tobytes).

  Multi-byte dtypes are bitcast to bytes in the machine's order, which is
  little-endian on every platform TensorFlow ships for, as the records are.
  """
  if x.dtype != tf.uint8:
    x = tf.bitcast(x, tf.uint8)
  table = tf.constant(_BYTE_TABLE)
  return tf.strings.reduce_join(tf.gather(table, tf.reshape(tf.cast(x, tf.int32), [-1])))


def serving_plan(table: FeatureTable) -> List[Tuple[str, Callable[[Example], Example]]]:
  """The twins the serving graph runs, in chain order: `[(op call, twin)]`.

  Imports the ops module that features.json names, so user ops and their
  twins are registered.

  Raises:
    ServingPlanError: an op produces or changes a model input and has no
      twin, or the ops module cannot be imported.
  """
  try:
    registry.import_ops_modules(table.ops_module)
  except ImportError as e:
    raise ServingPlanError(
        f"features.json names the ops module {table.ops_module!r}, which cannot be imported "
        f"({e}); put it on PYTHONPATH so the serving graph can use its ops' twins") from None
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
          f"with --no-export, which writes no serving model.")
    plan.append((str(spec), twin))
  return plan


def run_plan(plan, table: FeatureTable, ex: Example) -> Dict[str, tf.Tensor]:
  """One request example through the twins -> {model input key: raw bytes (scalar)}."""
  for op, twin in plan:
    ex = twin(dict(ex))
  out = {}
  for e in table.model_inputs:
    if e.key not in ex:
      raise ServingPlanError(f"the serving graph has no {e.key!r} after the chain's twins "
                             f"(declared by op {e.op!r})")
    value = ex[e.key]
    if value.dtype != tf.as_dtype(e.feature.dtype):
      raise ServingPlanError(f"the twin of op {e.op!r} gives {e.key!r} as {value.dtype.name}; "
                             f"features.json declares {e.feature.dtype}")
    out[e.key] = to_raw_bytes(value)
  return out


class _Server(tf.Module):
  """Holds the Keras 3 model, the tf.Transform (tf_keras) layer and the twins."""

  def __init__(self, model, tft_output: tft.TFTransformOutput, table: FeatureTable):
    super().__init__()
    self.model = model
    # Keras 3 variables wrap tf.Variables. Saved only through the wrappers,
    # the SavedModel loads in TF2 but not in session-based loaders
    # (TensorFlow Serving, saved_model_cli run: "Could not find variable").
    # Tracking the underlying tf.Variables as well fixes both.
    self.model_tf_variables = [v.value if hasattr(v, "value") else v for v in model.variables]
    self.tft_layer = tft_output.transform_features_layer()
    self._table = table
    self._plan = serving_plan(table)

  def raw_model_input(self, ex: Example) -> Dict[str, tf.Tensor]:
    """One request example -> {model input key: raw bytes scalar}, by the twins."""
    return run_plan(self._plan, self._table, ex)

  def model_input(self, raw: Dict[str, tf.Tensor]) -> tf.Tensor:
    """[B] raw bytes per model input -> the model's input [B, H, W, C]."""
    return model_inputs(self._table, self.tft_layer(raw))

  def _batched_raw(self, elems, fn):
    keys_ = self._table.keys("model_input")
    sig = {k: tf.TensorSpec([], tf.string) for k in keys_}
    return tf.map_fn(fn, elems, fn_output_signature=sig)


class SegmentationServer(_Server):
  """Image and clicks in, mask out."""

  def _predict(self, inputs):
    logits = self.model(inputs, training=False)
    return tf.sigmoid(tf.cast(logits, tf.float32))[..., 0]

  @tf.function(input_signature=[
      tf.TensorSpec([None, None, 3], tf.uint8, name="image"),
      tf.TensorSpec([None, 2], tf.int32, name="positive_clicks"),
      tf.TensorSpec([None, 2], tf.int32, name="negative_clicks"),
  ])
  def serve(self, image, positive_clicks, negative_clicks):
    h, w = tf.shape(image)[0], tf.shape(image)[1]
    with tf.control_dependencies([
        tf.debugging.assert_positive(h * w, message="image is empty"),
        tf.debugging.assert_positive(tf.shape(positive_clicks)[0],
                                     message="at least one positive click is required")]):
      image = tf.identity(image)
    ex = {keys.IMAGE: image,
          keys.POSITIVE_CLICKS: tf.cast(positive_clicks, tf.int64),
          keys.NEGATIVE_CLICKS: tf.cast(negative_clicks, tf.int64)}
    raw = {k: v[None] for k, v in self.raw_model_input(ex).items()}
    prob = self._predict(self.model_input(raw))
    prob = tf.image.resize(prob[..., None], tf.stack([h, w]), method="bilinear")[0, :, :, 0]
    return {"probabilities": prob, "mask": tf.cast(prob > 0.5, tf.uint8)}

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
  def serve_examples(self, examples):
    spec = self._table.raw_feature_spec(
        [keys.IMAGE, keys.POSITIVE_CLICKS, keys.NEGATIVE_CLICKS])
    parsed = tf.io.parse_example(examples, spec)
    images = decode_feature(parsed[keys.IMAGE], self._table[keys.IMAGE], self._table.image_size)

    def one(args):
      image, pos, neg = args
      return self.raw_model_input({keys.IMAGE: image,
                                   keys.POSITIVE_CLICKS: tf.reshape(pos, [-1, 2]),
                                   keys.NEGATIVE_CLICKS: tf.reshape(neg, [-1, 2])})

    raw = self._batched_raw((images, tf.RaggedTensor.from_sparse(parsed[keys.POSITIVE_CLICKS]),
                             tf.RaggedTensor.from_sparse(parsed[keys.NEGATIVE_CLICKS])), one)
    prob = self._predict(self.model_input(raw))
    return {"probabilities": prob, "mask": tf.cast(prob > 0.5, tf.uint8)}

  def signatures(self):
    return {"serving_default": self.serve, "serve_examples": self.serve_examples}


class ClassificationServer(_Server):
  """Encoded images in; class probabilities and label strings out."""

  def __init__(self, model, tft_output: tft.TFTransformOutput, table: FeatureTable):
    super().__init__(model, tft_output, table)
    self.classes = tf.constant(tft_output.vocabulary_by_name(keys.LABEL_VOCABULARY))

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")])
  def serve(self, image_bytes):
    raw = self._batched_raw(image_bytes,
                            lambda data: self.raw_model_input({keys.IMAGE_BYTES: data}))
    logits = self.model(self.model_input(raw), training=False)
    prob = tf.nn.softmax(tf.cast(logits, tf.float32), axis=-1)
    return {"probabilities": prob, "label": tf.gather(self.classes, tf.argmax(prob, axis=-1)),
            "classes": self.classes}

  def signatures(self):
    return {"serving_default": self.serve}
