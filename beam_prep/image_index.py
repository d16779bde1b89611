"""The image index: which images a prep output holds, by digest.

Every job writes, beside its records, one line per image it holds (that
made records, or an eval image's source record alone):

    index/images-[SET-]SSSSS-of-NNNNN.jsonl
      {"image_id": ..., "source": ..., "split": "train", "records": 3,
       "digest": sha256 of the image file's bytes,
       "labels": sha256 of what the layout read with it (masks, class)}

`beam-prep ... --add` (`pipelines.prep`) reads it to skip the inputs an
output holds already (`status`): an image file with the same bytes and the
same labels, under any name or path. The same bytes with other labels are
another input (a photograph annotated once per object, as COCO-MVal's),
unless they come under an image id the output holds: that is a mask drawn
again or a file replaced, which is skipped and counted as relabelled (its
new labels need a full run).

A shard set is the files one job added (`SET`; the first job's files have
none). A set's name is `add` and a number; files of a set the manifest does
not list as complete are what a failed or stopped `--add` left
(`stray_files`).
"""

import dataclasses
import hashlib
import json
import re
from typing import Any, Dict, Iterable, Iterator, List, Optional, Set, Tuple

import numpy as np
from apache_beam.io.filesystems import FileSystems

from beam_prep import keys

INDEX_DIR = "index"
INDEX_PREFIX = "images"
INDEX_SUFFIX = ".jsonl"
DIGEST = "digest"
LABELS = "labels"
SET_PREFIX = "add"
# A set's part of a file name: SPLIT-SET-SSSSS-of-NNNNN (records), errors-SET-...
_SET_IN_NAME = re.compile(rf"^[a-z]+-({SET_PREFIX}\d{{4,}})-\d{{5}}-of-\d{{5}}")


def set_name(number: int) -> str:
  """The name of the `number`-th set an output gained (1: the first `--add`)."""
  return f"{SET_PREFIX}{number:04d}"


def image_digest(image_bytes: bytes) -> str:
  return hashlib.sha256(image_bytes).hexdigest()


def _feed(h, value: Any) -> None:
  """Feeds a value to a hash so that equal values, and only they, feed the same."""
  if value is None:
    h.update(b"N")
  elif isinstance(value, (bytes, bytearray)):
    h.update(b"B%d:" % len(value) + bytes(value))
  elif isinstance(value, np.ndarray):
    h.update(f"A{value.dtype.str}{value.shape}:".encode() + np.ascontiguousarray(value).tobytes())
  elif isinstance(value, dict):
    h.update(b"D%d:" % len(value))
    for k in sorted(value, key=str):
      _feed(h, str(k))
      _feed(h, value[k])
  elif isinstance(value, (list, tuple)):
    h.update(b"L%d:" % len(value))
    for v in value:
      _feed(h, v)
  else:
    h.update(b"S" + json.dumps(value, default=str).encode())


def labels_digest(example: Dict[str, Any], label_keys: Iterable[str]) -> str:
  """A digest of what a layout read beside the image (`Layout.gives`)."""
  h = hashlib.sha256()
  for k in sorted(label_keys):
    _feed(h, k)
    _feed(h, example.get(k))
  return h.hexdigest()


def entry(example: Dict[str, Any], split: str, records: int) -> Dict[str, Any]:
  """An index line of an image that made `records` records (`example`: as read,
  with its `DIGEST` and `LABELS`)."""
  return {
    keys.IMAGE_ID: example.get(keys.IMAGE_ID, ""),
    keys.SOURCE: example.get(keys.SOURCE, ""),
    keys.SPLIT: split,
    "records": records,
    DIGEST: example[DIGEST],
    LABELS: example[LABELS],
  }


def index_files(output: str, sets: Optional[Iterable[str]] = None) -> List[str]:
  """The index files of `sets` of an output ("" is the first job's; None: all)."""
  wanted, out = None if sets is None else set(sets), []
  pattern = FileSystems.join(output, INDEX_DIR, f"{INDEX_PREFIX}-*{INDEX_SUFFIX}")
  for m in FileSystems.match([pattern])[0].metadata_list:
    if wanted is None or file_set(m.path) in wanted:
      out.append(m.path)
  return sorted(out)


def lines(output: str, sets: Optional[Iterable[str]] = None) -> Iterator[Dict[str, Any]]:
  """The index lines of `sets` of an output (None: all)."""
  for path in index_files(output, sets):
    with FileSystems.open(path) as f:
      for line in f.read().decode("utf-8").splitlines():
        if line.strip():
          yield json.loads(line)


def file_set(path: str) -> str:
  """The set a file of an output belongs to ("": the first job's)."""
  found = _SET_IN_NAME.match(path.rstrip("/").split("/")[-1])
  return found.group(1) if found else ""


NEW, HELD, RELABELLED = "new", "held", "relabelled"


@dataclasses.dataclass
class Held:
  """The inputs an output holds: (image id, labels digest) by image digest,
  and the image ids; `one_label_per_image`: the task's (`Task.one_label_per_image`)."""

  by_digest: Dict[str, List[Tuple[str, str]]] = dataclasses.field(default_factory=dict)
  ids: Set[str] = dataclasses.field(default_factory=set)
  one_label_per_image: bool = False


def held(output: str, sets: Iterable[str], one_label_per_image: bool = False) -> Held:
  """What the `sets` of an output hold."""
  out = Held(one_label_per_image=one_label_per_image)
  for e in lines(output, sets):
    out.by_digest.setdefault(e[DIGEST], []).append((e[keys.IMAGE_ID], e[LABELS]))
    out.ids.add(e[keys.IMAGE_ID])
  return out


def status(index: Held, image_id: str, digest: str, labels: str) -> str:
  """`HELD` (the same bytes and labels are held, under this id or another),
  `RELABELLED` (this image id is held with other bytes or labels: a mask
  drawn again, a file replaced; or, where an image has one label, its bytes
  are held under another id with another label: a photo moved to another
  class) or `NEW`."""
  found = index.by_digest.get(digest, ())
  if (image_id, labels) in found:
    return HELD
  if image_id in index.ids:
    return RELABELLED
  if any(theirs == labels for _, theirs in found):
    return HELD
  return RELABELLED if found and index.one_label_per_image else NEW


def stray_files(output: str, sets: Iterable[str]) -> List[str]:
  """Files of an output that belong to a set other than `sets`: what a
  failed or stopped `--add` left."""
  wanted, out = set(sets), []
  for folder in (keys.RECORDS_DIR, keys.ERRORS_DIR, INDEX_DIR):
    pattern = FileSystems.join(output, folder, f"*-{SET_PREFIX}*")
    for m in FileSystems.match([pattern])[0].metadata_list:
      name = file_set(m.path)
      if name and name not in wanted:
        out.append(m.path)
  return sorted(out)
