"""Eval images at their own size: one record per eval image, for NoC at source resolution.

The field's evaluation places clicks and computes IoU on the original image,
not on the records' resized copy. So for each image of the eval split the
job also writes, once whatever the variants, the image as decoded (EXIF
orientation applied) and its instance mask, at their own size, both as
lossless PNG:

| key             | kind   | meaning                                              |
|-----------------|--------|------------------------------------------------------|
| `image_id`      | string | the input's image id                                 |
| `image_png`     | bytes  | uint8 RGB [H, W, 3], PNG                             |
| `instance_png`  | bytes  | uint8 [H, W]: 0 background, 1..254 objects, 255 ignore |
| `height`, `width` | int64 | H, W                                                |

They live beside the records as `records/source-SSSSS-of-NNNNN.tfrecord`
(`SPLIT`). Every object of the mask is evaluated, none dropped for being
small, unless the evaluation is asked to (`train.evaluate.source_eval`'s `--min-area`).
"""

import io
from typing import Any, Dict

import numpy as np
from PIL import Image

from beam_prep import keys
from beam_prep.drawing import png

SPLIT = "source"
IMAGE_PNG, INSTANCE_PNG = "image_png", "instance_png"


def encode(ex: Dict[str, Any]) -> bytes:
  """A decoded example (`image`, `instance_mask`) -> a serialized tf.Example."""
  from tensorflow.core.example import example_pb2, feature_pb2  # pylint: disable=g-import-not-at-top

  image, mask = ex[keys.IMAGE], ex[keys.INSTANCE_MASK]
  as_bytes = lambda v: feature_pb2.Feature(bytes_list=feature_pb2.BytesList(value=[v]))
  as_int = lambda v: feature_pb2.Feature(int64_list=feature_pb2.Int64List(value=[int(v)]))
  features = {
    keys.IMAGE_ID: as_bytes(str(ex[keys.IMAGE_ID]).encode()),
    IMAGE_PNG: as_bytes(png(image)),
    INSTANCE_PNG: as_bytes(png(mask)),
    keys.HEIGHT: as_int(image.shape[0]),
    keys.WIDTH: as_int(image.shape[1]),
  }
  return example_pb2.Example(features=feature_pb2.Features(feature=features)).SerializeToString(
    deterministic=True
  )


def decode(serialized: bytes) -> Dict[str, Any]:
  """A source record -> {image_id, image uint8 [H, W, 3], instance_mask uint8 [H, W]}."""
  from tensorflow.core.example import example_pb2  # pylint: disable=g-import-not-at-top

  f = example_pb2.Example.FromString(serialized).features.feature
  text = lambda k: f[k].bytes_list.value[0].decode()
  image = np.asarray(Image.open(io.BytesIO(f[IMAGE_PNG].bytes_list.value[0])).convert("RGB"))
  mask = np.asarray(Image.open(io.BytesIO(f[INSTANCE_PNG].bytes_list.value[0])))
  return {keys.IMAGE_ID: text(keys.IMAGE_ID), keys.IMAGE: image, keys.INSTANCE_MASK: mask}
