"""The commit: complete files moved into place, numbered in a stable order."""

import os
from typing import Any, Dict, Iterable, List, Optional, Tuple

from apache_beam.io.filesystems import FileSystems

from beam_prep import image_index, keys
from beam_prep.shards.files import (
  ERRORS_KIND,
  ERRORS_PREFIX,
  ERRORS_SUFFIX,
  INDEX_KIND,
  RECORDS_KIND,
  compression,
  record_suffix,
)


# Files other than records: (kind, folder, name prefix, suffix), numbered
# in (split, group, part) order across splits.
_OTHER_KINDS = (
  (ERRORS_KIND, keys.ERRORS_DIR, ERRORS_PREFIX, ERRORS_SUFFIX),
  (INDEX_KIND, image_index.INDEX_DIR, image_index.INDEX_PREFIX, image_index.INDEX_SUFFIX),
)


def final_names(
  files: List[Dict[str, Any]],
  output_dir: str,
  gzip: bool,
  splits: Iterable[str],
  shard_set: str = "",
) -> List[Tuple[Optional[str], str, Dict[str, Any]]]:
  """(temp path or None, final path, info) of every file, numbered in
  (split, group, part) order. A split with no records gets one empty shard,
  so every split a reader expects exists. A `shard_set`'s files carry its
  name after the split (`image_index`): SPLIT-SET-SSSSS-of-NNNNN."""
  suffix = record_suffix(gzip)
  infix = f"{shard_set}-" if shard_set else ""
  by_split: Dict[str, List[Dict[str, Any]]] = {s: [] for s in splits}
  for f in files:
    if f["kind"] == RECORDS_KIND:
      by_split.setdefault(f["split"], []).append(f)
  records_dir = FileSystems.join(output_dir, keys.RECORDS_DIR)
  out = []
  for split, items in sorted(by_split.items()):
    items = sorted(items, key=lambda f: (f["group"], f["part"]))
    n = max(len(items), 1)
    if not items:
      empty = {"kind": RECORDS_KIND, "split": split, "records": 0, "bytes": 0}
      out.append(
        (None, FileSystems.join(records_dir, f"{split}-{infix}00000-of-00001{suffix}"), empty)
      )
    for i, f in enumerate(items):
      out.append(
        (f["temp"], FileSystems.join(records_dir, f"{split}-{infix}{i:05d}-of-{n:05d}{suffix}"), f)
      )
  for kind, folder, prefix, ending in _OTHER_KINDS:
    items = sorted(
      (f for f in files if f["kind"] == kind), key=lambda f: (f["split"], f["group"], f["part"])
    )
    for i, f in enumerate(items):
      name = f"{prefix}-{infix}{i:05d}-of-{len(items):05d}{ending}"
      out.append((f["temp"], FileSystems.join(output_dir, folder, name), f))
  return out


def _move(temp: Optional[str], final: str, gzip: bool) -> None:
  if temp is None:
    if not FileSystems.exists(final):
      with FileSystems.create(final, compression_type=compression(gzip)):
        pass
  elif FileSystems.exists(temp):
    if FileSystems.exists(final):
      FileSystems.delete([final])
    FileSystems.rename([temp], [final])
  elif not FileSystems.exists(final):
    raise IOError(
      f"neither the temp file {temp} nor its final {final} exists: the output "
      "was changed while the job ran"
    )


def commit_files(
  files: List[Dict[str, Any]],
  output_dir: str,
  temp_root: str,
  gzip: bool,
  splits: Iterable[str],
  shard_set: str = "",
) -> Dict[str, Any]:
  """Moves every complete file into place; safe to run again after a failure.

  Returns a summary per split: files, records and bytes (and the errors' and
  the image index's files).
  """
  plan = final_names(files, output_dir, gzip, splits, shard_set)
  for folder in (keys.RECORDS_DIR, keys.ERRORS_DIR, image_index.INDEX_DIR):
    path = FileSystems.join(output_dir, folder)
    if not keys.is_remote(path):
      os.makedirs(path, exist_ok=True)
  for temp, final, _ in plan:
    _move(temp, final, gzip)
  if FileSystems.exists(temp_root):
    FileSystems.delete([temp_root])
  summary: Dict[str, Any] = {}
  for _, final, info in plan:
    name = info["split"] if info["kind"] == RECORDS_KIND else info["kind"]
    s = summary.setdefault(name, {"files": 0, "records": 0, "bytes": 0, "largest_bytes": 0})
    size = FileSystems.match([final])[0].metadata_list[0].size_in_bytes
    s["files"] += 1
    s["records"] += info["records"]
    s["bytes"] += size
    s["largest_bytes"] = max(s["largest_bytes"], size)
  return summary
