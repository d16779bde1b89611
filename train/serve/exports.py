"""The labels' file formats, as `beam-prep segmentation` reads them back.

The label store (`train.serve.store`) writes each saved image as

  DIR/images/NAME.EXT   the image: the file's own bytes when it was a file
                        (an upload, a file of --images), a PNG otherwise
  DIR/masks/NAME.png    its instance mask: 0 background, 1..N objects (the
                        `folders` layout's coding)
  DIR/instances.json    every image's objects as COCO instances (compressed
                        RLE; `file_name`s relative to DIR, `width`, `height`)

so DIR is the input of `beam-prep segmentation --layout folders --input DIR`
and of `--layout coco --input DIR/instances.json`, and both give the same
instance masks: the COCO objects may overlap, and the PNG paints them as the
coco layout paints them (`coco.paint_objects`: largest first, so a small
object on a large one stays visible).

An image is known by its pixels (`digest`), so opening the same image
again, as a file, an upload or from DIR, brings its objects back, clicks
included (each annotation's `clicks`, a field COCO readers skip); two
different images of one name are saved as NAME and NAME-2 (`stem_of`).
"""

import hashlib
import os
import posixpath
import re
from typing import Any, Dict, List

import numpy as np

from beam_prep import keys
from beam_prep.layouts import coco
from beam_prep.ops.image import decode_file

COCO_FILE = "instances.json"
CATEGORY = {"id": 1, "name": "object"}
INFO = {"description": "labels of the beam-train serve page"}
# Fields of ours in the COCO document (readers skip them): the images entry's
# pixels (`digest`) and who saved it, the annotation's clicks, the served
# model version that made its mask and when it was saved.
DIGEST, ORIGIN = "pixels_sha1", "origin"
CLICKS, MODEL_VERSION, SAVED = "clicks", "model_version", "saved"


def digest(image: np.ndarray) -> str:
  """The sha1 of an image's decoded pixels (and shape)."""
  h = hashlib.sha1(repr(image.shape).encode())
  h.update(np.ascontiguousarray(image).data)
  return h.hexdigest()


def file_digest(path: str) -> str:
  """The `digest` of an image file's decoded pixels."""
  with open(path, "rb") as f:
    return digest(decode_file(f.read()))


def instance_mask(masks: List[np.ndarray]) -> np.ndarray:
  """uint8 [H, W] of bool object masks: 0 background, objects 1..N painted
  as the coco layout paints them."""
  if len(masks) > coco.MAX_OBJECTS:
    raise ValueError(
      f"objects: an instance mask holds at most {coco.MAX_OBJECTS} objects, got {len(masks)}"
    )
  return coco.paint_objects(list(masks), np.full(masks[0].shape, keys.BACKGROUND, np.uint8))


def annotation(mask: np.ndarray, clicks: Dict[str, list]) -> Dict[str, Any]:
  """A COCO annotation of one object (no `id`, `image_id` yet): compressed RLE."""
  from pycocotools import mask as mask_utils  # pylint: disable=g-import-not-at-top

  rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
  return {
    "category_id": CATEGORY["id"],
    "iscrowd": 0,
    "segmentation": {
      "size": [int(v) for v in rle["size"]],
      "counts": rle["counts"].decode("ascii"),
    },
    "area": int(mask_utils.area(rle)),
    "bbox": [float(v) for v in mask_utils.toBbox(rle)],
    CLICKS: clicks,
  }


def object_mask(ann: Dict[str, Any]) -> np.ndarray:
  """bool [H, W] of an annotation written by `annotation`."""
  from pycocotools import mask as mask_utils  # pylint: disable=g-import-not-at-top

  seg = ann["segmentation"]
  return mask_utils.decode({"size": seg["size"], "counts": seg["counts"].encode("ascii")}) > 0


def entries_of(doc: Dict[str, Any]) -> List[Dict[str, Any]]:
  """The entries of a COCO document the label store wrote (`store.Labels`:
  each image's fields and its annotations without ids), objects in id order."""
  by_image = {}
  for ann in sorted(doc.get("annotations", []), key=lambda a: a["id"]):
    seg = ann["segmentation"]
    if not (isinstance(seg, dict) and isinstance(seg.get("counts"), str)):
      raise ValueError(f"annotation {ann['id']}: not a compressed RLE")
    by_image.setdefault(ann["image_id"], []).append(
      {k: v for k, v in ann.items() if k not in ("id", "image_id")}
    )
  return [
    {**{k: v for k, v in image.items() if k != "id"}, "annotations": by_image.get(image["id"], [])}
    for image in doc.get("images", [])
  ]


def stem_of(name: str) -> str:
  """A file stem for an image's name: its path without the extension, '/'
  as '_', only letters, digits, '.', '_' and '-', not hidden (a leading '.'
  would hide the file from beam-prep's listing)."""
  base = posixpath.splitext(name.replace("\\", "/").strip("/"))[0]
  return re.sub(r"[^A-Za-z0-9._-]+", "_", base.replace("/", "_")).lstrip("._-")[:100] or "image"


def suffix_of(name: str) -> str:
  """The image file's suffix when its bytes can be kept as they are, else ''."""
  suffix = posixpath.splitext(name)[1].lower()
  return suffix if suffix in keys.IMAGE_SUFFIXES else ""


def write_file(path: str, data: bytes) -> None:
  """Writes a file whole: a hidden temporary beside it, then renamed (a
  reader sees the old file or the new one, never a part)."""
  tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.tmp")
  with open(tmp, "wb") as f:
    f.write(data)
  os.replace(tmp, path)
