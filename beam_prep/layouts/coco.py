"""The COCO layout: instance annotations in one JSON file, images in a folder.

    --layout coco --input instances.json [--image-root DIR]

This is the format of COCO and LVIS, and the export format of CVAT, Label
Studio and Roboflow. Each `images` entry (`id`, `file_name`, `height`,
`width`) is one input. Its `annotations` (`image_id`, `segmentation`,
`iscrowd`, `bbox`) become one instance mask: objects 1..N in the order of
their annotation ids, crowd regions 255 (ignore; CVAT's masks, written as
crowd RLEs, are objects: `crowd`). Overlapping objects are painted
largest first, so a small object on a large one stays visible. Polygons and
RLE (compressed and uncompressed) are decoded by `pycocotools`.

What the reader holds in memory: one worker reads the JSON file in 1 MB
chunks and keeps one `images` or `annotations` entry at a time (every other
top-level value, such as `categories`, is read whole and dropped). Each
entry becomes a Beam element keyed by its image id, and Beam's shuffle joins
each image with its annotations (`CoGroupByKey`). That shuffle is disk-backed
on Dataflow. On the DirectRunner it holds every annotation in memory, about
the size of the JSON file.

Rows that cannot be used go to the dead letters with a reason:
  image level       bad_image_entry (no id or file_name), duplicate_image_id,
                    path_outside_root, and every reason the image's own read
                    and decode can give (missing_image, mask_size_mismatch
                    when the entry's height/width are not the image's, ...)
  annotation level  unknown_image_id, bad_annotation, bad_segmentation,
                    empty_segmentation, polygon_outside_image, bad_rle,
                    rle_size_mismatch, too_many_objects, hidden_object
An annotation that fails counts as a found object that failed, so the
manifest's accounting still adds up.

A detection-only row (`segmentation` missing or `[]`, with a `bbox` [x, y,
w, h] of positive size) has no mask to teach: its box (every pixel it
touches) becomes ignore, so the object in it is never taught as background,
and the row is counted as `objects_box_only`, apart from the found objects
(it is neither used nor failed; `objects_found` does not include it). Where a failed annotation
still covers
pixels of the image (a polygon that leaves the image, an object past the
254th), those pixels become ignore pixels, not background.
"""

import codecs
import json
import math
import posixpath
from typing import Any, Dict, Iterator, List, Optional, Tuple

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems

from beam_prep import keys
from beam_prep.dead_letters import READ_STAGE, error_record
from beam_prep.layouts import common
from beam_prep.layouts.registry import InputError, Layout, ReadOptions, register_layout
from beam_prep.ops.registry import ExampleError

ANNOTATION_STAGE = "annotation"
# Top-level keys of a COCO file; `detect` looks for one of them first.
COCO_KEYS = ("info", "licenses", "images", "annotations", "categories", "type")
LOOKED_KEYS = 8  # The top-level keys `looks_like_coco` reads at most.
MAX_OBJECTS = 254  # Instance ids 1..254; 255 is ignore.
# A polygon vertex this far past the image's border puts it outside the image.
OUTSIDE_TOLERANCE = 2.0
ELLIPSE_POINTS = 64  # An ellipse is drawn as a polygon of this many points.
_CHUNK = 1 << 20
_STREAMED = ("images", "annotations")
_ORPHAN = "orphan"
_DECODER = json.JSONDecoder()


class CocoError(ValueError):
  """The annotation file is not a COCO JSON file (the message names it and where)."""


class _Stream:
  """A JSON text read in chunks; values are parsed one at a time."""

  def __init__(self, f, chunk: int = _CHUNK):
    self._f = f
    self._utf8 = codecs.getincrementaldecoder("utf-8-sig")()
    self._chunk = chunk
    self.buf = ""
    self.pos = 0
    self.dropped = 0  # Characters before buf.
    self.eof = False

  @property
  def offset(self) -> int:
    return self.dropped + self.pos

  def _more(self, size: int) -> bool:
    if self.eof:
      return False
    data = self._f.read(size)
    self.dropped += self.pos
    self.buf = self.buf[self.pos :] + self._utf8.decode(data, final=not data)
    self.pos = 0
    self.eof = not data
    return True

  def peek(self) -> str:
    """The next character that is not white space ("" at the end)."""
    while True:
      buf, pos = self.buf, self.pos
      while pos < len(buf) and buf[pos] in " \t\r\n":
        pos += 1
      self.pos = pos
      if pos < len(buf):
        return buf[pos]
      if not self._more(self._chunk):
        return ""

  def take(self, expected: str) -> str:
    c = self.peek()
    if c not in expected:
      raise ValueError(
        f"expected one of {list(expected)} at character {self.offset}, "
        f"found {c or 'the end of the file'!r}"
      )
    self.pos += 1
    return c

  def value(self) -> Any:
    """The next JSON value. One that ends where the buffer ends may go on
    (a number, say), so it is parsed again with more text."""
    self.peek()
    size = self._chunk
    while True:
      try:
        val, end = _DECODER.raw_decode(self.buf, self.pos)
        if end < len(self.buf) or self.eof:
          self.pos = end
          return val
      except json.JSONDecodeError as e:
        if self.eof:
          raise ValueError(f"{e.msg} at character {self.dropped + e.pos}") from None
      self._more(size)
      size *= 2  # A long value: read faster than it is parsed again.


def iter_entries(f, chunk: int = _CHUNK) -> Iterator[Tuple[str, Any]]:
  """(top-level key, value) of a COCO file; the values of `images` and
  `annotations` come one entry at a time, read `chunk` bytes at a time."""
  s = _Stream(f, chunk)
  s.take("{")
  if s.peek() == "}":
    return
  while True:
    key = s.value()
    if not isinstance(key, str):
      raise ValueError(f"expected a key at character {s.offset}")
    s.take(":")
    if key in _STREAMED:
      if s.peek() != "[":
        raise ValueError(f"{key!r} must be a list (character {s.offset})")
      s.take("[")
      if s.peek() == "]":
        s.take("]")
      else:
        while True:
          yield key, s.value()
          if s.take(",]") == "]":
            break
    else:
      yield key, s.value()
    if s.take(",}") == "}":
      return


def iter_items(f, chunk: int = _CHUNK) -> Iterator[Any]:
  """The items of a JSON file whose top level is a list, one at a time, read
  `chunk` bytes at a time."""
  s = _Stream(f, chunk)
  s.take("[")
  if s.peek() == "]":
    return
  while True:
    yield s.value()
    if s.take(",]") == "]":
      return


def looks_like_coco(path: str) -> bool:
  """Whether `path` is a JSON object whose first key is a COCO key, or that
  has `images` or `annotations` among its first LOOKED_KEYS keys (a tool's
  own key first: "version", ...). A JSON-lines manifest's rows have neither."""
  try:
    with FileSystems.open(path) as f:
      for n, (key, _) in enumerate(iter_entries(f, chunk=1 << 16)):
        if key in (COCO_KEYS if n == 0 else _STREAMED):
          return True
        if n + 1 >= LOOKED_KEYS:
          return False
  except Exception:  # pylint: disable=broad-except
    return False
  return False


def _image_id(entry_id: Any) -> str:
  return str(entry_id)


def entry_error(
  reason: str, detail: str, source: str, image_id: str = "", annotation_id: Any = None
) -> Dict[str, Any]:
  stage = READ_STAGE if annotation_id is None else ANNOTATION_STAGE
  rec = error_record(stage, reason, detail, {keys.SOURCE: source, keys.IMAGE_ID: image_id})
  if annotation_id is not None:
    rec["annotation_id"] = annotation_id
  return rec


class _EntriesFn(beam.DoFn):
  """Reads a COCO file into (image id, entry) pairs, images and annotations
  apart. Entries of one file (`file_name`) and size under several ids
  (merged exports) are one image: the later ids' annotations are the first's."""

  def process(self, path: str):
    counts = {"images": 0, "annotations": 0}
    files: Dict[str, Tuple[str, Any, Any]] = {}  # file_name -> its first (id, height, width)
    aliases: Dict[str, str] = {}  # A later entry's id -> the first entry's of its file.
    try:
      with FileSystems.open(path) as f:
        for key, value in iter_entries(f):
          if key not in _STREAMED:
            continue
          where = f"{path}:{key}[{counts[key]}]"
          counts[key] += 1
          if key == "images":
            yield from self._image(value, where, files, aliases)
          else:
            yield self._annotation(value, where, aliases)
    except ValueError as e:
      raise CocoError(f"{path} is not a COCO JSON file: {e}") from None

  @staticmethod
  def _image(value: Any, where: str, files, aliases):
    if not (isinstance(value, dict) and "id" in value and value.get("file_name")):
      yield beam.pvalue.TaggedOutput(
        "errors",
        entry_error("bad_image_entry", "an images entry needs 'id' and 'file_name'", where),
      )
      return
    image_id, name = _image_id(value["id"]), str(value["file_name"])
    size = (value.get("height"), value.get("width"))
    first = files.setdefault(name, (image_id, *size))
    if first[0] != image_id and first[1:] == size:
      aliases[image_id] = first[0]
      return
    entry = {"file_name": name, "height": size[0], "width": size[1], "where": where}
    yield beam.pvalue.TaggedOutput("images", (image_id, entry))

  @staticmethod
  def _annotation(value: Any, where: str, aliases):
    ann: Dict[str, Any] = {"where": where}
    if not (isinstance(value, dict) and "image_id" in value):
      ann["error"] = ("bad_annotation", "an annotations entry needs 'image_id'")
      return _ORPHAN, ann
    ann.update({k: value.get(k) for k in ("id", "segmentation", "bbox")})
    ann["iscrowd"] = crowd(value)
    image_id = _image_id(value["image_id"])
    return aliases.get(image_id, image_id), ann


def _annotation_order(ann: Dict[str, Any]):
  """Annotation ids in numeric order (strings after numbers), then file position."""
  aid = ann.get("id")
  number = isinstance(aid, (int, float)) and not isinstance(aid, bool)
  return (0, aid, "", ann["where"]) if number else (1, 0, str(aid), ann["where"])


@beam.typehints.with_output_types(Dict[str, Any])
class _JoinFn(beam.DoFn):
  """One image and its annotations -> an input pointer; the rest -> errors."""

  def __init__(self, json_path: str, image_root: str, allow_outside_root: bool):
    self._json = json_path
    self._root = image_root
    self._allow = allow_outside_root

  def process(self, keyed):
    key, grouped = keyed
    images = sorted(grouped["images"], key=lambda e: e["where"])
    anns = sorted(grouped["annotations"], key=_annotation_order)
    if len(images) != 1:
      if images:
        for e in images:
          yield beam.pvalue.TaggedOutput(
            "errors",
            entry_error(
              "duplicate_image_id", f"{len(images)} images entries have id {key}", e["where"], key
            ),
          )
        reason, detail = "duplicate_image_id", f"image id {key} names {len(images)} images"
      else:
        reason, detail = "unknown_image_id", f"no images entry has id {key}"
      errors = []
      for a in anns:
        r, d = a.get("error") or (reason, detail)
        errors.append(entry_error(r, d, a["where"], "" if key == _ORPHAN else key, a.get("id")))
      if errors:  # Failed objects of no image: counted, then dead-lettered.
        yield {
          keys.IMAGE_ID: f"annotations of image id {key}",
          keys.SOURCE: self._json,
          "no_image": True,
          "object_errors": errors,
        }
      return
    image = images[0]
    try:
      source = common.resolve(self._root, image["file_name"], self._root, self._allow)
    except ValueError as e:
      yield beam.pvalue.TaggedOutput(
        "errors", entry_error("path_outside_root", str(e), image["where"], key)
      )
      return
    yield rows_pointer(
      image["file_name"],
      source,
      {"id": key, "height": image["height"], "width": image["width"]},
      anns,
    )


def rows_pointer(
  file_name: str, source: str, entry: Dict[str, Any], rows: List[Dict[str, Any]]
) -> Dict[str, Any]:
  """The pointer of one image (`entry`: its id, height and width) and its
  annotation rows, which `materialize` draws."""
  return {
    keys.IMAGE_ID: posixpath.splitext(file_name)[0],
    keys.SOURCE: source,
    # Known before the image is read: if it cannot be, they failed with it.
    "objects_listed": sum(1 for a in rows if not crowd(a) and not box_only(a)),
    "objects_box_only": sum(1 for a in rows if box_only(a)),
    "coco": {
      **entry,
      "annotations": [
        {k: a.get(k) for k in ("id", "segmentation", "iscrowd", "bbox", "where", "error", "z")}
        for a in rows
      ],
    },
  }


def image_root_of(json_path: str, image_root: str = "") -> str:
  """The folder the images' file_names are relative to: `image_root`, else the JSON's folder."""
  return (image_root or posixpath.dirname(json_path) or ".").rstrip("/")


class ListCoco(beam.PTransform):
  """A COCO file -> `(pointers, errors)`, as every layout's `list_inputs` returns them."""

  def __init__(self, json_path: str, image_root: str = "", allow_outside_root: bool = False):
    super().__init__()
    self._json = json_path
    self._root = image_root_of(json_path, image_root)
    self._allow = allow_outside_root

  def expand(self, pbegin):
    entries = (
      pbegin
      | "CocoFile" >> beam.Create([self._json])
      | "ReadEntries"
      >> beam.ParDo(_EntriesFn()).with_outputs("images", "errors", main="annotations")
    )
    joined = (
      {"images": entries.images, "annotations": entries.annotations}
      | "JoinByImageId" >> beam.CoGroupByKey()
      | "Pointers"
      >> beam.ParDo(_JoinFn(self._json, self._root, self._allow)).with_outputs(
        "errors", main="pointers"
      )
    )
    errors = (entries.errors, joined.errors) | "CocoErrors" >> beam.Flatten()
    return joined.pointers, errors


def crowd(ann: Dict[str, Any]) -> bool:
  """Whether an annotation is a crowd region (ignore pixels): `iscrowd`, but
  for CVAT's rows. CVAT's COCO export writes every object drawn as a mask
  (a brush, a model's mask) as an RLE with `iscrowd` 1, and gives every row
  its shape's attributes (`"attributes": {"occluded": ...}`): such a row is
  an object."""
  attributes = ann.get("attributes")
  drawn = isinstance(attributes, dict) and "occluded" in attributes
  return bool(ann.get("iscrowd")) and not drawn


def box_only(ann: Dict[str, Any]) -> bool:
  """Whether an annotation is a detection-only row: no segmentation (missing
  or []) and a `bbox` [x, y, w, h] of positive width and height."""
  if ann.get("error") or ann.get("segmentation") not in (None, []):
    return False
  box = ann.get("bbox")
  return (
    isinstance(box, (list, tuple))
    and len(box) == 4
    and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in box)
    and box[2] > 0
    and box[3] > 0
  )


def _box_region(box, height: int, width: int) -> np.ndarray:
  """The pixels a bbox [x, y, w, h] touches (clipped to the image)."""
  x, y, w, h = (float(v) for v in box)
  region = np.zeros((height, width), bool)
  x0, y0 = max(int(np.floor(x)), 0), max(int(np.floor(y)), 0)
  x1, y1 = min(int(np.ceil(x + w)), width), min(int(np.ceil(y + h)), height)
  region[y0 : max(y1, y0), x0 : max(x1, x0)] = True
  return region


class _AnnotationError(Exception):
  def __init__(self, reason: str, detail: str, region=None):
    super().__init__(detail)
    self.reason, self.detail, self.region = reason, detail, region


def _polygons(seg, height: int, width: int):
  from pycocotools import mask as mask_utils  # pylint: disable=g-import-not-at-top

  if seg and all(isinstance(v, (int, float)) for v in seg):
    seg = [seg]  # A single polygon written flat.
  polys = []
  for poly in seg:
    if not isinstance(poly, list) or not all(isinstance(v, (int, float)) for v in poly):
      raise _AnnotationError("bad_segmentation", "a polygon must be a list of numbers")
    if len(poly) % 2:
      raise _AnnotationError(
        "bad_segmentation", f"a polygon has {len(poly)} coordinates, an odd number"
      )
    if not all(math.isfinite(v) for v in poly):
      raise _AnnotationError("bad_segmentation", "a polygon has a coordinate that is no number")
    if len(poly) >= 6:  # Fewer than 3 points enclose nothing.
      polys.append([float(v) for v in poly])
  if not polys:
    raise _AnnotationError("empty_segmentation", "no polygon with 3 or more points")
  # (pycocotools would read a 4-number polygon as a box: none reaches it.)
  rasterized = [_near_image(p, height, width) for p in polys]
  region = mask_utils.decode(mask_utils.merge(mask_utils.frPyObjects(rasterized, height, width)))
  for poly in polys:
    xs, ys = np.asarray(poly[0::2]), np.asarray(poly[1::2])
    tol_x, tol_y = max(OUTSIDE_TOLERANCE, 0.01 * width), max(OUTSIDE_TOLERANCE, 0.01 * height)
    if (
      xs.min() < -tol_x
      or ys.min() < -tol_y
      or xs.max() > width + tol_x
      or ys.max() > height + tol_y
    ):
      raise _AnnotationError(
        "polygon_outside_image",
        f"a polygon spans x {xs.min():g}..{xs.max():g}, y {ys.min():g}..{ys.max():g}; "
        f"the image is {width}x{height}",
        region=region,
      )
  return region


def _near_image(poly: List[float], height: int, width: int) -> List[float]:
  """A polygon to rasterize: its vertices clamped to within one image size of
  the image (pycocotools' memory grows with the edges' length: a vertex at
  1e9 px would take it all), a non-number at 0. Only a polygon reaching that
  far past the image changes, and it is `polygon_outside_image`."""
  flat = np.nan_to_num(np.asarray(poly, np.float64), nan=0.0).reshape(-1, 2)
  flat[:, 0] = np.clip(flat[:, 0], -width, 2 * width)
  flat[:, 1] = np.clip(flat[:, 1], -height, 2 * height)
  return flat.ravel().tolist()


def _whole(value: Any) -> bool:
  return isinstance(value, (int, float)) and math.isfinite(value) and float(value).is_integer()


def _rle(seg: Dict[str, Any], height: int, width: int):
  from pycocotools import mask as mask_utils  # pylint: disable=g-import-not-at-top

  size, counts = seg.get("size"), seg.get("counts")
  if not isinstance(size, list) or len(size) != 2 or not all(map(_whole, size)) or counts is None:
    raise _AnnotationError("bad_rle", "an RLE needs 'size' [height, width] and 'counts'")
  if [int(v) for v in size] != [height, width]:
    raise _AnnotationError(
      "rle_size_mismatch", f"the RLE is {size[1]}x{size[0]}, the image is {width}x{height}"
    )
  if isinstance(counts, list):  # Uncompressed: run lengths from the first pixel (column-major).
    runs = counts if all(isinstance(v, int) for v in counts) else None
    _check_runs(runs, "uncompressed", "must be non-negative integers", height, width)
    rle = mask_utils.frPyObjects(seg, height, width)
  elif isinstance(counts, (str, bytes)):
    rle = {
      "size": [height, width],
      "counts": counts.encode("utf-8") if isinstance(counts, str) else counts,
    }
    _check_runs(compressed_runs(rle["counts"]), "compressed", "are not COCO's RLE", height, width)
  else:
    raise _AnnotationError("bad_rle", "RLE counts must be a list or a string")
  try:
    return mask_utils.decode(rle)
  except ValueError as e:
    raise _AnnotationError("bad_rle", f"pycocotools: {e}") from None


def _check_runs(runs: Optional[List[int]], kind: str, bad: str, height: int, width: int) -> None:
  """An RLE's run lengths (None: unreadable) must be non-negative and cover
  the image's pixels exactly, else `bad_rle` (`kind` counts `bad`, or their sum)."""
  if runs is None or min(runs, default=0) < 0:
    raise _AnnotationError("bad_rle", f"{kind} counts {bad}")
  if sum(runs) != height * width:
    raise _AnnotationError(
      "bad_rle", f"{kind} counts sum to {sum(runs)}, not {height * width} pixels"
    )


def compressed_runs(counts: bytes) -> Optional[List[int]]:
  """The run lengths of COCO's compressed RLE string (pycocotools'
  `rleFrString`: 5 bits a character from '0', a run as a difference from the
  run two before it), or None when the string is no such encoding."""
  runs, p = [], 0
  while p < len(counts):
    x, k, more = 0, 0, True
    while more:
      if p >= len(counts) or not 48 <= counts[p] < 112:
        return None
      c = counts[p] - 48
      x |= (c & 0x1F) << (5 * k)
      more, p, k = bool(c & 0x20), p + 1, k + 1
      if not more and c & 0x10:
        x |= -1 << (5 * k)
    runs.append(x + (runs[-2] if len(runs) > 2 else 0))
  return runs


def ellipse_polygon(cx: float, cy: float, rx: float, ry: float, degrees: float = 0.0):
  """An ellipse (centre, radii, turned `degrees` clockwise on the image) as a
  flat polygon of ELLIPSE_POINTS points, as annotation tools draw it."""
  turn = math.radians(degrees)
  flat = []
  for i in range(ELLIPSE_POINTS):
    t = 2 * math.pi * i / ELLIPSE_POINTS
    x, y = rx * math.cos(t), ry * math.sin(t)
    flat += [cx + x * math.cos(turn) - y * math.sin(turn)]
    flat += [cy + x * math.sin(turn) + y * math.cos(turn)]
  return flat


def segmentation_of(parts: List[Any], height: int, width: int):
  """One object's parts (flat polygons, bool [height, width] regions) as a
  COCO segmentation: its polygons, or (with a region among them) the RLE of
  their union."""
  if all(isinstance(p, list) for p in parts):
    return parts
  from pycocotools import mask as mask_utils  # pylint: disable=g-import-not-at-top

  union = np.zeros((height, width), bool)
  for p in parts:
    if isinstance(p, list):
      p = mask_utils.frPyObjects([_near_image(p, height, width)], height, width)
      p = mask_utils.decode(p)[..., 0].astype(bool)
    union |= p
  rle = mask_utils.encode(np.asfortranarray(union.astype(np.uint8)))
  return {"size": [height, width], "counts": rle["counts"].decode("ascii")}


def object_rows(
  objects: Dict[Any, Dict[str, Any]], height: int, width: int
) -> List[Dict[str, Any]]:
  """Annotation rows of objects gathered from a tool's shapes: each row's
  `parts` (`segmentation_of`) become its segmentation, unless it failed
  (`error`); rows without parts (boxes) are kept as they are."""
  rows = []
  for row in objects.values():
    parts = row.pop("parts", None)
    if parts and not row.get("error"):
      row["segmentation"] = segmentation_of(parts, height, width)
    rows.append(row)
  return rows


def _region(seg, height: int, width: int) -> np.ndarray:
  if isinstance(seg, dict):
    region = _rle(seg, height, width)
  elif isinstance(seg, list):
    region = _polygons(seg, height, width) if seg else None
    if region is None:
      raise _AnnotationError("empty_segmentation", "the segmentation is empty")
  else:
    raise _AnnotationError(
      "bad_segmentation", f"segmentation is a {type(seg).__name__}, not polygons or an RLE"
    )
  region = region.astype(bool)
  if not region.any():
    raise _AnnotationError("empty_segmentation", "the segmentation covers no pixel")
  return region


def paint_objects(
  regions: List[np.ndarray], mask: np.ndarray, layers: Optional[List[float]] = None
) -> np.ndarray:
  """Paints objects 1..N (bool regions, in order) into `mask`, in place:
  by layer, the lowest first (a tool's z order: an object of a higher layer
  is drawn over one below it), and within a layer largest first, so a small
  object on a large one stays visible (equal areas in order). Returns `mask`."""
  areas = [int(region.sum()) for region in regions]
  layers = layers or [0] * len(regions)
  for i in sorted(range(len(regions)), key=lambda i: (layers[i], -areas[i], i)):
    mask[regions[i]] = i + 1
  return mask


class ImageEntryError(ValueError):
  """An images entry whose size cannot be used (an image-level error)."""


def instance_mask(coco: Dict[str, Any], image_id: str) -> Tuple[np.ndarray, List[Dict[str, Any]]]:
  """Renders one image's annotations -> (uint8 instance mask, annotation errors).

  Objects get ids 1..N in annotation-id order and are painted by their rows'
  `z` (a tool's z order; none: 0), then largest first (`paint_objects`);
  crowd regions, the boxes of detection-only rows (`box_only`), and what
  failed annotations still cover, are ignore (255).
  """
  try:
    height, width = int(coco["height"]), int(coco["width"])
    if height <= 0 or width <= 0:
      raise ValueError
  except (TypeError, ValueError, KeyError):
    raise ImageEntryError(
      f"images entry {coco.get('id')} has no valid height and width "
      f"({coco.get('height')!r} x {coco.get('width')!r})"
    ) from None
  errors, objects, ignore = [], [], np.zeros((height, width), bool)

  def fail(ann, reason, detail):
    errors.append(entry_error(reason, detail, ann["where"], image_id, ann.get("id")))

  for ann in coco["annotations"]:
    if ann.get("error"):
      fail(ann, *ann["error"])
      continue
    if box_only(ann):
      ignore |= _box_region(ann["bbox"], height, width)
      continue
    try:
      region = _region(ann.get("segmentation"), height, width)
    except _AnnotationError as e:
      fail(ann, e.reason, e.detail)
      if e.region is not None:
        ignore |= e.region.astype(bool)
      continue
    if crowd(ann):
      ignore |= region
    else:
      objects.append((ann, region))
  for ann, region in objects[MAX_OBJECTS:]:
    fail(ann, "too_many_objects", f"an instance mask holds at most {MAX_OBJECTS} objects")
    ignore |= region
  objects = objects[:MAX_OBJECTS]
  mask = paint_objects(
    [region for _, region in objects],
    np.where(ignore, keys.IGNORE, keys.BACKGROUND).astype(np.uint8),
    [ann.get("z") or 0 for ann, _ in objects],
  )
  for i, (ann, _) in enumerate(objects):
    if not (mask == i + 1).any():
      fail(ann, "hidden_object", "other objects painted over every pixel of this one")
  return mask, errors


def _displayed_size(image_bytes: bytes):
  """(height, width) of an image as viewers show it (EXIF orientation applied),
  from its header; None when it cannot be read (decode will say why)."""
  import io  # pylint: disable=g-import-not-at-top
  from PIL import Image  # pylint: disable=g-import-not-at-top

  try:
    im = Image.open(io.BytesIO(image_bytes))
    width, height = im.size
    orientation = im.getexif().get(0x0112, 1)
  except Exception:  # pylint: disable=broad-except
    return None
  return (width, height) if orientation in (5, 6, 7, 8) else (height, width)


@register_layout
class Coco(Layout):
  """COCO instance annotations: one JSON file, images under an image root."""

  name = "coco"
  labels = ("instances",)
  gives = (keys.INSTANCE_MASK,)
  expects = (
    "--input instances.json [--image-root DIR]: COCO instance annotations "
    "(polygons, RLE; iscrowd regions become ignore pixels), as COCO, LVIS, CVAT, "
    "Label Studio and Roboflow write them"
  )
  priority = 10
  takes_image_root = True

  def detect(self, root: str, offline: bool = False) -> bool:
    if not root.lower().endswith(".json"):
      return False
    return offline or looks_like_coco(root)

  def check_input(self, options: ReadOptions) -> None:
    if common.is_folder(options.root):
      raise InputError(
        f"{options.root} is a folder; the coco layout reads one annotation "
        "file: --input instances.json [--image-root IMAGES_DIR]"
      )
    image_root = image_root_of(options.root, options.image_root)
    if not keys.is_remote(image_root) and not common.is_folder(image_root):
      raise InputError(
        f"image root {image_root} (of the COCO file {options.root}) is not a "
        "folder; give --image-root"
      )

  def list_inputs(self, options: ReadOptions):
    return ListCoco(options.root, options.image_root, options.allow_outside_root)

  def materialize(self, pointer):
    return materialize(pointer)


def materialize(pointer: Dict[str, Any]) -> Dict[str, Any]:
  """A pointer of annotation rows (`coco`: its images entry and rows) -> the
  image's bytes and the instance mask drawn from the rows (`object_errors`:
  the rows that failed)."""
  ex = dict(pointer)
  ex[keys.IMAGE_BYTES] = common.read_bytes(ex[keys.SOURCE])
  entry = dict(ex.pop("coco"))
  if entry.get("height") is None and entry.get("width") is None:
    size = _displayed_size(ex[keys.IMAGE_BYTES])
    if size is not None:  # The file gives the size the entry left out.
      entry["height"], entry["width"] = size
  try:
    ex[keys.INSTANCE_MASK], ex["object_errors"] = instance_mask(entry, ex[keys.IMAGE_ID])
  except ImageEntryError as e:
    raise ExampleError("bad_image_entry", str(e)) from None
  return ex
