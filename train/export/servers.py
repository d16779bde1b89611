"""The serving graph's servers: the twins, tf.Transform and the model in one
tf.Module per task, with its signatures (their contract: `train.export.saved_model`).

A task's training side names its server (`train.tasks`); `train.export.saved_model`
writes it as a SavedModel.
"""

from typing import Dict

import tensorflow as tf
import tensorflow_transform as tft
from tensorflow.python.trackable.data_structures import NoDependency  # pylint: disable=g-direct-tensorflow-import

from beam_prep import keys
from beam_prep.features import FeatureTable
from beam_prep.preprocessing import decode_feature
from train.evaluate import clicker
from train import graphs
from train.export import guided_filter
from train.export import signatures as sig
from train.export.serving_inputs import (
  Example,
  apply_tables,
  image_decoder,
  model_inputs,
  raw_inputs,
  run_plan,
  run_twins,
  serving_plan,
  serving_side,
  transform_tables,
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


# The box `_segment` takes for a request without one (x1 < x0: empty).
NO_BOX = (0, 0, -1, -1)


def _no_mask(image: tf.Tensor) -> tf.Tensor:
  """uint8 [H, W] zeros: no previous mask for `image`."""
  return tf.zeros(tf.shape(image)[:2], tf.uint8)


def _request(image, positive_clicks, negative_clicks, previous_mask: tf.Tensor) -> Example:
  """A click request as the twins take it (`previous_mask` bool)."""
  return {
    keys.IMAGE: image,
    keys.POSITIVE_CLICKS: tf.cast(positive_clicks, tf.int64),
    keys.NEGATIVE_CLICKS: tf.cast(negative_clicks, tf.int64),
    keys.PREVIOUS_MASK: previous_mask,
  }


def _none_box() -> tf.Tensor:
  return tf.constant(NO_BOX, tf.int32)


def _checked_box(box: tf.Tensor) -> tf.Tensor:
  """A box prompt, asserted to be corners in order (x0 <= x1, y0 <= y1)."""
  ordered = tf.logical_and(box[0] <= box[2], box[1] <= box[3])
  with tf.control_dependencies(
    [
      tf.debugging.Assert(
        ordered, [f"{sig.BOX}: must be [x0, y0, x1, y1] with x0 <= x1 and y0 <= y1"]
      )
    ]
  ):
    return tf.identity(box)


def box_region(box: tf.Tensor, height, width):
  """(region bool [height, width], has_box): the pixels of `box` (x0, y0, x1,
  y1, corners included, clamped into the image), all False for an empty box
  (`NO_BOX`)."""
  has_box = tf.logical_and(box[2] >= box[0], box[3] >= box[1])
  x0, x1 = tf.clip_by_value(box[0], 0, width - 1), tf.clip_by_value(box[2], 0, width - 1)
  y0, y1 = tf.clip_by_value(box[1], 0, height - 1), tf.clip_by_value(box[3], 0, height - 1)
  rows, cols = tf.range(height), tf.range(width)
  in_y = tf.logical_and(rows >= y0, rows <= y1)
  in_x = tf.logical_and(cols >= x0, cols <= x1)
  return tf.logical_and(tf.logical_and(in_y[:, None], in_x[None, :]), has_box), has_box


def box_centre(box: tf.Tensor, height, width) -> tf.Tensor:
  """int32 [2]: the (x, y) pixel at the centre of `box`, clamped into the image."""
  x = tf.clip_by_value((box[0] + box[2]) // 2, 0, width - 1)
  y = tf.clip_by_value((box[1] + box[3]) // 2, 0, height - 1)
  return tf.stack([x, y])


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
    tables, why = transform_tables(table, self._tft_layer)
    self._tables = NoDependency(tables)
    # Why the click signatures cannot go to TFLite or ONNX ("": they can).
    self.not_portable = why

  def _predict(self, inputs):
    logits = self.model(inputs, training=False)
    return tf.sigmoid(tf.cast(logits, tf.float32))[..., 0]

  def probabilities(self, image, positive_clicks, negative_clicks, previous_mask):
    """One image's object probabilities [H, W], float32, with no box (the
    NoC evaluation's call, `train.evaluate.noc`).

    Args:
      image: uint8 [H, W, 3].
      positive_clicks, negative_clicks: int [N, 2], (x, y) in the image.
      previous_mask: bool [H, W], the previous prediction; all False: none.
    """
    ex = _request(image, positive_clicks, negative_clicks, previous_mask)
    return self._source_probabilities(self._side.prepare(ex))

  def _source_probabilities(self, ex):
    """One request example through the twins, the transform and the model ->
    probabilities [H, W] at the request image's size, refined by the image's
    colours where the model saw it (`guided_filter`)."""
    image = ex[keys.IMAGE]
    h, w = tf.shape(image)[0], tf.shape(image)[1]
    out = run_twins(self._plan, ex)
    prob = self._predict(self.twins_model_input(out))[0]
    prob = self._side.to_request(prob, out, h, w)
    return guided_filter.refine(image, prob, self._side.seen(out, h, w))

  def twins_model_input(self, out: Example) -> tf.Tensor:
    """One example after the twins -> the model's input [1, S, S, C]: the
    transform's tables applied to its model inputs (`apply_tables`), or, for a
    transform that is not a table of each pixel's value, its model inputs as
    raw bytes through the exported transform."""
    if self._tables is not None:
      return apply_tables(self._table, self._tables, out)
    raw = {k: v[None] for k, v in raw_inputs(self._table, out).items()}
    return self.model_input(raw)

  @graphs.function(input_signature=sig.specs(sig.IMAGE, sig.BOX, *sig.CLICKS, sig.PREVIOUS_MASK))
  def _segment(self, image, box, positive_clicks, negative_clicks, previous_mask):
    """Every click signature's graph, traced once: one image's outputs for its
    clicks, previous mask (all zeros: none) and box (`NO_BOX`: none; else
    checked by `_checked_box`). A box is the serving side's crop
    (`prepare_box`), the positive click at its centre when none is given, the
    previous mask when none is given, and the mask is cut to it."""
    h, w = tf.shape(image)[0], tf.shape(image)[1]
    region, has_box = box_region(box, h, w)
    with tf.control_dependencies(
      self._request_checks(image, positive_clicks, previous_mask, has_box)
    ):
      # Every input waits for the checks, so no op meets a refused input first.
      image, previous_mask = tf.identity(image), tf.identity(previous_mask)
      positive_clicks = tf.identity(positive_clicks)
      negative_clicks = tf.identity(negative_clicks)
    positive = tf.cond(
      tf.logical_and(has_box, tf.equal(tf.shape(positive_clicks)[0], 0)),
      lambda: box_centre(box, h, w)[None],
      lambda: positive_clicks,
    )
    previous = tf.cast(previous_mask, tf.bool)
    # A box with no previous mask is the model's previous mask (where it takes one).
    previous = tf.logical_or(
      previous, tf.logical_and(region, tf.logical_not(tf.reduce_any(previous)))
    )
    ex = _request(image, positive, negative_clicks, previous)
    prob = self._source_probabilities(self._side.prepare_box(ex, region))
    inside = tf.logical_or(region, tf.logical_not(has_box))
    return _outputs(tf.where(inside, prob, tf.zeros_like(prob)))

  @staticmethod
  def _request_checks(image, positive_clicks, previous_mask, has_box):
    h, w = tf.shape(image)[0], tf.shape(image)[1]
    clicked = tf.logical_or(has_box, tf.shape(positive_clicks)[0] > 0)
    return [
      tf.debugging.assert_positive(h * w, message=sig.EMPTY_IMAGE),
      tf.debugging.Assert(clicked, [sig.NO_POSITIVE_CLICK]),
      tf.debugging.assert_equal(
        tf.shape(previous_mask),
        tf.stack([h, w]),
        message=sig.PREVIOUS_MASK_SIZE,
      ),
    ]

  @graphs.function(input_signature=sig.specs(*sig.CLICK_INPUTS))
  def serve(self, image, positive_clicks, negative_clicks):
    return self.serve_iterative(image, positive_clicks, negative_clicks, _no_mask(image))

  @graphs.function(input_signature=sig.specs(*sig.CLICK_INPUTS, sig.PREVIOUS_MASK))
  def serve_iterative(self, image, positive_clicks, negative_clicks, previous_mask):
    return self._segment(image, _none_box(), positive_clicks, negative_clicks, previous_mask)

  @graphs.function(input_signature=sig.specs(sig.IMAGE, sig.BOX, *sig.CLICKS))
  def serve_box(self, image, box, positive_clicks, negative_clicks):
    return self.serve_box_iterative(image, box, positive_clicks, negative_clicks, _no_mask(image))

  @graphs.function(input_signature=sig.specs(sig.IMAGE, sig.BOX, *sig.CLICKS, sig.PREVIOUS_MASK))
  def serve_box_iterative(self, image, box, positive_clicks, negative_clicks, previous_mask):
    box = _checked_box(box)
    return self._segment(image, box, positive_clicks, negative_clicks, previous_mask)

  @graphs.function(input_signature=sig.specs(*sig.ENCODED_CLICK_INPUTS, batch=True))
  def serve_encoded(self, image_bytes, positive_clicks, negative_clicks):
    return self._serve_encoded(image_bytes, positive_clicks, negative_clicks)

  @graphs.function(
    input_signature=sig.specs(*sig.ENCODED_CLICK_INPUTS, sig.PREVIOUS_MASK, batch=True)
  )
  def serve_iterative_encoded(self, image_bytes, positive_clicks, negative_clicks, previous_mask):
    return self._serve_encoded(image_bytes, positive_clicks, negative_clicks, previous_mask)

  @graphs.function(input_signature=sig.specs(sig.IMAGE_BYTES, sig.BOX, *sig.CLICKS, batch=True))
  def serve_box_encoded(self, image_bytes, box, positive_clicks, negative_clicks):
    return self._serve_encoded(image_bytes, positive_clicks, negative_clicks, box=box)

  def _serve_encoded(
    self, image_bytes, positive_clicks, negative_clicks, previous_mask=None, box=None
  ):
    """[B] encoded files, each decoded as the records' images were (the
    decode op's twin, `image_decoder`: EXIF orientation applied), given to
    `_segment` (the array signatures' graph) with its previous mask and box
    when given, and its answer encoded as PNG files (`_png_outputs`). Each
    image keeps its own size."""
    n = tf.shape(image_bytes)[0]
    # Every input waits for the check, so no op meets an empty batch first.
    with tf.control_dependencies(
      [
        tf.debugging.assert_positive(
          n, message=f"{sig.IMAGE_BYTES}: at least one image is required"
        )
      ]
    ):
      n, image_bytes = tf.identity(n), tf.identity(image_bytes)
    # [B, 0] ("[]" per instance, as TF Serving stacks it) is [B, 0, 2].
    clicks = [tf.reshape(c, [n, -1, 2]) for c in (positive_clicks, negative_clicks)]
    more = {} if previous_mask is None else {sig.PREVIOUS_MASK: previous_mask}
    more.update({} if box is None else {sig.BOX: box})

    def one(args):
      image = self._decode(args[0])
      given = args[3]
      previous = given[sig.PREVIOUS_MASK] if sig.PREVIOUS_MASK in given else _no_mask(image)
      box_ = _checked_box(given[sig.BOX]) if sig.BOX in given else _none_box()
      prob = self._segment(image, box_, args[1], args[2], previous)[sig.PROBABILITIES]
      return _png_outputs(prob)

    return tf.map_fn(
      one,
      (image_bytes, *clicks, more),
      fn_output_signature={k: tf.TensorSpec([], tf.string) for k in sig.ENCODED_OUTPUTS},
    )

  @graphs.function(input_signature=sig.specs(sig.IMAGE_BYTES))
  def _decode(self, image_bytes):
    """One encoded file -> its pixels [H, W, 3] (`image_decoder`), traced
    once for the three encoded signatures."""
    return image_decoder(self._table)(image_bytes)

  @graphs.function(input_signature=sig.specs(sig.EXAMPLES, batch=True))
  def serve_examples(self, examples):
    """[B] serialized tf.Examples of one (object, variant) each, in the example
    view (`RecordCodec.encode`: raw `image` bytes and int64 click lists), not
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
        f"records' size ({size} bytes, as RecordCodec.encode writes it)",
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
      sig.SERVE_BOX: self.serve_box,
      sig.SERVE_BOX_ITERATIVE: self.serve_box_iterative,
      sig.SERVE_BOX_ENCODED: self.serve_box_encoded,
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
