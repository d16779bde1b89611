"""The click-and-see page's server side: images held by id, masks as PNG,
the IoU with a true mask and the simulated user's next click.

The page sends an image once and then only clicks, so a click costs one
model call and two small PNGs instead of a 3 MB JSON image each time. These
endpoints are the page's own (JSON, not TF Serving's; `train.serve.app`):

  GET  /page/sources          {"files": [paths under --images], "eval": [names]}
  POST /page/upload           multipart "file" -> an opened image (below)
  POST /page/open             {"file": path under --images} or {"eval": index}
                              -> {"id", "name", "width", "height", "truth": bool}
  GET  /page/image/<id>.png   the decoded image the clicks refer to (EXIF
                              orientation applied, as everywhere)
  POST /page/segment          {"id", "positive": [[x, y], ...], "negative": [...]}
                              -> {"mask": PNG data URL (255 object, 0 else),
                                  "overlay": PNG data URL (the tint, alpha = mask),
                                  "pixels": mask pixels, "iou": IoU or null}
  POST /page/next_click       the same body -> {"click": [x, y] or null,
                              "kind": "positive" | "negative" | null}

Clicks are (x, y) = (column, row) in the image's own pixels. The next click
is `train.clicker.next_click` on the current mask, the true mask and the
pixels clicked so far: the protocol `beam-train evaluate` runs (with no
click yet, the current mask is empty, so the first click is positive at the
object's innermost pixel).

Images are held in a cache bounded in bytes (least recently used first out);
an id that has left it is a 404, and the page opens the image again.
"""

import base64
import collections
import io
import os
import secrets
import threading
from typing import Any, Dict, List, Optional

import numpy as np
import tensorflow as tf
from PIL import Image

from beam_prep import drawing, keys
from train import clicker, predict
from train import signatures as sig
from train.serve.model import RestModel
from train.serve.rest import RequestError

# Files listed from --images at most (the page's picker stays usable).
MAX_FILES = 2000


class ImageStore:
  """Images by id, at most `max_bytes` of pixels, least recently used out first."""

  def __init__(self, max_bytes: int):
    self.max_bytes = max_bytes
    self._items: "collections.OrderedDict[str, Dict[str, Any]]" = collections.OrderedDict()
    self._bytes = 0
    self._lock = threading.Lock()

  def add(self, image: np.ndarray, name: str, truth: Optional[np.ndarray] = None) -> str:
    key = secrets.token_hex(8)
    size = image.nbytes + (truth.nbytes if truth is not None else 0)
    with self._lock:
      while self._items and self._bytes + size > self.max_bytes:
        _, old = self._items.popitem(last=False)
        self._bytes -= old["bytes"]
      self._items[key] = {"image": image, "truth": truth, "name": name, "bytes": size,
                          "last": None}
      self._bytes += size
    return key

  def get(self, key: str) -> Dict[str, Any]:
    with self._lock:
      item = self._items.get(key)
      if item is None:
        raise RequestError(f"id: no image {key!r} (closed or pushed out of the cache: open it "
                           "again)", status=404)
      self._items.move_to_end(key)
      return item


class Sources:
  """What the page may open besides uploads: files under --images, eval
  objects of --data (its records' image and true mask)."""

  def __init__(self, images_dir: str = "", prep_dir: str = "", max_eval: int = 100):
    self.images_dir = os.path.realpath(images_dir) if images_dir else ""
    self.eval_images = self.eval_labels = None
    self.eval_names: List[str] = []
    if prep_dir:
      from train.noc import eval_objects  # pylint: disable=g-import-not-at-top
      from beam_prep.prep_output import PrepOutput  # pylint: disable=g-import-not-at-top
      self.eval_images, self.eval_labels, self.eval_names = eval_objects(
          PrepOutput(prep_dir), max_eval)

  def files(self) -> List[str]:
    """Image files under --images, relative, sorted (at most MAX_FILES)."""
    out = []
    if not self.images_dir:
      return out
    for folder, dirs, names in os.walk(self.images_dir):
      dirs.sort()
      for n in sorted(names):
        if n.lower().endswith(keys.IMAGE_SUFFIXES):
          out.append(os.path.relpath(os.path.join(folder, n), self.images_dir))
          if len(out) >= MAX_FILES:
            return out
    return out

  def resolve(self, relative: str) -> str:
    """A path the page named -> the file under --images, or a RequestError
    (a path leaving the folder, by '..', an absolute path or a link, is refused)."""
    if not self.images_dir:
      raise RequestError("file: the server was started without --images", status=404)
    path = os.path.realpath(os.path.join(self.images_dir, str(relative)))
    if os.path.commonpath([path, self.images_dir]) != self.images_dir:
      raise RequestError(f"file: {relative!r} is outside the --images folder", status=403)
    if not os.path.isfile(path):
      raise RequestError(f"file: no file {relative!r} under the --images folder", status=404)
    return path


def _clicks(body: Dict[str, Any], field: str) -> np.ndarray:
  """int32 [N, 2] from a list of [x, y] integer pairs, or a RequestError naming `field`."""
  value = body.get(field, [])
  ok = isinstance(value, list) and all(
      isinstance(p, list) and len(p) == 2 and all(
          isinstance(v, int) and not isinstance(v, bool) and abs(v) < 2**31 for v in p)
      for p in value)
  if not ok:
    raise RequestError(f"{field}: expected a list of [x, y] integer pairs")
  return np.asarray(value, np.int32).reshape(-1, 2)


def _clamped_clicks(item: Dict[str, Any], body: Dict[str, Any]):
  """(positive, negative) int32 [N, 2] of a page request, clamped into the
  image as the serving signature would clamp them."""
  h, w = item["image"].shape[:2]
  return tuple(np.asarray(predict.clamp(_clicks(body, f).tolist(), w, h)[0],
                          np.int32).reshape(-1, 2) for f in ("positive", "negative"))


def _png_data_url(array: np.ndarray, mode: str) -> str:
  buf = io.BytesIO()
  Image.fromarray(array, mode).save(buf, format="PNG", compress_level=1)
  return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


class Page:
  """The page's operations on one loaded model."""

  def __init__(self, model: RestModel, sources: Sources, store: ImageStore,
               max_pixels: int):
    self.model, self.sources, self.store = model, sources, store
    self.max_pixels = max_pixels

  def _opened(self, key: str) -> Dict[str, Any]:
    item = self.store.get(key)
    h, w = item["image"].shape[:2]
    return {"id": key, "name": item["name"], "width": w, "height": h,
            "truth": item["truth"] is not None}

  def upload(self, data: bytes, filename: str) -> Dict[str, Any]:
    try:
      image = predict.decode_image(data, filename or "the upload", self.max_pixels)
    except ValueError as e:
      raise RequestError(f"file: {e}") from None
    return self._opened(self.store.add(image, filename or "upload"))

  def open(self, body: Dict[str, Any]) -> Dict[str, Any]:
    if "eval" in body:
      i = body["eval"]
      if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(self.sources.eval_names):
        raise RequestError(f"eval: an index in 0..{len(self.sources.eval_names) - 1} (the eval "
                           "objects of --data), got " + repr(i))
      return self._opened(self.store.add(self.sources.eval_images[i], self.sources.eval_names[i],
                                         self.sources.eval_labels[i]))
    if "file" not in body:
      raise RequestError("the body must hold 'file' (a path under --images) or 'eval'")
    path = self.sources.resolve(body["file"])
    try:
      image = predict.load_image(path, self.max_pixels)
    except (ValueError, OSError) as e:
      raise RequestError(f"file: {e}") from None
    return self._opened(self.store.add(image, str(body["file"])))

  def image_png(self, key: str) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(self.store.get(key)["image"]).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()

  def _mask(self, item: Dict[str, Any], pos: np.ndarray, neg: np.ndarray) -> np.ndarray:
    """The model's mask for these clicks (kept for the next-click request)."""
    if not self.model.segments:
      raise RequestError("this model's serving_default does not take image and clicks "
                         "(not a segmentation model): the page cannot use it")
    key = (pos.tobytes(), neg.tobytes())
    last = item["last"]
    if last is not None and last[0] == key:
      return last[1]
    # One more click: the model refines the crop of its last mask, as in evaluation.
    more = last is not None and all(new.startswith(old) for new, old in zip(key, last[0]))
    out = self.model.predict(*self.model.segment_inputs(
        item["image"], pos, neg, last[1].astype(np.uint8) if more else None))
    # The served mask is the protocol's (`beam-train evaluate`): probability above 0.49.
    mask = out[sig.MASK] > 0
    item["last"] = (key, mask)
    return mask

  def segment(self, body: Dict[str, Any]) -> Dict[str, Any]:
    item = self.store.get(str(body.get("id")))
    mask = self._mask(item, *_clamped_clicks(item, body)) > 0
    tint = np.zeros(mask.shape + (4,), np.uint8)
    tint[mask] = drawing.MASK_TINT + (255,)
    iou = None
    if item["truth"] is not None:
      iou = float(clicker.label_iou(tf.constant(mask[None]), tf.constant(item["truth"][None]))[0])
    return {"mask": _png_data_url(mask.astype(np.uint8) * 255, "L"),
            "overlay": _png_data_url(tint, "RGBA"), "pixels": int(mask.sum()), "iou": iou}

  def next_click(self, body: Dict[str, Any]) -> Dict[str, Any]:
    item = self.store.get(str(body.get("id")))
    if item["truth"] is None:
      raise RequestError("id: this image has no true mask (open an eval object of --data)")
    pos, neg = _clamped_clicks(item, body)
    h, w = item["truth"].shape
    pred = self._mask(item, pos, neg) > 0 if len(pos) else np.zeros((h, w), bool)
    truth = tf.constant(item["truth"][None])
    if not bool(clicker.has_error(tf.constant(pred[None]), truth)[0]):
      return {"click": None, "kind": None}  # The protocol would click (0, 0): the page stops.
    clicks = np.concatenate([pos, neg]).astype(np.int64)[None]
    kinds = np.array([[clicker.POSITIVE] * len(pos) + [clicker.NEGATIVE] * len(neg)],
                     np.int32).reshape(1, -1)
    clicked = clicker.clicked_map(tf.constant(clicks.reshape(1, -1, 2)), tf.constant(kinds), h, w)
    xy, kind = clicker.next_click(tf.constant(pred[None]), truth, clicked)
    kind = int(kind[0])
    return {"click": [int(v) for v in xy[0].numpy()],
            "kind": "positive" if kind == clicker.POSITIVE else "negative"}
