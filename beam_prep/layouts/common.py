"""What several layouts share: paths, globbing on the workers, reading files."""

import glob
import os
import posixpath
from typing import Any, Callable, Dict, Tuple

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.filesystems import FileSystems

from beam_prep import keys
from beam_prep.ops.registry import ExampleError

ERRORS_TAG = "errors"
# The split lists of the field's data sets (train.txt, val.txt; a manifest's
# "split" column) -> the splits of the records.
LIST_SPLITS = {"train": keys.TRAIN_SPLIT, "val": keys.EVAL_SPLIT}


def stem(path: str) -> str:
  return posixpath.splitext(path.rstrip("/").split("/")[-1])[0]


def parent(path: str) -> str:
  return path.rstrip("/").split("/")[-2]


def hidden(path: str) -> bool:
  return any(part.startswith(".") for part in path.rstrip("/").split("/")[-2:])


def exists(path: str) -> bool:
  return FileSystems.exists(path)


def is_folder(path: str) -> bool:
  """Whether a local path is a folder (gs:// paths are judged by the workers)."""
  return not keys.is_remote(path) and os.path.isdir(path)


def any_match(pattern: str) -> bool:
  """Whether anything matches `pattern` (reads one listing entry at most)."""
  return bool(FileSystems.match([pattern], limits=[1])[0].metadata_list)


def resolve(base: str, path: str, root: str, allow_outside_root: bool) -> str:
  """Joins a listed path to its base folder; refuses escapes from `root`.

  Raises:
    ValueError: the path leaves `root` and `allow_outside_root` is False.
  """
  if keys.is_remote(path) or path.startswith("/"):
    full = path
  else:
    full = posixpath.normpath(posixpath.join(base, path))
    if keys.is_remote(base):  # normpath collapses "gs://" to "gs:/"
      scheme, rest = base.split("://", 1)
      full = f"{scheme}://" + posixpath.normpath(posixpath.join(rest, path))
  root_dir = root.rstrip("/") + "/"
  if not allow_outside_root and not full.startswith(root_dir):
    raise ValueError(
      f"path {path!r} resolves to {full}, outside the data root {root_dir} "
      "(pass --allow-outside-root to permit)"
    )
  return full


def read_bytes(path: str, what: str = "image") -> bytes:
  """A file's bytes; a missing or unreadable file is an ExampleError naming it."""
  try:
    with FileSystems.open(path) as f:
      return f.read()
  except Exception as e:  # pylint: disable=broad-except
    reason = f"missing_{what}" if not FileSystems.exists(path) else "unreadable_file"
    raise ExampleError(reason, f"{path}: {type(e).__name__}: {e}") from None


def ambiguous(what: str, owner: str, files) -> ExampleError:
  """The error (`ambiguous_<what>`: mask, image) of an input `owner` with
  several `what` files of one name."""
  return ExampleError(
    f"ambiguous_{what}", f"{owner}: {len(files)} {what}s share its name: {', '.join(files)}"
  )


def in_another_format(path: str, what: str, owner: str) -> str:
  """The one file beside the missing `path` with its name and another
  extension (NAME.jpg for NAME.png, say: sets and tools save images and
  masks in several formats), or "" when there is none (reading `path`
  then says `missing_<what>`).

  Raises:
    ExampleError: `ambiguous_<what>`, several such files.
  """
  name = stem(path)
  folder = path.rstrip("/")[: -len(posixpath.basename(path.rstrip("/")))]
  found = [m.path for m in FileSystems.match([folder + glob.escape(name) + ".*"])[0].metadata_list]
  found = sorted(f for f in found if stem(f) == name)
  if len(found) > 1:
    raise ambiguous(what, owner, found)
  return found[0] if found else ""


def read_image_and_mask(pointer: Dict[str, Any]) -> Dict[str, Any]:
  """The pointer with `image_bytes`, and `mask_bytes` (None when the mask file
  is missing: the decode stage judges that) when it names a mask."""
  ex = dict(pointer)
  ex[keys.IMAGE_BYTES] = read_bytes(ex[keys.SOURCE])
  mask = ex.get(keys.MASK_SOURCE)
  if mask is not None:
    ex[keys.MASK_BYTES] = read_bytes(mask, "mask") if FileSystems.exists(mask) else None
  return ex


class ReadPointers(beam.PTransform):
  """One input (a data root, an annotation file) read on a worker by
  `read(source, *args)`, which yields pointers and, tagged `ERRORS_TAG`, dead
  letters -> `(pointers, errors)`, as every layout's `list_inputs` returns them."""

  def __init__(self, source: str, read: Callable[..., Any], *args: Any):
    super().__init__()
    self._source, self._read, self._args = source, read, args

  def expand(self, pbegin) -> Tuple[beam.PCollection, beam.PCollection]:
    listed = (
      pbegin
      | "Input" >> beam.Create([self._source])
      | "Read" >> beam.FlatMap(self._read, *self._args).with_outputs(ERRORS_TAG, main="pointers")
    )
    return listed.pointers, listed[ERRORS_TAG]


class GlobPointers(beam.PTransform):
  """Files matching a pattern (hidden ones skipped) -> `(pointers, no errors)`,
  one pointer per file made by `to_pointer(path)`."""

  def __init__(self, pattern: str, to_pointer: Callable[[str], Dict[str, Any]]):
    super().__init__()
    self._pattern = pattern
    self._to_pointer = to_pointer

  def expand(self, pbegin) -> Tuple[beam.PCollection, beam.PCollection]:
    pointers = (
      pbegin
      | "Pattern" >> beam.Create([self._pattern])
      | "Match" >> fileio.MatchAll()
      | "Paths" >> beam.Map(lambda m: m.path)
      | "SkipHidden" >> beam.Filter(lambda p: not hidden(p))
      | "Pointers" >> beam.Map(self._to_pointer)
    )
    return pointers, pbegin | "NoListErrors" >> beam.Create([])
