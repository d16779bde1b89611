"""Output directories, the run manifest and the end-of-run summary."""

import json
import os
from typing import Any, List

from apache_beam.io.filesystems import FileSystems

from beam_prep import keys


class OutputError(Exception):
  """The output directory cannot be used; the message says why."""


class OutputExistsError(OutputError):
  """The output directory holds files and --overwrite was not given."""


def _listing(pattern: str) -> List[str]:
  """Paths matching `pattern`; a listing that fails is an error, never "empty"."""
  try:
    return [m.path for m in FileSystems.match([pattern])[0].metadata_list]
  except Exception as e:  # pylint: disable=broad-except
    raise OutputError(
      f"cannot list the output {pattern.rsplit('/', 1)[0]}: "
      f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
      "(does the bucket exist, and may these credentials list it?)"
    ) from None


def prepare_output(path: str, overwrite: bool) -> None:
  """Refuses a non-empty output unless `overwrite`; with it, empties it first.

  Raises:
    OutputExistsError: the directory has files and `overwrite` is False.
    OutputError: a remote (gs://, ...) output that cannot be listed.
  """
  if keys.is_remote(path):
    existing = _listing(path.rstrip("/") + "/**")
  elif os.path.isdir(path):
    existing = os.listdir(path)
  else:
    existing = []
  if existing and not overwrite:
    raise OutputExistsError(
      f"output directory {path} is not empty ({len(existing)} entries); "
      "pass --overwrite to replace it"
    )
  if existing:
    if keys.is_remote(path):
      FileSystems.delete([path.rstrip("/") + "/"])
    else:
      import shutil  # pylint: disable=g-import-not-at-top

      shutil.rmtree(path)
  if not keys.is_remote(path):
    os.makedirs(path, exist_ok=True)


def remove_output(path: str) -> None:
  """Deletes an output directory this run wrote (after it failed for good)."""
  if keys.is_remote(path):
    if _listing(path.rstrip("/") + "/**"):
      FileSystems.delete([path.rstrip("/") + "/"])
  elif os.path.isdir(path):
    import shutil  # pylint: disable=g-import-not-at-top

    shutil.rmtree(path)


def write_text(path: str, text: str) -> None:
  with FileSystems.create(path) as f:
    f.write(text.encode("utf-8"))


def write_success(output: str) -> None:
  """`_SUCCESS`: written last, when the output is complete (the trainer refuses one without it)."""
  write_text(
    FileSystems.join(output, keys.SUCCESS_FILE), json.dumps({"manifest": keys.MANIFEST_FILE}) + "\n"
  )


def read_json(path: str) -> Any:
  with FileSystems.open(path) as f:
    return json.loads(f.read().decode("utf-8"))
