"""The page's labels, kept as `beam-prep segmentation` reads them back.

With `beam-train serve --save-dir DIR`, each image the page labels is written

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

Without a save dir the labels are kept in memory for the server's life (the
page's COCO download is the same document). An image is known by its pixels
(`digest`), so opening the same image again, as a file, an upload or from
DIR, brings its objects back, clicks included (each annotation's `clicks`,
a field COCO readers skip); two different images of one name are saved as
NAME and NAME-2.
"""

import hashlib
import json
import os
import posixpath
import re
import threading
from typing import Any, Dict, List, Optional

import numpy as np

from beam_prep import keys
from beam_prep.drawing import png
from beam_prep.layouts import coco, folders

COCO_FILE = "instances.json"
CATEGORY = {"id": 1, "name": "object"}
# Fields of ours in the COCO document (readers skip them): the images entry's
# pixels (`digest`), the annotation's clicks.
DIGEST, CLICKS = "pixels_sha1", "clicks"


def digest(image: np.ndarray) -> str:
  """The sha1 of an image's decoded pixels (and shape)."""
  h = hashlib.sha1(repr(image.shape).encode())
  h.update(np.ascontiguousarray(image).data)
  return h.hexdigest()


def instance_mask(masks: List[np.ndarray]) -> np.ndarray:
  """uint8 [H, W] of bool object masks: 0 background, objects 1..N painted
  as the coco layout paints them."""
  if len(masks) > coco.MAX_OBJECTS:
    raise ValueError(f"objects: an instance mask holds at most {coco.MAX_OBJECTS} objects, "
                     f"got {len(masks)}")
  return coco.paint_objects(list(masks), np.full(masks[0].shape, keys.BACKGROUND, np.uint8))


def annotation(mask: np.ndarray, clicks: Dict[str, list]) -> Dict[str, Any]:
  """A COCO annotation of one object (no `id`, `image_id` yet): compressed RLE."""
  from pycocotools import mask as mask_utils  # pylint: disable=g-import-not-at-top
  rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
  return {"category_id": CATEGORY["id"], "iscrowd": 0,
          "segmentation": {"size": [int(v) for v in rle["size"]],
                           "counts": rle["counts"].decode("ascii")},
          "area": int(mask_utils.area(rle)), "bbox": [float(v) for v in mask_utils.toBbox(rle)],
          CLICKS: clicks}


def object_mask(ann: Dict[str, Any]) -> np.ndarray:
  """bool [H, W] of an annotation written by `annotation`."""
  from pycocotools import mask as mask_utils  # pylint: disable=g-import-not-at-top
  seg = ann["segmentation"]
  return mask_utils.decode({"size": seg["size"], "counts": seg["counts"].encode("ascii")}) > 0


def document(entries: List[Dict[str, Any]]) -> Dict[str, Any]:
  """The COCO instances document of saved images (`Labels` entries), ids
  numbered from 1 in order, so each image's objects keep their order."""
  images, annotations = [], []
  for image_id, entry in enumerate(entries, start=1):
    images.append({k: v for k, v in entry.items() if k != "annotations"} | {"id": image_id})
    for ann in entry["annotations"]:
      annotations.append({"id": len(annotations) + 1, "image_id": image_id, **ann})
  return {"info": {"description": "labels of the beam-train serve page"}, "images": images,
          "annotations": annotations, "categories": [CATEGORY]}


def entries_of(doc: Dict[str, Any]) -> List[Dict[str, Any]]:
  """`document`'s inverse: the entries of a COCO document, objects in id order."""
  by_image = {}
  for ann in sorted(doc.get("annotations", []), key=lambda a: a["id"]):
    seg = ann["segmentation"]
    if not (isinstance(seg, dict) and isinstance(seg.get("counts"), str)):
      raise ValueError(f"annotation {ann['id']}: not a compressed RLE")
    by_image.setdefault(ann["image_id"], []).append(
        {k: v for k, v in ann.items() if k not in ("id", "image_id")})
  return [{**{k: v for k, v in image.items() if k != "id"},
           "annotations": by_image.get(image["id"], [])} for image in doc.get("images", [])]


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


def _write(path: str, data: bytes) -> None:
  """Writes a file whole: a hidden temporary beside it, then renamed."""
  tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp")
  with open(tmp, "wb") as f:
    f.write(data)
  os.replace(tmp, path)


class Labels:
  """The saved images and their objects, by file name; written under
  `save_dir` as they change (nothing written without one)."""

  def __init__(self, save_dir: str = ""):
    self.dir = save_dir
    self._entries: Dict[str, Dict[str, Any]] = {}
    self._lock = threading.Lock()
    if save_dir:
      self._load()

  def _load(self) -> None:
    for sub in (folders.IMAGES_DIR, folders.MASKS_DIR):
      os.makedirs(os.path.join(self.dir, sub), exist_ok=True)
    path = os.path.join(self.dir, COCO_FILE)
    if not os.path.exists(path):
      return
    try:
      with open(path, encoding="utf-8") as f:
        entries = entries_of(json.load(f))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
      raise ValueError(f"--save-dir {self.dir}: {COCO_FILE} is not a COCO document this page "
                       f"wrote ({type(e).__name__}: {e}); give another folder") from None
    self._entries = {e["file_name"]: e for e in entries}

  def saved(self) -> List[str]:
    """The file names of the images saved under the save dir ([] without one)."""
    with self._lock:
      return list(self._entries) if self.dir else []

  def path(self, file_name: str) -> str:
    """The saved image file of `file_name`, or KeyError."""
    if not self.dir or file_name not in self._entries:
      raise KeyError(file_name)
    return os.path.join(self.dir, file_name)

  def find(self, pixels: str) -> Optional[Dict[str, Any]]:
    """The entry of the image of these pixels (`digest`), or None."""
    with self._lock:
      return next((e for e in self._entries.values() if e.get(DIGEST) == pixels), None)

  def document(self) -> Dict[str, Any]:
    with self._lock:
      return document(list(self._entries.values()))

  def _file_name(self, name: str, suffix: str) -> str:
    """images/STEM.EXT for a new image: a stem no saved image and no file
    of DIR/images has (beam-prep pairs images and masks by stem)."""
    taken = {posixpath.splitext(posixpath.basename(f))[0] for f in self._entries}
    if self.dir:
      taken |= {os.path.splitext(f)[0] for f in os.listdir(os.path.join(self.dir,
                                                                         folders.IMAGES_DIR))}
    stem, n = stem_of(name), 1
    while (stem if n == 1 else f"{stem}-{n}") in taken:
      n += 1
    return posixpath.join(folders.IMAGES_DIR, (stem if n == 1 else f"{stem}-{n}") + suffix)

  def _files(self, file_name: str):
    """(image path, mask path) of a saved image under the save dir."""
    stem = posixpath.splitext(posixpath.basename(file_name))[0]
    return (os.path.join(self.dir, file_name),
            os.path.join(self.dir, folders.MASKS_DIR, stem + folders.MASK_SUFFIX))

  def save(self, item: Dict[str, Any], objects: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Keeps (and writes) an image's objects, each {"mask": bool [H, W],
    "clicks": {...}}; no object removes the image. Returns {"file_name",
    "instance" (PNG bytes or None), "hidden" (object numbers painted over)}."""
    masks = [o["mask"] for o in objects]
    instance = instance_mask(masks) if masks else None
    with self._lock:
      old = next((e for e in self._entries.values() if e.get(DIGEST) == item["digest"]), None)
      if not masks:
        if old is not None:
          self._remove(old)
        return {"file_name": None, "instance": None, "hidden": []}
      h, w = masks[0].shape
      file_name = old["file_name"] if old else self._file_name(
          item["name"], suffix_of(item["name"]) if item.get("data") else ".png")
      entry = {"file_name": file_name, "height": h, "width": w, DIGEST: item["digest"],
               "annotations": [annotation(o["mask"], o["clicks"]) for o in objects]}
      self._entries[file_name] = entry
      if self.dir:
        image_path, mask_path = self._files(file_name)
        if not os.path.exists(image_path):
          _write(image_path, item.get("data") or png(item["image"]))
        _write(mask_path, png(instance))
        self._write_document()
    present = set(np.unique(instance).tolist())
    return {"file_name": file_name, "instance": png(instance),
            "hidden": [i for i in range(1, len(masks) + 1) if i not in present]}

  def _remove(self, entry: Dict[str, Any]) -> None:
    del self._entries[entry["file_name"]]
    if self.dir:
      for path in self._files(entry["file_name"]):
        if os.path.exists(path):
          os.remove(path)
      self._write_document()

  def _write_document(self) -> None:
    _write(os.path.join(self.dir, COCO_FILE),
           json.dumps(document(list(self._entries.values()))).encode("utf-8"))
