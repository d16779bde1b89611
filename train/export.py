"""The serving export: raw image + clicks in, mask out, preprocessing in-graph.

Layout, as TensorFlow Serving expects: `MODEL_DIR/export/<version>/`, where
the version is the Unix time of the export. The SavedModel is self-contained:
the tf.Transform graph is copied into it, so it keeps working after the
preprocessing output is deleted.

Signature `serving_default`:
  inputs   image            uint8 [H, W, 3], any size
           positive_clicks  int32 [P, 2], (x, y) = (column, row) in the image
           negative_clicks  int32 [N, 2], same; P and N may be 0
  outputs  probabilities    float32 [H, W], object probability
           mask             uint8 [H, W], 1 object, 0 background

In the graph, exactly as the Beam job built the records: the image is resized
to the records' size (bilinear, half-pixel centres, rounded to uint8), clicks
move to the pixel whose centre is nearest in the resized image, both distance
maps are computed by the TensorFlow twin of the Beam op, and the exported
tf.Transform layer standardizes them. Clicks outside the image are clamped to
its border.
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
  """Clicks in the input image -> pixel of nearest centre in the resized image."""
  c = tf.cast(tf.reshape(clicks_xy, [-1, 2]), tf.float32)
  sx = tf.cast(size, tf.float32) / tf.cast(width, tf.float32)
  sy = tf.cast(size, tf.float32) / tf.cast(height, tf.float32)
  x = tf.floor((c[:, 0] + 0.5) * sx)
  y = tf.floor((c[:, 1] + 0.5) * sy)
  out = tf.cast(tf.stack([x, y], axis=1), tf.int32)
  return tf.clip_by_value(out, 0, size - 1)


class SegmentationServer(tf.Module):
  """Holds the Keras 3 model and the tf.Transform (tf_keras) layer side by side."""

  def __init__(self, model, tft_output: tft.TFTransformOutput, image_size: int):
    super().__init__()
    self.model = model
    self.tft_layer = tft_output.transform_features_layer()
    self.image_size = image_size

  def _run(self, image, positive, negative):
    size = self.image_size
    h, w = tf.shape(image)[0], tf.shape(image)[1]
    small = resize_uint8(image, size)
    maps = distance.distance_maps(scale_clicks(positive, h, w, size),
                                  scale_clicks(negative, h, w, size), size, size)
    raw = {keys.IMAGE: to_raw_bytes(small)[None], keys.DISTANCE_MAPS: to_raw_bytes(maps)[None]}
    transformed = self.tft_layer(raw)
    logits = self.model(model_inputs(transformed), training=False)
    prob = tf.sigmoid(tf.cast(logits, tf.float32))
    prob = tf.image.resize(prob, tf.stack([h, w]), method="bilinear")[0, :, :, 0]
    return {"probabilities": prob, "mask": tf.cast(prob > 0.5, tf.uint8)}

  @tf.function(input_signature=[
      tf.TensorSpec([None, None, 3], tf.uint8, name="image"),
      tf.TensorSpec([None, 2], tf.int32, name="positive_clicks"),
      tf.TensorSpec([None, 2], tf.int32, name="negative_clicks"),
  ])
  def serve(self, image, positive_clicks, negative_clicks):
    tf.debugging.assert_positive(tf.size(image), message="image is empty")
    return self._run(image, positive_clicks, negative_clicks)


def export_segmentation(model, tft_output: tft.TFTransformOutput, model_dir: str,
                        image_size: int) -> str:
  """Writes `MODEL_DIR/export/<unix time>/` and returns its path."""
  server = SegmentationServer(model, tft_output, image_size)
  base = os.path.join(model_dir, "export")
  version = int(time.time())
  while tf.io.gfile.exists(os.path.join(base, str(version))):
    version += 1
  path = os.path.join(base, str(version))
  tf.saved_model.save(server, path, signatures={"serving_default": server.serve})
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
