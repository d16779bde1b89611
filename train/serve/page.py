"""The click-and-see page's server side: images held by id, probabilities
as PNG, the IoU with a true mask, the simulated user's next click, and the
labels saved (`train.serve.exports`).

The page sends an image once and then only clicks, so a click costs one
model call and small PNGs instead of a 3 MB JSON image each time. The server
keeps no state of the clicks: the page holds each object's history and sends
the previous mask with a click, so undo is the page's own (nothing is
predicted again) and the same clicks from the same state give the same mask.
These endpoints are the page's own (JSON, not TF Serving's; `train.serve.app`):

  GET  /page/sources          {"files": [paths under --images], "eval": [names],
                               "saved": [file names under --save-dir], "level",
                               "levels", "max_clicks", "iou_target", "version",
                               "versions": [every version known, newest first]}
  POST /page/upload           multipart "file" -> an opened image (below)
  POST /page/open             {"file": path under --images} or {"eval": index}
                              or {"saved": file name}
                              -> {"id", "name", "width", "height", "truth": bool,
                                  "saved_as": file name or null,
                                  "objects": [the saved objects of these pixels:
                                              {"probabilities", "level",
                                               "positive", "negative",
                                               "version"}]}
  GET  /page/image/<id>.png   the decoded image the clicks refer to (EXIF
                              orientation applied, as everywhere)
  GET  /page/truth/<id>.png   its true mask (0 background, 1 object, 255 ignore)
  POST /page/segment          {"id", "positive": [[x, y], ...], "negative": [...],
                               "level": L, "previous": probabilities PNG data
                               URL (the object's mask before this click) or absent,
                               "box": [x0, y0, x1, y1] (the object's box prompt) or absent}
                              -> {"probabilities": PNG data URL (levels, below),
                                  "mask": PNG data URL (255 object at L, 0 else),
                                  "pixels": mask pixels, "iou": IoU or null,
                                  "version": the model version that made it}
  POST /page/iou              {"id", "probabilities", "level"} -> {"iou", "pixels"}
  POST /page/next_click       {"id", "positive", "negative", "probabilities",
                               "level"} -> {"click": [x, y] or null,
                                            "kind": "positive" | "negative" | null}
  POST /page/save             {"id", "objects": [{"probabilities", "level",
                               "positive", "negative", "version" (optional:
                               the version that made it)}, ...]} -> {"file_name",
                               "saved": bool, "instance": PNG data URL or null,
                               "hidden": [object numbers painted over]}
  GET  /page/coco             every saved image's objects, COCO instances JSON

Probabilities travel as levels, one uint8 per pixel in a grey PNG: a pixel's
level is the number of thresholds 1/100 .. 99/100 its probability exceeds, so
the mask at threshold L/100 is `levels >= L`, and at the default level (49,
the protocol's 0.49: `beam-train evaluate`'s mask) it is the served mask
exactly. The page thresholds them itself as its slider moves.

Clicks are (x, y) = (column, row) in the image's own pixels. The next click
is the protocol's (`train.serve.practice.next_click`) on the current mask,
the true mask and the pixels clicked so far: the protocol `beam-train
evaluate` runs (with no click yet, the current mask is empty, so the first
click is positive at the object's innermost pixel).

Images are held in a cache bounded in bytes (least recently used first out);
an id that has left it is a 404, and the page opens the image again (from
the file it kept, for an upload) and repeats the request.
"""

import base64
import binascii
import collections
import io
import os
import secrets
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
from PIL import Image

from beam_prep import keys
from beam_prep.drawing import png
from train.export import signatures as sig
from train.export.served import clamp, decode_image
from train.serve import exports, practice
from train.serve.store import Labels
from train.serve.config import ServeConfig
from train.serve.model import RestModel
from train.export.served import InvalidInput
from train.serve.versions import Versions
from train.serve.rest import RequestError, check_clicks

# Files listed from --images at most (the page's picker stays usable).
MAX_FILES = 2000
# Probabilities as levels: the mask at level L is `levels >= L` (threshold L / LEVELS).
LEVELS = 100
# A page request's click fields, [x, y] pairs each (`beam-train serve --max-clicks` together).
CLICK_FIELDS = ("positive", "negative")
DEFAULT_LEVEL = int(round(practice.THRESHOLD * LEVELS))


class ImageStore:
  """Images by id, at most `max_bytes` (pixels, true mask, file bytes), least
  recently used out first. An item holds the image, its `digest`, its name,
  the true mask or None, and the file's bytes when it came from a file."""

  def __init__(self, max_bytes: int):
    self.max_bytes = max_bytes
    self._items: "collections.OrderedDict[str, Dict[str, Any]]" = collections.OrderedDict()
    self._bytes = 0
    self._lock = threading.Lock()

  def add(
    self, image: np.ndarray, name: str, truth: Optional[np.ndarray] = None, data: bytes = b""
  ) -> str:
    key = secrets.token_hex(8)
    size = image.nbytes + (truth.nbytes if truth is not None else 0) + len(data)
    item = {
      "image": image,
      "truth": truth,
      "name": name,
      "data": data,
      "bytes": size,
      "digest": exports.digest(image),
    }
    with self._lock:
      while self._items and self._bytes + size > self.max_bytes:
        _, old = self._items.popitem(last=False)
        self._bytes -= old["bytes"]
      self._items[key] = item
      self._bytes += size
    return key

  def get(self, key: str) -> Dict[str, Any]:
    with self._lock:
      item = self._items.get(key)
      if item is None:
        raise RequestError(
          f"id: no image {key!r} (closed or pushed out of the cache: open it again)", status=404
        )
      self._items.move_to_end(key)
      return item


class Sources:
  """What the page may open besides uploads: files under --images, eval
  objects of --data (its records' image and true mask)."""

  def __init__(
    self, images_dir: str = "", prep_dir: str = "", max_eval: int = ServeConfig.max_eval_objects
  ):
    self.images_dir = os.path.realpath(images_dir) if images_dir else ""
    self.eval_images = self.eval_labels = None
    self.eval_names: List[str] = []
    if prep_dir:
      self.eval_images, self.eval_labels, self.eval_names = practice.eval_objects(
        prep_dir, max_eval
      )

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
    if not isinstance(relative, str) or not relative:
      raise RequestError(f"file: expected a path under the --images folder, got {relative!r}")
    try:
      path = os.path.realpath(os.path.join(self.images_dir, relative))
      inside = os.path.commonpath([path, self.images_dir]) == self.images_dir
      found = os.path.isfile(path)
    except ValueError as e:  # A NUL, or a name the file system cannot encode.
      raise RequestError(f"file: {relative[:200]!r} cannot name a file ({e})") from None
    if not inside:
      raise RequestError(f"file: {relative!r} is outside the --images folder", status=403)
    if not found:
      raise RequestError(f"file: no file {relative!r} under the --images folder", status=404)
    return path


def _clicks(body: Dict[str, Any], field: str, where: str = "") -> np.ndarray:
  """int32 [N, 2] from a list of [x, y] integer pairs, or a RequestError
  naming `where` + `field`."""
  value = body.get(field, [])
  ok = isinstance(value, list) and all(
    isinstance(p, list)
    and len(p) == 2
    and all(isinstance(v, int) and not isinstance(v, bool) and abs(v) < 2**31 for v in p)
    for p in value
  )
  if not ok:
    raise RequestError(f"{where}{field}: expected a list of [x, y] integer pairs")
  return np.asarray(value, np.int32).reshape(-1, 2)


def _clamped_clicks(item: Dict[str, Any], body: Dict[str, Any], max_clicks: int):
  """(positive, negative) int32 [N, 2] of a page request, clamped into the
  image as the serving signature would clamp them; more than `max_clicks`
  together (0: any) are refused before any is read."""
  check_clicks({f: [body[f]] for f in CLICK_FIELDS if f in body}, max_clicks, CLICK_FIELDS)
  h, w = item["image"].shape[:2]
  return tuple(
    np.asarray(clamp(_clicks(body, f).tolist(), w, h)[0], np.int32).reshape(-1, 2)
    for f in CLICK_FIELDS
  )


def _saved_clicks(obj: Dict[str, Any], where: str, max_clicks: int) -> Dict[str, list]:
  """A saved object's clicks, {positive, negative}: no more than `max_clicks`
  together (0: any), as each of the requests that made its mask held."""
  clicks = {f: _clicks(obj, f, where).tolist() for f in CLICK_FIELDS}
  count = sum(len(c) for c in clicks.values())
  if max_clicks and count > max_clicks:
    raise RequestError(
      f"{where}{'/'.join(CLICK_FIELDS)}: {count} clicks; this server takes at most "
      f"{max_clicks} an object (--max-clicks)"
    )
  return clicks


def _box(body: Dict[str, Any]) -> Optional[List[int]]:
  """The body's box prompt [x0, y0, x1, y1] (integers), None when absent, or a RequestError."""
  value = body.get("box")
  if value is None:
    return None
  ok = isinstance(value, list) and len(value) == 4
  if not ok or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
    raise RequestError("box: expected [x0, y0, x1, y1], four integers")
  return value


def _level(body: Dict[str, Any], where: str = "") -> int:
  """The body's threshold `level` (DEFAULT_LEVEL when absent), or a
  RequestError naming `where` + "level"."""
  value = body.get("level", DEFAULT_LEVEL)
  if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value < LEVELS:
    raise RequestError(
      f"{where}level: a threshold level in 1..{LEVELS - 1} (level / {LEVELS}), got {value!r}"
    )
  return value


def probability_levels(probabilities: np.ndarray, mask: np.ndarray) -> np.ndarray:
  """uint8 levels of float probabilities: how many thresholds k / LEVELS
  (k = 1 .. LEVELS - 1) each exceeds; at DEFAULT_LEVEL they are the served
  `mask` exactly (the graph's own comparison, not one redone in float64)."""
  levels = np.clip(np.ceil(probabilities.astype(np.float64) * LEVELS) - 1, 0, LEVELS - 1)
  levels = levels.astype(np.uint8)
  return np.where(
    mask, np.maximum(levels, DEFAULT_LEVEL), np.minimum(levels, DEFAULT_LEVEL - 1)
  ).astype(np.uint8)


def _png_data_url(array: np.ndarray, mode: str) -> str:
  return "data:image/png;base64," + base64.b64encode(png(array, mode)).decode("ascii")


def _levels_of(value: Any, field: str, shape) -> np.ndarray:
  """uint8 [H, W] levels from a grey PNG data URL of the image's size, or a RequestError."""
  try:
    if not isinstance(value, str) or not value.startswith("data:image/png;base64,"):
      raise ValueError("not a PNG data URL")
    im = Image.open(io.BytesIO(base64.b64decode(value.split(",", 1)[1], validate=True)))
    if im.size != (shape[1], shape[0]) or im.mode != "L":
      raise ValueError(
        f"a {im.size[0]}x{im.size[1]} {im.mode} PNG, not the image's "
        f"{shape[1]}x{shape[0]} grey levels"
      )
    return np.asarray(im, np.uint8)
  except (ValueError, OSError, binascii.Error, Image.DecompressionBombError) as e:
    raise RequestError(
      f"{field}: expected the probabilities PNG data URL the server sent ({e})"
    ) from None


def _version(obj: Dict[str, Any], where: str, serving: int) -> int:
  """The model version an object names (`serving` when it names none), or a RequestError."""
  value = obj.get("version")
  if value is None:
    return serving
  if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**63:
    raise RequestError(f"{where}version: a model version (a whole number), got {value!r}")
  return value


def _object_levels(mask: np.ndarray) -> np.ndarray:
  """The levels of a saved (binary) mask: object at every level, background at none."""
  return np.where(mask, LEVELS - 1, 0).astype(np.uint8)


class Page:
  """The page's operations on one loaded model."""

  def __init__(
    self,
    versions: Versions,
    sources: Sources,
    store: ImageStore,
    max_pixels: int,
    labels: Optional[Labels] = None,
    on_saved: Optional[Callable[[], None]] = None,
  ):
    self.versions, self.sources, self.store = versions, sources, store
    self.on_saved = on_saved
    self.max_pixels = max_pixels
    self.labels = labels or Labels()

  @property
  def model(self) -> RestModel:
    """The version serving now (a request asks it once: `predict_levels`)."""
    return self.versions.current

  def describe(self) -> Dict[str, Any]:
    """What the page lists and the protocol's numbers (GET /page/sources)."""
    return {
      "model": self.model.name,
      "version": self.model.version,
      "versions": self.versions.versions(),
      "segments": self.model.segments,
      "files": self.sources.files(),
      "eval": self.sources.eval_names,
      "saved": self.labels.saved(),
      "level": DEFAULT_LEVEL,
      "levels": LEVELS,
      "max_clicks": practice.MAX_CLICKS,
      "iou_target": practice.IOU_TARGET,
    }

  def _opened(self, key: str) -> Dict[str, Any]:
    item = self.store.get(key)
    h, w = item["image"].shape[:2]
    entry = self.labels.find(item["digest"])
    objects = [
      {
        "probabilities": _png_data_url(_object_levels(exports.object_mask(a)), "L"),
        "level": DEFAULT_LEVEL,
        "positive": [],
        "negative": [],
        **a.get(exports.CLICKS, {}),
        "version": a.get(exports.MODEL_VERSION),
      }
      for a in (entry["annotations"] if entry else [])
    ]
    return {
      "id": key,
      "name": item["name"],
      "width": w,
      "height": h,
      "truth": item["truth"] is not None,
      "objects": objects,
      "saved_as": entry["file_name"] if entry else None,
    }

  def add_file(self, data: bytes, name: str, field: str) -> str:
    """Decodes a file's bytes into the store (their id), or a RequestError naming `field`."""
    try:
      image = decode_image(data, name, self.max_pixels)
    except ValueError as e:
      raise RequestError(f"{field}: {e}") from None
    return self.store.add(image, name, data=data)

  def upload(self, data: bytes, filename: str) -> Dict[str, Any]:
    return self._opened(self.add_file(data, filename or "upload", "file"))

  def open(self, body: Dict[str, Any]) -> Dict[str, Any]:
    if "eval" in body:
      i = body["eval"]
      if not self.sources.eval_names:
        raise RequestError("eval: the server was started without --data", status=404)
      if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(self.sources.eval_names):
        raise RequestError(
          f"eval: an index in 0..{len(self.sources.eval_names) - 1} (the eval "
          "objects of --data), got " + repr(i)
        )
      return self._opened(
        self.store.add(
          self.sources.eval_images[i], self.sources.eval_names[i], self.sources.eval_labels[i]
        )
      )
    if "saved" in body:
      try:
        path, field, name = self.labels.path(str(body["saved"])), "saved", str(body["saved"])
      except (KeyError, ValueError):  # Not saved, or no name the store could hold.
        raise RequestError(
          f"saved: no saved image {body['saved']!r} (under --save-dir)", status=404
        ) from None
    elif "file" in body:
      path, field, name = self.sources.resolve(body["file"]), "file", str(body["file"])
    else:
      raise RequestError("the body must hold 'file' (a path under --images), 'eval' or 'saved'")
    try:
      with open(path, "rb") as f:
        data = f.read()
    except OSError as e:
      raise RequestError(f"{field}: {e}") from None
    return self._opened(self.add_file(data, name, field))

  def image_png(self, key: str) -> bytes:
    return png(self.store.get(key)["image"])

  def truth_png(self, key: str) -> bytes:
    item = self.store.get(key)
    if item["truth"] is None:
      raise RequestError(
        "id: this image has no true mask (open an eval object of --data)", status=404
      )
    return png(item["truth"])

  def _iou(self, item: Dict[str, Any], mask: np.ndarray) -> Optional[float]:
    if item["truth"] is None:
      return None
    return practice.iou(mask, item["truth"])

  def predict_levels(
    self,
    item: Dict[str, Any],
    pos: np.ndarray,
    neg: np.ndarray,
    previous: Optional[np.ndarray],
    box: Optional[Sequence[int]] = None,
  ):
    """(levels, version): the levels of the model's probabilities for these
    clicks (and the object's previous mask: the model refines its crop, as in
    evaluation; and its box prompt, x0, y0, x1, y1), and the version that
    made them."""
    model = self.model
    if not model.segments:
      raise RequestError(
        "this model's serving_default does not take image and clicks "
        "(not a segmentation model): the page cannot use it"
      )
    try:
      signature, inputs = model.segment_inputs(
        item["image"], pos, neg, None if previous is None else previous.astype(np.uint8), box
      )
    except InvalidInput as e:
      raise RequestError(str(e)) from None
    out = model.predict(signature, inputs)
    return probability_levels(out[sig.PROBABILITIES], out[sig.MASK] > 0), model.version

  def segment(self, body: Dict[str, Any]) -> Dict[str, Any]:
    item = self.store.get(str(body.get("id")))
    level = _level(body)
    previous = None
    if body.get("previous") is not None:
      previous = _levels_of(body["previous"], "previous", item["image"].shape) >= level
    (pos, neg), box = _clamped_clicks(item, body, self.model.max_clicks), _box(body)
    if not len(pos) and box is None:
      raise RequestError(f"{CLICK_FIELDS[0]}: at least one positive click is needed (or a box)")
    levels, version = self.predict_levels(item, pos, neg, previous, box)
    mask = levels >= level
    return {
      "probabilities": _png_data_url(levels, "L"),
      "mask": _png_data_url(mask.astype(np.uint8) * 255, "L"),
      "pixels": int(mask.sum()),
      "iou": self._iou(item, mask),
      "version": version,
    }

  def iou(self, body: Dict[str, Any]) -> Dict[str, Any]:
    item = self.store.get(str(body.get("id")))
    mask = _levels_of(body.get("probabilities"), "probabilities", item["image"].shape) >= _level(
      body
    )
    return {"iou": self._iou(item, mask), "pixels": int(mask.sum())}

  def next_click(self, body: Dict[str, Any]) -> Dict[str, Any]:
    """The protocol's next click on the current mask: the body's
    `probabilities` at `level`; without them, none before the first click
    and the clicks' own prediction after it."""
    item = self.store.get(str(body.get("id")))
    if item["truth"] is None:
      raise RequestError("id: this image has no true mask (open an eval object of --data)")
    pos, neg = _clamped_clicks(item, body, self.model.max_clicks)
    h, w = item["truth"].shape
    level = _level(body)
    if body.get("probabilities") is not None:
      pred = _levels_of(body["probabilities"], "probabilities", item["image"].shape) >= level
    elif len(pos):
      pred = self.predict_levels(item, pos, neg, None)[0] >= level
    else:
      pred = np.zeros((h, w), bool)
    xy, kind = practice.next_click(pred, item["truth"], pos.tolist(), neg.tolist())
    # No click: the protocol has nothing left to fix, and the page stops.
    return {"click": list(xy) if xy else None, "kind": kind}

  def save(self, body: Dict[str, Any]) -> Dict[str, Any]:
    """Keeps the image's objects as they are now (`store.Labels`): an
    instance mask PNG, COCO annotations, files under --save-dir; each
    object new or changed is marked with the model version that made it
    (its `version`, as /page/segment answered it, else the one serving)."""
    item = self.store.get(str(body.get("id")))
    objects = body.get("objects")
    if not isinstance(objects, list) or not all(isinstance(o, dict) for o in objects):
      raise RequestError(
        "objects: expected a list of objects {probabilities, level, positive, negative}"
      )
    kept = []
    for i, obj in enumerate(objects):
      where = f"objects[{i}]."
      clicks = _saved_clicks(obj, where, self.model.max_clicks)  # Checked before any decoding.
      mask = _levels_of(
        obj.get("probabilities"), where + "probabilities", item["image"].shape
      ) >= _level(obj, where)
      if not mask.any():
        raise RequestError(f"{where}probabilities: the object's mask is empty")
      kept.append(
        {
          "mask": mask,
          "clicks": clicks,
          "version": _version(obj, where, self.model.version),
        }
      )
    try:
      out = self.labels.save(item, kept, self.model.version, {"tool": "page"})
    except ValueError as e:
      raise RequestError(str(e)) from None
    except OSError as e:
      raise RequestError(
        f"save: cannot write under --save-dir {self.labels.dir}: {e}", status=500
      ) from None
    instance = out.pop("instance")
    if self.on_saved is not None and self.labels.dir and out["file_name"]:
      self.on_saved()
    return dict(
      out,
      saved=bool(self.labels.dir and out["file_name"]),
      instance=None
      if instance is None
      else "data:image/png;base64," + base64.b64encode(instance).decode("ascii"),
    )
