"""CVAT's own export, "CVAT for images 1.1": annotations.xml and images/.

    --layout cvat --input DIR (or DIR/annotations.xml) [--image-root DIR]

DIR is the export unzipped, with "Save images": annotations.xml, and the
images under images/ by their `name` (or under --image-root; a project's
export: under images/SUBSET/; a video task's: `name` with its file's
extension). Each <image>
(`name`, `width`, `height`) is one input; its shapes, in document order:

  polygon   `points` "x1,y1;x2,y2;..."                an object
  mask      `rle` over the box `left`, `top`, `width`, `height`: run
            lengths of 0s and 1s in turn, row by row, from a run of 0s
                                                      an object
  ellipse   `cx`, `cy`, `rx`, `ry` (and `rotation`)   an object
  box       `xtl`, `ytl`, `xbr`, `ybr`                a box-only object: its
                                                      box is ignore, as the
                                                      coco layout's boxes
  polyline, points, skeleton, cuboid, tag             no area: not read

Shapes sharing a `group_id` (not 0) are one object. The instance mask is
drawn as the coco layout draws its rows (`coco.instance_mask`: objects
1..N in document order, painted by CVAT's `z_order`, the highest on top as
CVAT draws them, then the largest first, so a small object on a large one
of the same z_order stays visible; a group takes its first shape's
z_order), and the same dead letters follow; a shape this layout cannot
read is `bad_shape`.
"""

import posixpath
import xml.etree.ElementTree as ET
from typing import Any, Dict, Iterator, List, Tuple

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems

from beam_prep import keys
from beam_prep.layouts import coco, common
from beam_prep.layouts.registry import InputError, Layout, ReadOptions, register_layout

ANNOTATIONS_FILE, IMAGES_DIR = "annotations.xml", "images"
AREA_SHAPES = ("polygon", "mask", "ellipse")


class CvatError(ValueError):
  """The file is not a CVAT XML export (the message names it and why)."""


def annotations_file(root: str) -> str:
  """The XML file of `--input`: the file itself, or DIR/annotations.xml."""
  return root if root.lower().endswith(".xml") else FileSystems.join(root, ANNOTATIONS_FILE)


def _points(text: str) -> List[float]:
  flat = [float(v) for pair in text.split(";") for v in pair.split(",")]
  if len(flat) % 2 or len(flat) < 6:
    raise ValueError(f"{len(flat) // 2} points: a polygon needs 3 or more")
  return flat


def _ellipse(a: Dict[str, str]) -> List[float]:
  cx, cy, rx, ry = (float(a[k]) for k in ("cx", "cy", "rx", "ry"))
  return coco.ellipse_polygon(cx, cy, rx, ry, float(a.get("rotation", 0)))


def mask_region(a: Dict[str, str], height: int, width: int) -> np.ndarray:
  """A <mask>'s pixels, bool [height, width]: its run lengths over its box."""
  left, top, w, h = (int(float(a[k])) for k in ("left", "top", "width", "height"))
  runs = [int(v) for v in a["rle"].replace(" ", "").split(",") if v]
  if any(r < 0 for r in runs) or sum(runs) != w * h:
    raise ValueError(f"its runs cover {sum(runs)} pixels, its {w}x{h} box {w * h}")
  box = np.repeat(np.arange(len(runs)) % 2 == 1, runs).reshape(h, w)
  region = np.zeros((height, width), bool)
  y1, x1 = min(top + h, height), min(left + w, width)
  region[max(top, 0) : y1, max(left, 0) : x1] = box[
    max(-top, 0) : y1 - top, max(-left, 0) : x1 - left
  ]
  return region


def _part(tag: str, a: Dict[str, str], height: int, width: int):
  """One area shape -> a polygon (flat list) or a bool region."""
  if tag == "polygon":
    return _points(a["points"])
  if tag == "ellipse":
    return _ellipse(a)
  return mask_region(a, height, width)


def _box(a: Dict[str, str]) -> List[float]:
  x0, y0, x1, y1 = (float(a[k]) for k in ("xtl", "ytl", "xbr", "ybr"))
  return [x0, y0, x1 - x0, y1 - y0]


def _z_order(el: ET.Element) -> int:
  try:
    return int(el.get("z_order", 0))
  except ValueError:
    return 0  # Not a number: drawn as if none were given.


def image_annotations(image: ET.Element, where: str) -> List[Dict[str, Any]]:
  """An <image>'s shapes as the coco layout's annotation rows (`coco.instance_mask`)."""
  height, width = int(image.get("height", 0)), int(image.get("width", 0))
  objects: Dict[Any, Dict[str, Any]] = {}
  for n, el in enumerate(image):
    here = f"{where}/{el.tag}[{n}]"
    group = el.get("group_id", "0")
    key = ("group", group) if group not in ("", "0") else ("shape", n)
    if el.tag == "box":
      objects[("box", n)] = {"id": n, "bbox": _box(el.attrib), "where": here}
      continue
    if el.tag not in AREA_SHAPES:
      continue
    row = objects.setdefault(key, {"id": n, "parts": [], "where": here, "z": _z_order(el)})
    try:
      row["parts"].append(_part(el.tag, el.attrib, height, width))
    except (KeyError, ValueError) as e:
      row["error"] = ("bad_shape", f"a {el.tag}: {type(e).__name__}: {e}")
  return coco.object_rows(objects, height, width)


def _entries(path: str) -> Iterator[Tuple[ET.Element, str]]:
  """Each <image> of a CVAT XML file, streamed, with where it is."""
  n = 0
  with FileSystems.open(path) as f:
    try:
      for _, el in ET.iterparse(f, events=("end",)):
        if el.tag == "image":
          yield el, f"{path}:image[{n}]"
          n += 1
          el.clear()
    except ET.ParseError as e:
      raise CvatError(f"{path} is not a CVAT XML file: {e}") from None
  if not n:
    raise CvatError(
      f"{path} holds no <image>: export the task as 'CVAT for images 1.1' ('CVAT for video' "
      "lists tracks)"
    )


def _pointers(path: str, image_root: str, allow: bool):
  """The pointer of each <image>; a dead letter for one without a usable name."""
  for image, where in _entries(path):
    name = image.get("name", "")
    try:
      source = _source(image, image_root, allow)
    except ValueError as e:
      yield beam.pvalue.TaggedOutput(
        common.ERRORS_TAG, coco.entry_error("path_outside_root", str(e), where)
      )
      continue
    yield coco.rows_pointer(
      name,
      source,
      {"id": image.get("id", name), "height": image.get("height"), "width": image.get("width")},
      image_annotations(image, where),
    )


def _source(image: ET.Element, root: str, allow: bool) -> str:
  """The file of an <image>: ROOT/NAME, else ROOT/SUBSET/NAME (a project's
  export keeps each subset's images apart), each as NAME.* when NAME has no
  extension (a video task's frames: frame_000000 is frame_000000.PNG); the
  first when none exists (its read is then `missing_image`, naming it)."""
  name, subset = image.get("name", ""), image.get("subset", "")
  names = [name, f"{subset}/{name}"] if subset else [name]
  paths = [common.resolve(root, n, root, allow) for n in names]
  for path in paths:
    if common.exists(path):
      return path
    if not posixpath.splitext(path)[1]:
      found = FileSystems.match([path + ".*"], limits=[1])[0].metadata_list
      if found:
        return found[0].path
  return paths[0]


def _is_cvat_xml(path: str) -> bool:
  """Whether `path` is an XML file whose root element is <annotations>."""
  try:
    with FileSystems.open(path) as f:
      for _, el in ET.iterparse(f, events=("start",)):
        return el.tag == "annotations"
  except Exception:  # pylint: disable=broad-except
    return False
  return False


@register_layout
class Cvat(Layout):
  name = "cvat"
  labels = ("instances",)
  gives = (keys.INSTANCE_MASK,)
  expects = (
    "ROOT/annotations.xml + ROOT/images/ (CVAT's 'CVAT for images 1.1' export with its "
    "images; polygons, masks and ellipses are objects, boxes ignore regions)"
  )
  priority = 15
  takes_image_root = True

  def detect(self, root: str, offline: bool = False) -> bool:
    path = annotations_file(root)
    if offline:
      return root.lower().endswith(".xml")
    return common.exists(path) and _is_cvat_xml(path)

  def check_input(self, options: ReadOptions) -> None:
    path = annotations_file(options.root)
    if not keys.is_remote(path) and not common.exists(path):
      raise InputError(f"no {ANNOTATIONS_FILE} in {options.root}")

  def list_inputs(self, options: ReadOptions):
    path = annotations_file(options.root)
    root = options.image_root or FileSystems.join(posixpath.dirname(path) or ".", IMAGES_DIR)
    return common.ReadPointers(path, _pointers, root.rstrip("/"), options.allow_outside_root)

  def materialize(self, pointer):
    return coco.materialize(pointer)
