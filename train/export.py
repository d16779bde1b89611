"""The serving export: raw inputs in, predictions out, preprocessing in-graph.

Layout, as TensorFlow Serving expects: `MODEL_DIR/export/<version>/`, the
version being the Unix time of the export. The SavedModel is self-contained:
the tf.Transform graph (and its vocabulary) is copied into it, so it keeps
working after the preprocessing output is deleted.

Segmentation, signature `serving_default` (one image per request):
  inputs   image            uint8 [H, W, 3], any size
           positive_clicks  int32 [P, 2], (x, y) = (column, row); P >= 1
           negative_clicks  int32 [N, 2], same; N may be 0
  outputs  probabilities    float32 [H, W], object probability
           mask             uint8 [H, W], 1 object, 0 background
The image is a decoded uint8 array rather than PNG/JPEG bytes so that the
graph sees exactly the pixels the Beam job saw (no second JPEG decoder that
may round differently); `beam-train predict` decodes files for you. Clicks
outside the image are clamped to its border; no positive click, or an empty
image, is an InvalidArgument error for that request.

Segmentation, signature `serve_examples` (batch scoring, TFX convention):
  inputs   examples         string [B]: serialized tf.Examples in the raw
                            schema; `image` (raw uint8 bytes at the records'
                            size), `positive_clicks`, `negative_clicks` are
                            read, anything else is ignored
  outputs  probabilities    float32 [B, S, S]; mask uint8 [B, S, S]

Classification, signature `serving_default`:
  inputs   image_bytes      string [B]: encoded PNG/JPEG/BMP/GIF files
  outputs  probabilities    float32 [B, C]; label string [B]; classes string [C]

In each graph, exactly as the Beam job built the records: resize to the
records' size (bilinear, half-pixel centres, rounded to uint8), clicks moved
to the pixel of nearest centre, both distance maps by the TensorFlow twin of
the Beam op, then the exported tf.Transform layer and the model.
"""

import os
import time

import tensorflow as tf
import tensorflow_transform as tft

from beam_prep import keys
from train import distance
from train.data import model_inputs

# raw bytes <-> uint8 tensors: the records hold `ndarray.tobytes()`; in the
# graph, a uint8 tensor becomes those same bytes by joining one-byte strings.
_BYTE_TABLE = [bytes([i]) for i in range(256)]


def to_raw_bytes(x: tf.Tensor) -> tf.Tensor:
  """uint8 tensor -> scalar string of its row-major bytes (numpy's tobytes)."""
  table = tf.constant(_BYTE_TABLE)
  return tf.strings.reduce_join(tf.gather(table, tf.reshape(tf.cast(x, tf.int32), [-1])))


def resize_uint8(image: tf.Tensor, size: int) -> tf.Tensor:
  """The Beam `resize` op in TensorFlow: bilinear, half-pixel, round half to even."""
  resized = tf.image.resize(tf.cast(image, tf.float32)[None], [size, size],
                            method="bilinear", antialias=False)[0]
  return tf.cast(tf.clip_by_value(tf.round(resized), 0, 255), tf.uint8)


def scale_clicks(clicks_xy: tf.Tensor, height, width, size: int) -> tf.Tensor:
  """Clicks in the input image -> pixel of nearest centre in the resized image.

  Coordinates outside the image are clamped to its border.
  """
  c = tf.cast(tf.reshape(clicks_xy, [-1, 2]), tf.float32)
  sx = tf.cast(size, tf.float32) / tf.cast(width, tf.float32)
  sy = tf.cast(size, tf.float32) / tf.cast(height, tf.float32)
  x = tf.floor((c[:, 0] + 0.5) * sx)
  y = tf.floor((c[:, 1] + 0.5) * sy)
  out = tf.cast(tf.stack([x, y], axis=1), tf.int32)
  return tf.clip_by_value(out, 0, size - 1)


class _Server(tf.Module):
  """Holds the Keras 3 model and the tf.Transform (tf_keras) layer side by side."""

  def __init__(self, model, tft_output: tft.TFTransformOutput, image_size: int):
    super().__init__()
    self.model = model
    # Keras 3 variables wrap tf.Variables. Saved only through the wrappers,
    # the SavedModel loads in TF2 but not in session-based loaders
    # (TensorFlow Serving, saved_model_cli run: "Could not find variable").
    # Tracking the underlying tf.Variables as well fixes both.
    self.model_tf_variables = [v.value if hasattr(v, "value") else v for v in model.variables]
    self.tft_layer = tft_output.transform_features_layer()
    self.image_size = image_size


class SegmentationServer(_Server):
  """Image and clicks in, mask out."""

  def __init__(self, model, tft_output: tft.TFTransformOutput, image_size: int):
    super().__init__(model, tft_output, image_size)
    spec = tft_output.raw_feature_spec()
    self._example_spec = {k: spec[k] for k in (keys.IMAGE, keys.POSITIVE_CLICKS,
                                                keys.NEGATIVE_CLICKS)}

  def model_input(self, image_bytes: tf.Tensor, maps_bytes: tf.Tensor) -> tf.Tensor:
    """[B] raw image and map bytes at the records' size -> the model's input."""
    transformed = self.tft_layer({keys.IMAGE: image_bytes, keys.DISTANCE_MAPS: maps_bytes})
    return model_inputs(transformed)

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
      size = self.image_size
      small = resize_uint8(image, size)
    maps = distance.distance_maps(scale_clicks(positive_clicks, h, w, size),
                                  scale_clicks(negative_clicks, h, w, size), size, size)
    prob = self._predict(self.model_input(to_raw_bytes(small)[None], to_raw_bytes(maps)[None]))
    prob = tf.image.resize(prob[..., None], tf.stack([h, w]), method="bilinear")[0, :, :, 0]
    return {"probabilities": prob, "mask": tf.cast(prob > 0.5, tf.uint8)}

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
  def serve_examples(self, examples):
    parsed = tf.io.parse_example(examples, self._example_spec)
    size = self.image_size

    def maps_of(args):
      pos, neg = args
      return to_raw_bytes(distance.distance_maps(tf.reshape(pos, [-1, 2]),
                                                 tf.reshape(neg, [-1, 2]), size, size))

    pos_rt = tf.RaggedTensor.from_sparse(parsed[keys.POSITIVE_CLICKS])
    neg_rt = tf.RaggedTensor.from_sparse(parsed[keys.NEGATIVE_CLICKS])
    maps = tf.map_fn(maps_of, (pos_rt, neg_rt),
                     fn_output_signature=tf.TensorSpec([], tf.string))
    prob = self._predict(self.model_input(parsed[keys.IMAGE], maps))
    return {"probabilities": prob, "mask": tf.cast(prob > 0.5, tf.uint8)}


class ClassificationServer(_Server):
  """Encoded images in; class probabilities and label strings out."""

  def __init__(self, model, tft_output: tft.TFTransformOutput, image_size: int):
    super().__init__(model, tft_output, image_size)
    self.classes = tf.constant(tft_output.vocabulary_by_name(keys.LABEL_VOCABULARY))

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")])
  def serve(self, image_bytes):
    size = self.image_size

    def raw_of(data):
      image = tf.io.decode_image(data, channels=3, expand_animations=False)
      return to_raw_bytes(resize_uint8(image, size))

    raw = tf.map_fn(raw_of, image_bytes, fn_output_signature=tf.TensorSpec([], tf.string))
    transformed = self.tft_layer({keys.IMAGE: raw})
    logits = self.model(model_inputs(transformed), training=False)
    prob = tf.nn.softmax(tf.cast(logits, tf.float32), axis=-1)
    return {"probabilities": prob, "label": tf.gather(self.classes, tf.argmax(prob, axis=-1)),
            "classes": self.classes}


def export_model(model, tft_output: tft.TFTransformOutput, task, model_dir: str) -> str:
  """Writes `MODEL_DIR/export/<unix time>/` for the task and returns its path."""
  if task.name == "segmentation":
    server = SegmentationServer(model, tft_output, task.image_size)
    signatures = {"serving_default": server.serve, "serve_examples": server.serve_examples}
  else:
    server = ClassificationServer(model, tft_output, task.image_size)
    signatures = {"serving_default": server.serve}
  base = os.path.join(model_dir, "export")
  version = int(time.time())
  while tf.io.gfile.exists(os.path.join(base, str(version))):
    version += 1
  path = os.path.join(base, str(version))
  tf.saved_model.save(server, path, signatures=signatures)
  return path


def latest_export(model: str) -> str:
  """An export folder: `model` itself, or the newest version under model/export/."""
  if tf.io.gfile.exists(os.path.join(model, "saved_model.pb")):
    return model
  base = os.path.join(model, "export")
  versions = [v.rstrip("/") for v in tf.io.gfile.listdir(base)] if tf.io.gfile.isdir(base) else []
  versions = sorted((int(v) for v in versions if v.isdigit()), reverse=True)
  if not versions:
    raise FileNotFoundError(f"no SavedModel at {model} and no export under {base}")
  return os.path.join(base, str(versions[0]))
