"""The tf.Transform side: raw record schema, example encoding, preprocessing_fn.

Records keep the heavy features compact (raw uint8 bytes); the cheap part that
depends on full-pass statistics is the exported graph, which the trainer and
the serving model both apply. See `beam_prep.keys` for the data contract.
"""

from typing import Any, Callable, Dict

import numpy as np
import tensorflow as tf
import tensorflow_transform as tft

from beam_prep import keys


def raw_feature_spec() -> Dict[str, Any]:
  """Feature spec of the records (the tf.Transform raw schema)."""
  return {
      keys.IMAGE_ID: tf.io.FixedLenFeature([], tf.string),
      keys.OBJECT_ID: tf.io.FixedLenFeature([], tf.int64),
      keys.VARIANT: tf.io.FixedLenFeature([], tf.int64),
      keys.HEIGHT: tf.io.FixedLenFeature([], tf.int64),
      keys.WIDTH: tf.io.FixedLenFeature([], tf.int64),
      keys.IMAGE: tf.io.FixedLenFeature([], tf.string),
      keys.DISTANCE_MAPS: tf.io.FixedLenFeature([], tf.string),
      keys.MASK: tf.io.FixedLenFeature([], tf.string),
      keys.POSITIVE_CLICKS: tf.io.VarLenFeature(tf.int64),
      keys.NEGATIVE_CLICKS: tf.io.VarLenFeature(tf.int64),
      keys.NEGATIVE_STRATEGY: tf.io.FixedLenFeature([], tf.int64),
      keys.FLIPPED: tf.io.FixedLenFeature([], tf.int64),
  }


def classification_raw_feature_spec() -> Dict[str, Any]:
  """Feature spec of classification records."""
  return {
      keys.IMAGE_ID: tf.io.FixedLenFeature([], tf.string),
      keys.HEIGHT: tf.io.FixedLenFeature([], tf.int64),
      keys.WIDTH: tf.io.FixedLenFeature([], tf.int64),
      keys.IMAGE: tf.io.FixedLenFeature([], tf.string),
      keys.LABEL: tf.io.FixedLenFeature([], tf.string),
  }


def raw_schema(spec: Dict[str, Any] = None):
  """A raw feature spec (default: segmentation) as a TFMD Schema."""
  from tensorflow_transform.tf_metadata import schema_utils  # pylint: disable=g-import-not-at-top
  return schema_utils.schema_from_feature_spec(spec or raw_feature_spec())


def _bytes(v: bytes) -> tf.train.Feature:
  return tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))


def _ints(v) -> tf.train.Feature:
  return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(x) for x in np.ravel(v)]))


def encode_example(ex: Dict[str, Any]) -> bytes:
  """Serializes one finished example dict into a tf.Example in the raw schema."""
  image = np.ascontiguousarray(ex["image"], dtype=np.uint8)
  maps = np.ascontiguousarray(ex["distance_maps"], dtype=np.uint8)
  mask = np.ascontiguousarray(ex["mask"], dtype=np.uint8)
  h, w = image.shape[:2]
  if maps.shape != (h, w, 2) or mask.shape != (h, w):
    raise ValueError(f"inconsistent shapes: image {image.shape}, maps {maps.shape}, "
                     f"mask {mask.shape}")
  feature = {
      keys.IMAGE_ID: _bytes(ex["image_id"].encode("utf-8")),
      keys.OBJECT_ID: _ints([ex["object_id"]]),
      keys.VARIANT: _ints([ex["variant"]]),
      keys.HEIGHT: _ints([h]),
      keys.WIDTH: _ints([w]),
      keys.IMAGE: _bytes(image.tobytes()),
      keys.DISTANCE_MAPS: _bytes(maps.tobytes()),
      keys.MASK: _bytes(mask.tobytes()),
      keys.POSITIVE_CLICKS: _ints(ex["positive_clicks"]),
      keys.NEGATIVE_CLICKS: _ints(ex["negative_clicks"]),
      keys.NEGATIVE_STRATEGY: _ints([ex.get("negative_strategy", 0)]),
      keys.FLIPPED: _ints([ex.get("flipped", 0)]),
  }
  return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def encode_classification_example(ex: Dict[str, Any]) -> bytes:
  """Serializes a decoded, resized, labelled image into a classification record."""
  image = np.ascontiguousarray(ex["image"], dtype=np.uint8)
  h, w = image.shape[:2]
  feature = {
      keys.IMAGE_ID: _bytes(ex["image_id"].encode("utf-8")),
      keys.HEIGHT: _ints([h]),
      keys.WIDTH: _ints([w]),
      keys.IMAGE: _bytes(image.tobytes()),
      keys.LABEL: _bytes(ex["label"].encode("utf-8")),
  }
  return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def decode_raw_image(raw: tf.Tensor, height: int, width: int, channels: int) -> tf.Tensor:
  """[B] raw uint8 bytes -> uint8 [B, height, width, channels] (channels 0: no axis)."""
  shape = [-1, height, width] + ([channels] if channels else [])
  return tf.reshape(tf.io.decode_raw(raw, tf.uint8), shape)


def make_preprocessing_fn(height: int, width: int) -> Callable[[Dict[str, tf.Tensor]], Dict[str, tf.Tensor]]:
  """Builds the segmentation preprocessing_fn for records of height x width.

  Full-pass analyzers: per-channel mean and standard deviation of the image
  over every pixel of the analyzed split (`standardize_image`).

  Outputs: standardized `image`, `distance_maps` scaled to [0, 1], and, when
  the raw `mask` is given (training, not serving), `label` and
  `label_weight` (0 on ignore pixels).
  """

  def preprocessing_fn(inputs):
    image = tf.cast(decode_raw_image(inputs[keys.IMAGE], height, width, 3), tf.float32)
    maps = decode_raw_image(inputs[keys.DISTANCE_MAPS], height, width, 2)
    mask = decode_raw_image(inputs[keys.MASK], height, width, 0)
    return {
        keys.IMAGE: standardize_image(image),
        keys.DISTANCE_MAPS: tf.cast(maps, tf.float32) / float(keys.MAX_DISTANCE),
        keys.LABEL: tf.cast(tf.equal(mask, 1), tf.float32),
        keys.LABEL_WEIGHT: tf.cast(tf.not_equal(mask, keys.IGNORE), tf.float32),
    }

  return preprocessing_fn


def standardize_image(image: tf.Tensor) -> tf.Tensor:
  """float32 [B, H, W, 3] -> per-channel standardized, by full-pass analyzers.

  The mean and the mean of squares are analyzed over every image of the
  split (all one size, so the mean of per-image means is the pixel mean).
  """
  per_image_mean = tf.reduce_mean(image, axis=[1, 2])
  per_image_sq = tf.reduce_mean(tf.square(image), axis=[1, 2])
  mean = tft.mean(per_image_mean, reduce_instance_dims=False, name="image_mean")
  mean_sq = tft.mean(per_image_sq, reduce_instance_dims=False, name="image_mean_square")
  std = tf.sqrt(tf.maximum(mean_sq - tf.square(mean), 1e-6))
  return (image - mean) / std


def make_classification_preprocessing_fn(height: int, width: int):
  """Builds the classification preprocessing_fn: standardized image, label id.

  The label vocabulary is a full-pass analyzer too
  (`compute_and_apply_vocabulary`, most frequent class first); the serving
  model reads the class names back from it.
  """

  def preprocessing_fn(inputs):
    image = tf.cast(decode_raw_image(inputs[keys.IMAGE], height, width, 3), tf.float32)
    return {
        keys.IMAGE: standardize_image(image),
        keys.LABEL: tft.compute_and_apply_vocabulary(
            inputs[keys.LABEL], vocab_filename=keys.LABEL_VOCABULARY, num_oov_buckets=0,
            default_value=-1),
    }

  return preprocessing_fn
