"""Label Studio's JSON export: its tasks, each an image and its annotations.

    --layout label_studio --input export.json [--image-root DIR]

Export the project as "JSON" (Export > JSON; JSON-MIN drops what regions
are). The file is a list of tasks; each task (`id`, `data`, `annotations`)
is one input. Of a task's annotations, the one read is the one marked
ground truth, else the last updated one that was not cancelled (skipped);
drafts and predictions are not read. Its regions (`result` items):

  brushlabels      `value.rle`: Label Studio's brush RLE (`beam_prep.brush`)
                                                      an object
  polygonlabels    `value.points` [[x, y], ...]       an object
  ellipselabels    `value.x`, `value.y` (centre), `radiusX`, `radiusY`,
                   `rotation`                          an object
  rectanglelabels  `value.x`, `value.y` (top left), `width`, `height`,
                   `rotation`                          a box-only object: its
                                                      box is ignore, as the
                                                      coco layout's boxes
  brush, polygon, ellipse, rectangle                  the same, from a shape
                                                      tag beside a <Labels> tag
  other types (keypoints, labels, choices, ...)       not read

Coordinates are percents of `original_width` and `original_height`, and
results sharing an `id` are one region (one object). Each task is drawn
as the coco layout draws its rows (`coco.instance_mask`), with the same
dead letters; a region this layout cannot read is `bad_shape`, a task
with no annotation to read is `no_annotation`, and a task whose image an
earlier task has is `duplicate_image_id` (the earlier one is read).

The task's image is `data.image` (or the task's only data value), found
under IMAGE_ROOT (--image-root, else the JSON file's folder):

  /data/upload/P/NAME        IMAGE_ROOT/P/NAME (IMAGE_ROOT is Label Studio's
                             media/upload folder), IMAGE_ROOT/NAME, or
                             IMAGE_ROOT/ORIGINAL: NAME without the 8-character
                             prefix Label Studio gives an upload (your own
                             copy of the images)
  /data/local-files/?d=PATH  IMAGE_ROOT/PATH, or IMAGE_ROOT/BASENAME
  gs://..., s3://...         read where it is, when under IMAGE_ROOT (give
                             --image-root gs://BUCKET) or with
                             --allow-outside-root
  http(s)://HOST/.../NAME    IMAGE_ROOT/NAME
  anything else              IMAGE_ROOT/that path

The first of these that exists is read; when none does, the image is a
`missing_image` dead letter naming the first. A path that leaves
IMAGE_ROOT is `path_outside_root` (unless --allow-outside-root).
"""

import math
import posixpath
import re
import urllib.parse
from typing import Any, Dict, Iterator, List, Optional, Tuple

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from beam_prep import brush, keys
from beam_prep.layouts import coco, common
from beam_prep.layouts.registry import InputError, Layout, ReadOptions, register_layout

AREA_TYPES = ("brushlabels", "polygonlabels", "ellipselabels")
BOX_TYPE = "rectanglelabels"
# A shape tag used beside a separate <Labels> tag gives its results the
# shape's own type (its label in a "labels" result of the same id): the
# same values as the labelled kind.
UNLABELLED_TYPES = {t[: -len("labels")]: t for t in (*AREA_TYPES, BOX_TYPE)}
UPLOAD, LOCAL_FILES = "/data/upload/", "/data/local-files/"
_UPLOAD_PREFIX = re.compile(r"^[0-9a-f]{8}-")  # Label Studio's prefix of an uploaded file.


class LabelStudioError(ValueError):
  """The file is not a Label Studio JSON export (the message names it and why)."""


def rectangle_corners(value: Dict[str, Any], width: int, height: int) -> List[Tuple[float, float]]:
  """The corners in pixels of a rectangle region's `value` (x, y, width,
  height: percents; turned `rotation` degrees clockwise about its top left)."""
  turn = math.radians(float(value.get("rotation") or 0))
  cos, sin = math.cos(turn), math.sin(turn)
  x, y = float(value["x"]) / 100 * width, float(value["y"]) / 100 * height
  dx, dy = float(value["width"]) / 100 * width, float(value["height"]) / 100 * height
  return [
    (x + a * cos - b * sin, y + a * sin + b * cos) for a, b in ((0, 0), (dx, 0), (dx, dy), (0, dy))
  ]


def _polygon(value: Dict[str, Any], width: int, height: int) -> List[float]:
  points = value["points"]
  if len(points) < 3:
    raise ValueError(f"{len(points)} points: a polygon needs 3 or more")
  return [float(c) / 100 * size for p in points for c, size in zip(p, (width, height), strict=True)]


def _ellipse(value: Dict[str, Any], width: int, height: int) -> List[float]:
  cx, cy = float(value["x"]) / 100 * width, float(value["y"]) / 100 * height
  rx, ry = float(value["radiusX"]) / 100 * width, float(value["radiusY"]) / 100 * height
  return coco.ellipse_polygon(cx, cy, rx, ry, float(value.get("rotation") or 0))


def _part(kind: str, value: Dict[str, Any], width: int, height: int):
  """An area region -> a flat polygon in pixels, or a bool [height, width] region."""
  if kind == "polygonlabels":
    return _polygon(value, width, height)
  if kind == "ellipselabels":
    return _ellipse(value, width, height)
  if value.get("format", "rle") != "rle":
    raise ValueError(f"a brush in format {value.get('format')!r}, not 'rle'")
  return brush.decode(value["rle"], height, width)


def _box(value: Dict[str, Any], width: int, height: int) -> List[float]:
  xs, ys = zip(*rectangle_corners(value, width, height), strict=True)
  return [min(xs), min(ys), max(xs) - min(xs), max(ys) - min(ys)]


def _size(results: List[Any]) -> Tuple[Optional[int], Optional[int]]:
  """(height, width) the regions were drawn on (None: no region says)."""
  for r in results:
    if isinstance(r, dict) and r.get("original_width") and r.get("original_height"):
      return int(r["original_height"]), int(r["original_width"])
  return None, None


def _region_row(r: Any, n: int, height, width, where: str) -> Optional[Tuple[Any, Dict[str, Any]]]:
  """(region key, row) of one result: a part of an object, a box, an error;
  None for results of no area."""
  kind = r.get("type") if isinstance(r, dict) else None
  kind = UNLABELLED_TYPES.get(kind, kind) if isinstance(kind, str) else None
  if kind not in AREA_TYPES and kind != BOX_TYPE:
    return None
  key = r.get("id") or n
  row: Dict[str, Any] = {"id": key, "where": where}
  try:
    if r.get("image_rotation"):
      raise ValueError(f"image_rotation {r['image_rotation']} is not read: label it unrotated")
    if (int(r["original_height"]), int(r["original_width"])) != (height, width):
      raise ValueError(
        f"drawn on a {r['original_width']}x{r['original_height']} image, not {width}x{height}"
      )
    if kind == BOX_TYPE:
      row["bbox"] = _box(r["value"], width, height)
    else:
      row["part"] = _part(kind, r["value"], width, height)
  except (AttributeError, KeyError, TypeError, ValueError, brush.BrushError) as e:
    row["error"] = ("bad_shape", f"a {kind} region: {type(e).__name__}: {e}")
  return key, row


def annotation_rows(results: List[Any], where: str) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
  """An annotation's regions -> (the image's size entry, the coco layout's
  annotation rows for `coco.instance_mask`)."""
  height, width = _size(results)
  objects: Dict[Any, Dict[str, Any]] = {}
  for n, r in enumerate(results):
    found = _region_row(r, n, height, width, f"{where}.result[{n}]")
    if found is None:
      continue
    key, row = found
    if "bbox" in row:
      objects[("box", n)] = row
      continue
    obj = objects.setdefault(key, {"id": row["id"], "where": row["where"], "parts": []})
    if "error" in row:
      obj["error"] = row["error"]
    else:
      obj["parts"].append(row.pop("part"))
  return {"height": height, "width": width}, coco.object_rows(objects, height, width)


def chosen_annotation(task: Dict[str, Any]) -> Optional[Dict[str, Any]]:
  """The annotation of a task to read: the ground truth, else the last updated
  of those not cancelled; None when there is none."""
  usable = [
    a
    for a in task.get("annotations") or task.get("completions") or []
    if isinstance(a, dict) and not (a.get("was_cancelled") or a.get("skipped"))
  ]
  if not usable:
    return None
  return max(
    usable,
    key=lambda a: (
      bool(a.get("ground_truth")),
      str(a.get("updated_at") or a.get("created_at") or ""),
    ),
  )


def image_reference(task: Dict[str, Any]) -> str:
  """The task's image: `data.image`, or the task's only data value."""
  data = task.get("data")
  if not isinstance(data, dict):
    raise ValueError("the task has no 'data'")
  if isinstance(data.get("image"), str):
    return data["image"]
  values = [v for v in data.values() if isinstance(v, str)]
  if len(values) != 1:
    raise ValueError(f"no data.image, and {len(values)} data values to choose from: {sorted(data)}")
  return values[0]


def candidates(ref: str) -> List[str]:
  """The relative paths under the image root where a task's image may be, in order
  (a path of its own, gs:// say, alone)."""
  parsed = urllib.parse.urlparse(ref)
  if parsed.scheme in ("http", "https"):
    return [posixpath.basename(urllib.parse.unquote(parsed.path))]
  if keys.is_remote(ref):
    return [ref]  # Read where it is.
  if ref.startswith(UPLOAD):
    rest = urllib.parse.unquote(ref[len(UPLOAD) :])
    name = posixpath.basename(rest)
    return [rest, name, _UPLOAD_PREFIX.sub("", name)]
  if parsed.path.rstrip("/").endswith(LOCAL_FILES.rstrip("/")):
    path = urllib.parse.parse_qs(parsed.query).get("d", [""])[0]
    return [path, posixpath.basename(path)]
  return [urllib.parse.unquote(ref).lstrip("/")]


def _names(task: Dict[str, Any]) -> List[str]:
  """The candidates of a task's image (`candidates`)."""
  ref = image_reference(task)
  names = [c for c in dict.fromkeys(candidates(ref)) if c]
  if not names:
    raise ValueError(f"its image reference {ref!r} names no file")
  return names


def _source(names: List[str], root: str, allow: bool) -> Tuple[str, str]:
  """(name, path) of a task's image: the first candidate that exists, else the first.

  Raises:
    ValueError: a candidate leaves the image root (`common.resolve`).
  """
  paths = []
  for name in names:
    path = common.resolve(root, name, root, allow)
    if keys.is_remote(name) or common.exists(path):
      return name, path
    paths.append(path)
  return names[0], paths[0]


def _tasks(path: str) -> Iterator[Tuple[Any, str]]:
  """Each task of the export, streamed, with where it is."""
  n = 0
  with FileSystems.open(path) as f:
    try:
      for n, task in enumerate(coco.iter_items(f), start=1):
        if n == 1 and isinstance(task, dict) and "data" not in task:
          raise LabelStudioError(
            f"{path}: its first item has no 'data' ({', '.join(sorted(task)[:6])}): not Label "
            "Studio's JSON export (JSON-MIN and CSV leave out what regions are): export as JSON"
          )
        yield task, f"{path}:task[{n - 1}]"
    except LabelStudioError:
      raise
    except ValueError as e:
      raise LabelStudioError(
        f"{path} is not a Label Studio JSON export (a list of tasks): {e}"
      ) from None
  if not n:
    raise LabelStudioError(f"{path} holds no task: export a project with tasks")


def _dead(record: Dict[str, Any]):
  return beam.pvalue.TaggedOutput(common.ERRORS_TAG, record)


def _pointer(task: Any, where: str, root: str, allow: bool):
  """A task's pointer, or its dead letter (tagged `ERRORS_TAG`)."""
  if not isinstance(task, dict):
    return _dead(coco.entry_error("bad_task", f"a {type(task).__name__}, not a task", where))
  task_id = str(task.get("id", where))
  try:
    names = _names(task)
  except ValueError as e:
    return _dead(coco.entry_error("bad_task", str(e), where, task_id))
  try:
    name, source = _source(names, root, allow)
  except ValueError as e:
    return _dead(coco.entry_error("path_outside_root", str(e), where, task_id))
  annotation = chosen_annotation(task)
  if annotation is None:
    detail = "no annotation (or every one cancelled): label the task, or leave it out of the export"
    return _dead(coco.entry_error("no_annotation", detail, where, task_id))
  results = annotation.get("result") if isinstance(annotation.get("result"), list) else []
  size, rows = annotation_rows(results, f"{where}.annotations[id={annotation.get('id')}]")
  return coco.rows_pointer(name.split("://", 1)[-1], source, {"id": task_id, **size}, rows)


def task_pointers(path: str, image_root: str, allow: bool):
  """The pointer of each task; a dead letter for a task that cannot be read,
  or whose image an earlier task has (`duplicate_image_id`: the first is read)."""
  first: Dict[str, str] = {}
  for task, where in _tasks(path):
    out = _pointer(task, where, image_root, allow)
    image_id = out.get(keys.IMAGE_ID) if isinstance(out, dict) else None
    if image_id in first:
      detail = f"its image {image_id} is {first[image_id]}'s too: that task is read"
      out = _dead(coco.entry_error("duplicate_image_id", detail, where, image_id))
    elif image_id is not None:
      first[image_id] = where
    yield out


# The fields of a JSON-MIN or CSV export's rows that a task of the JSON export has not.
MIN_EXPORT_FIELDS = {"annotation_id", "annotator"}
FULL, MIN = "full", "min"


def export_kind(path: str) -> str:
  """FULL when `path` is Label Studio's JSON export (a list whose first item
  is a task: `data`, `annotations`), MIN for its JSON-MIN or CSV export (rows
  without what the regions are), else ''."""
  try:
    with FileSystems.open(path) as f:
      if path.lower().endswith(".csv"):
        header = f.readline().decode("utf-8-sig").strip().split(",")
        return MIN if MIN_EXPORT_FIELDS <= set(header) else ""
      first = next(coco.iter_items(f, chunk=1 << 16), None)
  except Exception:  # pylint: disable=broad-except
    return ""
  if not isinstance(first, dict):
    return ""
  if "data" in first and ("annotations" in first or "completions" in first):
    return FULL
  return MIN if MIN_EXPORT_FIELDS & set(first) else ""


@register_layout
class LabelStudio(Layout):
  name = "label_studio"
  labels = ("instances",)
  gives = (keys.INSTANCE_MASK,)
  expects = (
    "--input export.json [--image-root DIR]: Label Studio's JSON export (brushes, polygons "
    "and ellipses are objects, rectangles ignore regions)"
  )
  priority = 12
  takes_image_root = True

  def detect(self, root: str, offline: bool = False) -> bool:
    """Its JSON export, and its JSON-MIN and CSV exports (refused, saying why)."""
    if not root.lower().endswith((".json", ".csv")):
      return False
    return (offline and root.lower().endswith(".json")) or bool(export_kind(root))

  def check_input(self, options: ReadOptions) -> None:
    if common.is_folder(options.root):
      raise InputError(
        f"{options.root} is a folder; the label_studio layout reads one export file: "
        "--input export.json [--image-root IMAGES_DIR]"
      )
    if export_kind(options.root) == MIN:
      raise InputError(
        f"{options.root} is Label Studio's JSON-MIN or CSV export, which leaves out what "
        "its regions are (their types and ids): export the project as JSON"
      )

  def list_inputs(self, options: ReadOptions):
    root = coco.image_root_of(options.root, options.image_root)
    return common.ReadPointers(options.root, task_pointers, root, options.allow_outside_root)

  def materialize(self, pointer):
    return coco.materialize(pointer)
