"""A manifest: a CSV (header row) or JSON-lines file listing the inputs.

Columns: `image` (required), `mask`, `label`, `split` (train/eval, or val),
`id`. Relative paths are relative to the manifest's folder and may not leave
it unless --allow-outside-root. A row that cannot be used (no image, not
JSON, a path outside the folder) is a dead letter naming the file and line.
"""

import csv
import io
import json

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from beam_prep import keys
from beam_prep.dead_letters import READ_STAGE, error_record
from beam_prep.layouts import common
from beam_prep.layouts.registry import InputError, Layout, ReadOptions, register_layout

SUFFIXES = (".csv", ".jsonl", ".json")


def _rows(manifest: str, text: str):
  if manifest.lower().endswith(".csv"):
    return list(csv.DictReader(io.StringIO(text)))
  rows = []
  for n, line in enumerate(text.splitlines(), start=1):
    if line.strip():
      try:
        rows.append(json.loads(line))
      except json.JSONDecodeError as e:
        rows.append({"__error__": f"line {n} is not JSON: {e}"})
  return rows


def _pointer(row, base: str, allow: bool):
  """One row -> a pointer; raises ValueError(reason, detail) for a bad row."""
  if not isinstance(row, dict) or "__error__" in row or not row.get("image"):
    detail = row.get("__error__") if isinstance(row, dict) else "not an object"
    raise ValueError("bad_manifest_row", detail or "row has no 'image'")
  try:
    image = common.resolve(base, str(row["image"]), base, allow)
    mask = common.resolve(base, str(row["mask"]), base, allow) if row.get("mask") else None
  except ValueError as e:
    raise ValueError("path_outside_root", str(e)) from None
  pointer = {keys.IMAGE_ID: row.get("id") or common.stem(image), keys.SOURCE: image}
  if mask:
    pointer[keys.MASK_SOURCE] = mask
  if row.get("label"):
    pointer[keys.LABEL] = str(row["label"])
  if row.get("split"):
    pointer[keys.SPLIT] = common.LIST_SPLITS.get(row["split"], row["split"])
  return pointer


class _RowsFn(beam.DoFn):
  """Reads a manifest into input pointers; bad rows to the errors output."""

  def __init__(self, allow_outside_root: bool):
    self._allow = allow_outside_root

  def process(self, manifest: str):
    base = manifest.rsplit("/", 1)[0] if "/" in manifest else "."
    with FileSystems.open(manifest) as f:
      text = f.read().decode("utf-8-sig")
    for n, row in enumerate(_rows(manifest, text), start=1):
      try:
        yield _pointer(row, base, self._allow)
      except ValueError as e:
        reason, detail = e.args
        yield beam.pvalue.TaggedOutput(
          common.ERRORS_TAG,
          error_record(READ_STAGE, reason, detail, {keys.SOURCE: f"{manifest}:{n}"}),
        )


class _ListManifest(beam.PTransform):
  def __init__(self, path: str, allow: bool):
    super().__init__()
    self._path, self._allow = path, allow

  def expand(self, pbegin):
    rows = (
      pbegin
      | "Manifest" >> beam.Create([self._path])
      | "ParseManifest"
      >> beam.ParDo(_RowsFn(self._allow)).with_outputs(common.ERRORS_TAG, main="pointers")
    )
    return rows.pointers, rows[common.ERRORS_TAG]


@register_layout
class Manifest(Layout):
  name = "manifest"
  labels = ("instances", "classes")
  gives = (keys.MASK_BYTES, keys.LABEL)
  expects = (
    "--input FILE.csv|jsonl with columns image[,mask][,label][,split]; paths relative to the file"
  )
  priority = 30

  def detect(self, root: str, offline: bool = False) -> bool:
    return root.lower().endswith(SUFFIXES)

  def check_input(self, options: ReadOptions) -> None:
    if common.is_folder(options.root):
      raise InputError(
        f"{options.root} is a folder; the manifest layout reads one {'/'.join(SUFFIXES)} file"
      )

  def list_inputs(self, options: ReadOptions):
    return _ListManifest(options.root, options.allow_outside_root)

  def materialize(self, pointer):
    return common.read_image_and_mask(pointer)
