"""`ReadExamples`: every supported input layout, read through Beam FileSystems.

Layouts (`layout=`):

  folders    ROOT/images/NAME.png|jpg + ROOT/masks/NAME.png (same stem)
  voc        Pascal VOC: ROOT/JPEGImages/ID.jpg, ROOT/SegmentationObject/ID.png,
             ROOT/ImageSets/Segmentation/{train,val}.txt (the split comes from
             the lists: train -> train, val -> eval)
  classes    ROOT/<label>/NAME.png|jpg, one folder per class (classification)
  manifest   a CSV (header row) or JSON-lines file with `image` and optional
             `mask`, `label`, `split` (train/eval); relative paths are relative
             to the manifest's folder
  coco       a COCO instance-annotation JSON file (COCO, LVIS, CVAT, Label
             Studio, Roboflow exports) with images under `image_root`
             (default: the JSON file's folder); see `beam_prep.coco`
  auto       voc if ROOT/JPEGImages exists, coco if ROOT is a JSON file whose
             first key is a COCO key, manifest if ROOT is a .csv/.jsonl/.json
             file, folders if ROOT/images exists, else classes

`ListInputs` lists the inputs as small pointers (on the workers, so gs://
roots work on Dataflow); the job reads each pointer's files where its shard
is written (`beam_prep.sharding`), so no encoded file crosses a shuffle.
`ReadExamples` (for pipelines of one's own) reads them right away, after a
Reshuffle that spreads the reading over workers. Each input yields one
example dict:

  image_id     str    unique id (classes: "label/stem")
  source       str    image path
  image_bytes  bytes  the encoded image file
  mask_source  str    mask path (segmentation layouts)
  mask_bytes   bytes  the encoded mask, or None when the file is missing
  instance_mask uint8 [H, W]  coco: the mask drawn from the annotations
  annotation_errors  coco: dead-letter records of annotations that failed
  label        str    class name (classes, or a manifest's `label` column)
  split        str    "train"/"eval" when the layout fixes it

Inputs that cannot even be read (a manifest row without an image, a path
that leaves the data root, a listed file that does not exist) go to the
errors output with a reason, like every other failure.
"""

import csv
import io
import json
import posixpath
from typing import Any, Dict, Tuple

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from beam_prep import keys

LAYOUTS = ("auto", "folders", "voc", "classes", "manifest", "coco")
ERRORS_TAG = "errors"
_VOC_SPLITS = {"train": keys.TRAIN_SPLIT, "val": keys.EVAL_SPLIT}


def error_record(stage: str, reason: str, detail: str, ex: Dict[str, Any]) -> Dict[str, Any]:
  """A dead-letter entry: where the input came from, which stage, and why."""
  rec = {
      "source": ex.get("source", ""),
      "image_id": ex.get("image_id", ""),
      "stage": stage,
      "reason": reason,
      "detail": detail,
  }
  for k in ("object_id", "variant"):
    if k in ex:
      rec[k] = int(ex[k])
  return rec


def _stem(path: str) -> str:
  return posixpath.splitext(path.rstrip("/").split("/")[-1])[0]


def _parent(path: str) -> str:
  return path.rstrip("/").split("/")[-2]


def _hidden(path: str) -> bool:
  return any(part.startswith(".") for part in path.rstrip("/").split("/")[-2:])


def _is_manifest(path: str) -> bool:
  return path.lower().endswith((".csv", ".jsonl", ".json"))


def detect_layout(root: str) -> str:
  """Guesses the layout of `root` (see the module docstring)."""
  if root.lower().endswith(".json"):
    from beam_prep import coco  # pylint: disable=g-import-not-at-top
    if coco.looks_like_coco(root):
      return "coco"
  if _is_manifest(root):
    return "manifest"
  if FileSystems.exists(FileSystems.join(root, "JPEGImages")):
    return "voc"
  if FileSystems.exists(FileSystems.join(root, "images")):
    return "folders"
  return "classes"


def input_patterns(root: str, layout: str) -> Tuple[str, ...]:
  """What must exist for `layout` to find any input (for early checks)."""
  if layout == "folders":
    return (FileSystems.join(root, "images", "*"),)
  if layout == "voc":
    return (FileSystems.join(root, "ImageSets", "Segmentation", "*.txt"),)
  if layout == "classes":
    return (FileSystems.join(root, "*", "*"),)
  return (root,)


def _resolve(base: str, path: str, root: str, allow_outside_root: bool) -> str:
  """Joins a manifest path to the manifest's folder; refuses escapes."""
  if "://" in path or path.startswith("/"):
    full = path
  else:
    full = posixpath.normpath(posixpath.join(base, path))
    if "://" in base:  # normpath collapses "gs://" to "gs:/"
      scheme, rest = base.split("://", 1)
      full = f"{scheme}://" + posixpath.normpath(posixpath.join(rest, path))
  root_dir = root.rstrip("/") + "/"
  if not allow_outside_root and not full.startswith(root_dir):
    raise ValueError(f"path {path!r} resolves to {full}, outside the data root {root_dir} "
                     "(pass --allow-outside-root to permit)")
  return full


class _ManifestRowsFn(beam.DoFn):
  """Reads a CSV or JSON-lines manifest into input pointers."""

  def __init__(self, allow_outside_root: bool):
    self._allow = allow_outside_root

  def process(self, manifest: str):
    base = manifest.rsplit("/", 1)[0] if "/" in manifest else "."
    with FileSystems.open(manifest) as f:
      text = f.read().decode("utf-8")
    if manifest.lower().endswith(".csv"):
      rows = list(csv.DictReader(io.StringIO(text)))
    else:
      rows = []
      for n, line in enumerate(text.splitlines(), start=1):
        if line.strip():
          try:
            rows.append(json.loads(line))
          except json.JSONDecodeError as e:
            rows.append({"__error__": f"line {n} is not JSON: {e}"})
    for n, row in enumerate(rows, start=1):
      where = {"source": f"{manifest}:{n}"}
      if not isinstance(row, dict) or "__error__" in row or not row.get("image"):
        detail = row.get("__error__") if isinstance(row, dict) else "not an object"
        yield beam.pvalue.TaggedOutput(ERRORS_TAG, error_record(
            "read", "bad_manifest_row", detail or "row has no 'image'", where))
        continue
      try:
        image = _resolve(base, str(row["image"]), base, self._allow)
        mask = _resolve(base, str(row["mask"]), base, self._allow) if row.get("mask") else None
      except ValueError as e:
        yield beam.pvalue.TaggedOutput(ERRORS_TAG, error_record(
            "read", "path_outside_root", str(e), where))
        continue
      pointer = {"image_id": row.get("id") or _stem(image), "source": image}
      if mask:
        pointer["mask_source"] = mask
      if row.get("label"):
        pointer["label"] = str(row["label"])
      split = row.get("split")
      if split:
        pointer["split"] = _VOC_SPLITS.get(split, split)
      yield pointer


def _voc_pointers(list_path: str, root: str):
  name = _stem(list_path)
  if name not in _VOC_SPLITS:
    return
  with FileSystems.open(list_path) as f:
    ids = [l.strip() for l in f.read().decode("utf-8").splitlines() if l.strip()]
  for image_id in ids:
    yield {
        "image_id": image_id,
        "source": FileSystems.join(root, "JPEGImages", image_id + ".jpg"),
        "mask_source": FileSystems.join(root, "SegmentationObject", image_id + ".png"),
        "split": _VOC_SPLITS[name],
    }


def read_files(pointer: Dict[str, Any]):
  """Reads the files a pointer names -> `(example, None)`, or `(None, error)`
  when the image cannot be read (a missing mask is the decode stage's to judge)."""
  ex = dict(pointer)
  try:
    with FileSystems.open(ex["source"]) as f:
      ex["image_bytes"] = f.read()
  except Exception as e:  # pylint: disable=broad-except
    missing = not FileSystems.exists(ex["source"])
    return None, error_record("read", "missing_image" if missing else "unreadable_file",
                              f"{type(e).__name__}: {e}", ex)
  mask = ex.get("mask_source")
  if mask is not None:
    ex["mask_bytes"] = None
    if FileSystems.exists(mask):
      with FileSystems.open(mask) as f:
        ex["mask_bytes"] = f.read()
  if "coco" in ex:
    from beam_prep import coco  # pylint: disable=g-import-not-at-top
    try:
      ex[keys.INSTANCE_MASK], ex["annotation_errors"] = coco.instance_mask(
          ex.pop("coco"), ex["image_id"])
    except coco.ImageEntryError as e:
      return None, error_record("read", "bad_image_entry", str(e), ex)
  return ex, None


class _ReadFilesFn(beam.DoFn):
  """Reads the files a pointer names; a missing image is an error."""

  def __init__(self):
    self._read = Metrics.counter("beam_prep", "inputs_read")

  def process(self, pointer: Dict[str, Any]):
    self._read.inc()
    for error in pointer.get("annotation_errors", ()):  # coco: annotations of no image.
      yield beam.pvalue.TaggedOutput(ERRORS_TAG, error)
    if pointer.get("no_image"):
      return
    ex, error = read_files(pointer)
    if error is not None:
      yield beam.pvalue.TaggedOutput(ERRORS_TAG, error)
      return
    for error in ex.pop("annotation_errors", ()):
      yield beam.pvalue.TaggedOutput(ERRORS_TAG, error)
    yield ex


class ListInputs(beam.PTransform):
  """Lists the inputs of any supported layout as small pointers (no file is
  read but the listings: see the module docstring).

  Args:
    root: data root, or the manifest file for `layout="manifest"`.
    layout: one of `LAYOUTS`.
    allow_outside_root: let manifest (or COCO file_name) paths point outside
      the manifest's folder (or the image root).
    image_root: coco: the folder the images' `file_name`s are relative to
      (default: the JSON file's folder).

  Returns:
    `(pointers, errors)`: pointer dicts (`image_id`, `source`, and
    `mask_source`, `label`, `split` where the layout has them), and the
    inputs that cannot even be listed (bad manifest rows).
  """

  def __init__(self, root: str, layout: str = "auto", allow_outside_root: bool = False,
               image_root: str = ""):
    super().__init__()
    if layout not in LAYOUTS:
      raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    self._root = root.rstrip("/") if not _is_manifest(root) else root
    self._layout = detect_layout(root) if layout == "auto" else layout
    self._allow = allow_outside_root
    self._image_root = image_root

  @property
  def layout(self) -> str:
    return self._layout

  def expand(self, pbegin: beam.pvalue.PBegin) -> Tuple[beam.PCollection, beam.PCollection]:
    root = self._root
    if self._layout == "coco":
      from beam_prep import coco  # pylint: disable=g-import-not-at-top
      return pbegin | "ListCoco" >> coco.ListCoco(root, self._image_root, self._allow)
    if self._layout == "manifest":
      rows = (pbegin | "Manifest" >> beam.Create([root])
              | "ParseManifest" >> beam.ParDo(_ManifestRowsFn(self._allow)).with_outputs(
                  ERRORS_TAG, main="pointers"))
      return rows.pointers, rows[ERRORS_TAG]
    if self._layout == "voc":
      pointers = (pbegin
                  | "Lists" >> beam.Create(
                      [FileSystems.join(root, "ImageSets", "Segmentation", "*.txt")])
                  | "MatchLists" >> fileio.MatchAll()
                  | "ListPaths" >> beam.Map(lambda m: m.path)
                  | "ReadLists" >> beam.FlatMap(_voc_pointers, root))
    else:
      pattern = FileSystems.join(root, *(("images", "*") if self._layout == "folders"
                                         else ("*", "*")))
      mask_dir = FileSystems.join(root, "masks")
      layout = self._layout

      def pointer(path: str) -> Dict[str, Any]:
        if layout == "folders":
          return {"image_id": _stem(path), "source": path,
                  "mask_source": FileSystems.join(mask_dir, _stem(path) + ".png")}
        label = _parent(path)
        return {"image_id": f"{label}/{_stem(path)}", "source": path, "label": label}

      pointers = (pbegin
                  | "Pattern" >> beam.Create([pattern])
                  | "Match" >> fileio.MatchAll()
                  | "Paths" >> beam.Map(lambda m: m.path)
                  | "SkipHidden" >> beam.Filter(lambda p: not _hidden(p))
                  | "Pointers" >> beam.Map(pointer))
    errors = pbegin | "NoListErrors" >> beam.Create([])
    return pointers, errors


class ReadExamples(ListInputs):
  """Reads examples from any supported layout: `ListInputs`, then the files
  of each pointer, spread over workers.

  Returns:
    `(examples, errors)`.
  """

  def expand(self, pbegin: beam.pvalue.PBegin) -> Tuple[beam.PCollection, beam.PCollection]:
    pointers, list_errors = super().expand(pbegin)
    read = (pointers
            | "Spread" >> beam.Reshuffle()
            | "ReadFiles" >> beam.ParDo(_ReadFilesFn()).with_outputs(ERRORS_TAG, main="examples"))
    errors = (list_errors, read[ERRORS_TAG]) | "ReadErrors" >> beam.Flatten()
    return read.examples, errors
