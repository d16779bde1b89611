"""The serving graph's servers: the twins, tf.Transform and the model in one
tf.Module per task, with its signatures (their contract: `train.export`).

A task's training side names its server (`train.tasks`); `train.export`
writes it as a SavedModel.
"""

from typing import Dict

import tensorflow as tf
import tensorflow_transform as tft
from tensorflow.python.trackable.data_structures import NoDependency  # pylint: disable=g-direct-tensorflow-import

from beam_prep import keys
from beam_prep.features import FeatureTable
from beam_prep.preprocessing import decode_feature
from train import clicker, graphs
from train import signatures as sig
from train.serving_inputs import (
  Example,
  image_decoder,
  model_inputs,
  raw_inputs,
  run_plan,
  run_twins,
  serving_plan,
  serving_side,
)


def _outputs(prob: tf.Tensor) -> Dict[str, tf.Tensor]:
  """A segmentation signature's outputs: the probabilities and the protocol's mask."""
  return {sig.PROBABILITIES: prob, sig.MASK: tf.cast(prob > clicker.PRED_THR, tf.uint8)}


def _png(image: tf.Tensor) -> tf.Tensor:
  """uint8 [H, W] -> a greyscale PNG file, zlib's fastest level (a 512x600
  probability map: 8 ms and 150 kB; the default level: 58 ms and 134 kB)."""
  return tf.io.encode_png(image[..., None], compression=1)


def _png_outputs(prob: tf.Tensor) -> Dict[str, tf.Tensor]:
  """One image's probabilities [H, W] -> the encoded signatures' outputs:
  the protocol's mask (`_outputs`) as a PNG of 0 / 255, the probabilities as
  a PNG of grey levels round(p * 255)."""
  grey = tf.round(tf.clip_by_value(prob, 0.0, 1.0) * 255.0)
  return {
    sig.MASK_BYTES: _png(_outputs(prob)[sig.MASK] * 255),
    sig.PROBABILITIES_BYTES: _png(tf.cast(grey, tf.uint8)),
  }


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
    # tf.Transform's layer is a tf_keras model: saved as one, tf_keras traces
    # and describes it again (seconds per export). What the SavedModel needs
    # is what the layer itself tracks: the loaded transform graph, its
    # resources and assets. The module tracks that and calls the layer.
    layer = tft_output.transform_features_layer()
    self._tft_layer = NoDependency(layer)
    self.tft_graph = layer._saved_model_loader_tracked_dict  # pylint: disable=protected-access
    self._table = table
    self._plan = serving_plan(table)

  def raw_model_input(self, ex: Example) -> Dict[str, tf.Tensor]:
    """One request example -> {model input key: raw bytes scalar}, by the twins."""
    return run_plan(self._plan, self._table, ex)

  def model_input(self, raw: Dict[str, tf.Tensor]) -> tf.Tensor:
    """[B] raw bytes per model input -> the model's input [B, H, W, C]."""
    return model_inputs(self._table, self._tft_layer(raw))

  def batched_raw(self, elems, fn):
    """`fn` (one request example -> raw model inputs) mapped over a batch `elems`."""
    keys_ = self._table.keys("model_input")
    sig = {k: tf.TensorSpec([], tf.string) for k in keys_}
    return tf.map_fn(fn, elems, fn_output_signature=sig)


class SegmentationServer(_Server):
  """Image and clicks in, mask out.

  The chain's op that changes the image's geometry frames the request and
  places the prediction back (its serving side, `serving_inputs.serving_side`):
  with object-centred crop records, the model sees the crop of the previous
  mask and the positive clicks, found first when there is none, and
  probabilities outside the crop are 0; with whole-image records, the output
  is resized back to the request's image.
  """

  def __init__(self, model, tft_output: tft.TFTransformOutput, table: FeatureTable):
    super().__init__(model, tft_output, table)
    self._side = serving_side(table)

  def _predict(self, inputs):
    logits = self.model(inputs, training=False)
    return tf.sigmoid(tf.cast(logits, tf.float32))[..., 0]

  def probabilities(self, image, positive_clicks, negative_clicks, previous_mask):
    """One image's object probabilities [H, W], float32.

    Args:
      image: uint8 [H, W, 3].
      positive_clicks, negative_clicks: int [N, 2], (x, y) in the image.
      previous_mask: bool [H, W], the previous prediction; all False: none.
    """
    ex = {
      keys.IMAGE: image,
      keys.POSITIVE_CLICKS: tf.cast(positive_clicks, tf.int64),
      keys.NEGATIVE_CLICKS: tf.cast(negative_clicks, tf.int64),
      keys.PREVIOUS_MASK: previous_mask,
    }
    return self._source_probabilities(self._side.prepare(ex))

  def _source_probabilities(self, ex):
    """One request example through the twins, the transform and the model ->
    probabilities [H, W] at the request image's size."""
    shape = tf.shape(ex[keys.IMAGE])
    out = run_twins(self._plan, ex)
    raw = {k: v[None] for k, v in raw_inputs(self._table, out).items()}
    prob = self._predict(self.model_input(raw))[0]
    return self._side.to_request(prob, out, shape[0], shape[1])

  def _serve(self, image, positive_clicks, negative_clicks, previous_mask):
    h, w = tf.shape(image)[0], tf.shape(image)[1]
    with tf.control_dependencies(
      [
        tf.debugging.assert_positive(h * w, message="image: the image is empty"),
        tf.debugging.assert_positive(
          tf.shape(positive_clicks)[0],
          message="positive_clicks: at least one positive click is required",
        ),
        tf.debugging.assert_equal(
          tf.shape(previous_mask),
          tf.stack([h, w]),
          message="previous_mask: must have the image's height and width",
        ),
      ]
    ):
      image = tf.identity(image)
    prob = self.probabilities(
      image, positive_clicks, negative_clicks, tf.cast(previous_mask, tf.bool)
    )
    return _outputs(prob)

  @graphs.function(input_signature=sig.specs(*sig.CLICK_INPUTS))
  def serve(self, image, positive_clicks, negative_clicks):
    """`serve_iterative` with no previous mask (all zeros): its graph, traced once
    for both signatures."""
    shape = tf.shape(image)
    return self.serve_iterative(
      image, positive_clicks, negative_clicks, tf.zeros(shape[:2], tf.uint8)
    )

  @graphs.function(input_signature=sig.specs(*sig.CLICK_INPUTS, sig.PREVIOUS_MASK))
  def serve_iterative(self, image, positive_clicks, negative_clicks, previous_mask):
    return self._serve(image, positive_clicks, negative_clicks, previous_mask)

  @graphs.function(input_signature=sig.specs(*sig.ENCODED_CLICK_INPUTS, batch=True))
  def serve_encoded(self, image_bytes, positive_clicks, negative_clicks):
    return self._serve_encoded(image_bytes, positive_clicks, negative_clicks)

  @graphs.function(
    input_signature=sig.specs(*sig.ENCODED_CLICK_INPUTS, sig.PREVIOUS_MASK, batch=True)
  )
  def serve_iterative_encoded(self, image_bytes, positive_clicks, negative_clicks, previous_mask):
    return self._serve_encoded(image_bytes, positive_clicks, negative_clicks, previous_mask)

  def _serve_encoded(self, image_bytes, positive_clicks, negative_clicks, previous_mask=None):
    """[B] encoded files, each decoded as the records' images were (the
    decode op's twin, `image_decoder`: EXIF orientation applied), given to `serve` (no previous
    mask) or `serve_iterative`, the
    array signatures' own functions, and its answer encoded as PNG files
    (`_png_outputs`). Each image keeps its own size."""
    n = tf.shape(image_bytes)[0]
    # [B, 0] ("[]" per instance, as TF Serving stacks it) is [B, 0, 2].
    clicks = [tf.reshape(c, [n, -1, 2]) for c in (positive_clicks, negative_clicks)]
    elems = (image_bytes, *clicks) + (() if previous_mask is None else (previous_mask,))

    pixels_of = image_decoder(self._table)

    def one(args):
      image = pixels_of(args[0])
      if previous_mask is None:
        prob = self.serve(image, args[1], args[2])[sig.PROBABILITIES]
      else:
        prob = self.serve_iterative(image, args[1], args[2], args[3])[sig.PROBABILITIES]
      return _png_outputs(prob)

    with tf.control_dependencies(
      [
        tf.debugging.assert_positive(
          n, message=f"{sig.IMAGE_BYTES}: at least one image is required"
        )
      ]
    ):
      return tf.map_fn(
        one,
        elems,
        fn_output_signature={k: tf.TensorSpec([], tf.string) for k in sig.ENCODED_OUTPUTS},
      )

  @graphs.function(input_signature=sig.specs(sig.EXAMPLES, batch=True))
  def serve_examples(self, examples):
    """[B] serialized tf.Examples of one (object, variant) each, in the example
    view (`FeatureTable.encode`: raw `image` bytes and int64 click lists), not
    the job's records, which stack an object's variants."""
    spec = self._table.raw_feature_spec([keys.IMAGE, keys.POSITIVE_CLICKS, keys.NEGATIVE_CLICKS])
    parsed = tf.io.parse_example(examples, spec)
    clicks = {k: tf.RaggedTensor.from_sparse(parsed[k]) for k in sig.CLICKS}
    with tf.control_dependencies(self._example_checks(parsed[keys.IMAGE], clicks)):
      images = decode_feature(parsed[keys.IMAGE], self._table[keys.IMAGE], self._table.image_size)

    def one(args):
      image, pos, neg = args
      ex = {
        keys.IMAGE: image,
        keys.POSITIVE_CLICKS: tf.reshape(pos, [-1, 2]),
        keys.NEGATIVE_CLICKS: tf.reshape(neg, [-1, 2]),
      }
      ex.update(self._side.frame())
      return self.raw_model_input(ex)

    raw = self.batched_raw(
      (images, clicks[keys.POSITIVE_CLICKS], clicks[keys.NEGATIVE_CLICKS]), one
    )
    prob = self._predict(self.model_input(raw))
    return _outputs(prob)

  def _example_checks(self, image, clicks):
    """Assertions that each parsed example of `serve_examples` holds what it
    reads, each message naming the feature."""
    h, w = self._table.image_size
    size = self._table.example_view[keys.IMAGE].stored_bytes(self._table.image_size)
    where = f"{sig.EXAMPLES}: feature"
    checks = [
      tf.debugging.assert_equal(
        tf.strings.length(image),
        size,
        message=f"{where} '{keys.IMAGE}' must hold the raw bytes of uint8 [{h}, {w}, 3], the "
        f"records' size ({size} bytes, as FeatureTable.encode writes it)",
      ),
      tf.debugging.assert_positive(
        clicks[keys.POSITIVE_CLICKS].row_lengths(),
        message=f"{where} '{keys.POSITIVE_CLICKS}': each example needs a positive click",
      ),
    ]
    for k, c in clicks.items():
      checks.append(
        tf.debugging.assert_equal(
          c.row_lengths() % 2,
          tf.constant(0, tf.int64),
          message=f"{where} '{k}' must hold (x, y) pairs: an even number of values",
        )
      )
    return checks

  def signatures(self):
    return {
      sig.SERVING_DEFAULT: self.serve,
      sig.SERVE_ITERATIVE: self.serve_iterative,
      sig.SERVE_ENCODED: self.serve_encoded,
      sig.SERVE_ITERATIVE_ENCODED: self.serve_iterative_encoded,
      sig.SERVE_EXAMPLES: self.serve_examples,
    }


class ClassificationServer(_Server):
  """Encoded images in; class probabilities and label strings out."""

  def __init__(self, model, tft_output: tft.TFTransformOutput, table: FeatureTable):
    super().__init__(model, tft_output, table)
    self.classes = tf.constant(tft_output.vocabulary_by_name(keys.LABEL_VOCABULARY))

  @graphs.function(input_signature=sig.specs(sig.IMAGE_BYTES, batch=True))
  def serve(self, image_bytes):
    raw = self.batched_raw(image_bytes, lambda data: self.raw_model_input({keys.IMAGE_BYTES: data}))
    logits = self.model(self.model_input(raw), training=False)
    prob = tf.nn.softmax(tf.cast(logits, tf.float32), axis=-1)
    return {
      sig.PROBABILITIES: prob,
      sig.LABEL: tf.gather(self.classes, tf.argmax(prob, axis=-1)),
      sig.CLASSES: self.classes,
    }

  def signatures(self):
    return {sig.SERVING_DEFAULT: self.serve}
