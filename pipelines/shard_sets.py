"""`beam-prep ... --add`: an output's shard sets, and the manifest of them all.

A job with `--add` writes its records, dead letters and image index as a
new shard set of an existing output (`beam_prep.image_index`: files named
SPLIT-SET-SSSSS-of-NNNNN), skips the images the output holds already, reads
nothing new with tf.Transform (the output's transform stays, as a model
trained on it expects), and rewrites manifest.json to account for every
set:

  sets        one entry per set: its name ("" for the first job's), config,
              counts, shards, verdict and timing
  counts      the sets' counts summed (`images_known`: skipped as held)
  shards      the sets' files, records and bytes summed per split
  complete    every set is complete (`_SUCCESS` is written only then)

While the job runs the output has no `_SUCCESS`, so nothing trains on a
half-added set. A set that failed stays listed (incomplete) until the next
`--add`, which removes it and its files first, as it does any file of a set
the manifest does not list (a stopped job's).
"""

import contextlib
import dataclasses
import fcntl
import json
import os
from typing import Any, Dict, Iterator, List, Optional, Tuple

from apache_beam.io.filesystems import FileSystems

from beam_prep import image_index, keys
from beam_prep.config import PrepConfig
from beam_prep.features import FeatureTable
from beam_prep.prep_output import SET_KEYS, sets_of
from pipelines import logs, outputs


class AddError(Exception):
  """--add names no output these records can be added to; the message says why."""


@dataclasses.dataclass(frozen=True)
class AddTarget:
  """The output a job adds to: its manifest before the job, the sets kept,
  and the name of the set the job writes."""

  output: str
  previous: Dict[str, Any]
  kept: Tuple[str, ...]
  name: str


@contextlib.contextmanager
def one_job_adding(output: str) -> Iterator[None]:
  """One --add job at a time on `output`: a local folder is locked (an
  exclusive flock on the folder itself, released when the job ends or its
  process dies) for the block; an output elsewhere (gs://) is not, and one
  job at a time there is the user's to keep.

  Raises:
    AddError: another job holds the folder (nothing was changed).
  """
  if FileSystems.get_scheme(output) is not None or not os.path.isdir(output):
    yield
    return
  fd = os.open(output, os.O_RDONLY)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      raise AddError(
        f"--add: another job is adding to {output}; add to an output one job at a time "
        "(nothing was changed)"
      ) from None
    yield
  finally:
    os.close(fd)


def check_target(config: PrepConfig, table: FeatureTable, differs) -> AddTarget:
  """The output `config.output` as a job adds to it, checked (nothing is changed).

  Args:
    differs: (their table, our table) -> the features whose raw schema differ.

  Raises:
    AddError: not a beam-prep output, its first job failed, or other records.
  """
  out = config.output
  path = FileSystems.join(out, keys.MANIFEST_FILE)
  if not FileSystems.exists(path):
    raise AddError(f"--add: {out} is not a beam-prep output (no {keys.MANIFEST_FILE})")
  previous = outputs.read_json(path)
  _check_records(config, previous, FeatureTable.load(out), table, differs)
  sets = sets_of(previous)
  names = [s["name"] for s in sets if s["name"]]
  number = 1 + max([int(n[len(image_index.SET_PREFIX) :]) for n in names] or [0])
  kept = [s for s in sets if s["complete"]]
  return AddTarget(
    out, _of_sets(previous, kept), tuple(s["name"] for s in kept), image_index.set_name(number)
  )


def ready(target: AddTarget, task: str) -> None:
  """Readies the output for the job: `_SUCCESS` removed (nothing trains on a
  half-added set), the files of failed or stopped sets deleted."""
  success = FileSystems.join(target.output, keys.SUCCESS_FILE)
  if FileSystems.exists(success):
    FileSystems.delete([success])
  stray = _strays(target)
  if stray:
    FileSystems.delete(stray)
    logs.get().info(
      "%s: removed %d file(s) of failed or stopped --add jobs from %s",
      task,
      len(stray),
      target.output,
    )


def _strays(target: AddTarget) -> List[str]:
  """The files of the sets `target` does not keep, and the temp folders a
  stopped job left (`keys.TEMP_PREFIX`), as `FileSystems.delete` removes a
  folder (a gs:// one ends in "/")."""
  output, roots = target.output, set()
  pattern = FileSystems.join(output, f"{keys.TEMP_PREFIX}*", "**")
  for m in FileSystems.match([pattern])[0].metadata_list:
    parts = m.path.split("/")
    top = next(i for i, part in enumerate(parts) if part.startswith(keys.TEMP_PREFIX))
    roots.add("/".join(parts[: top + 1]) + ("/" if keys.is_remote(output) else ""))
  return image_index.stray_files(output, target.kept) + sorted(roots)


def restore(target: AddTarget) -> None:
  """The output as it was before a job that stopped (its kept sets, complete)."""
  stray = _strays(target)
  if stray:
    FileSystems.delete(stray)
  outputs.write_text(
    FileSystems.join(target.output, keys.MANIFEST_FILE),
    json.dumps(target.previous, indent=2, sort_keys=True),
  )
  outputs.write_success(target.output)


def _check_records(config, previous, theirs: FeatureTable, ours: FeatureTable, differs) -> None:
  out = config.output
  first = sets_of(previous)[0]
  if not first["complete"]:
    raise AddError(
      f"--add: {out} is not complete (its job failed: {'; '.join(first['problems'] or [])}); "
      "run the job again without --add"
    )
  if "index" not in (first["shards"] or {}):
    raise AddError(
      f"--add: {out} has no image index ({image_index.INDEX_DIR}/: made by an older "
      "beam-prep), so the images it holds are unknown; run the job again without --add"
    )
  found = differs(theirs, ours)
  if found:
    raise AddError(
      f"--add: {out} holds records of another raw schema ({', '.join(found)}); give the "
      f"settings it was made with: --config {FileSystems.join(out, keys.CONFIG_FILE)}"
    )
  theirs_config = first["config"] or {}
  for name in ("compression", "task"):
    if theirs_config.get(name, "") != getattr(config, name):
      raise AddError(
        f"--add: {out} was made with {name} {theirs_config.get(name)!r}, this run has "
        f"{getattr(config, name)!r}"
      )
  if bool(previous.get("eval_only")) != config.eval_only:
    asked = "--eval-percent 100" if previous.get("eval_only") else "--eval-percent under 100"
    raise AddError(f"--add: {out} is {_kind(previous)}; add to it with {asked}")


def _kind(manifest: Dict[str, Any]) -> str:
  return (
    "an evaluation-only output" if manifest.get("eval_only") else "an output with train records"
  )


def combined(target: AddTarget, job: Dict[str, Any]) -> Dict[str, Any]:
  """The manifest of every set: the output's before the job, with the job's
  own manifest (`pipelines.report.manifest`) as set `target.name`."""
  sets = sets_of(target.previous) + [{"name": target.name, **{k: job[k] for k in SET_KEYS}}]
  paths = dict(job["paths"])  # Where the output is now (it may have been moved or copied).
  if target.previous.get("paths", {}).get("preview"):
    paths["preview"] = FileSystems.join(target.output, keys.PREVIEW_FILE)  # Kept as it was.
  return dict(
    _of_sets(target.previous, sets), timing=job["timing"], versions=job["versions"], paths=paths
  )


def _of_sets(manifest: Dict[str, Any], sets: List[Dict[str, Any]]) -> Dict[str, Any]:
  """`manifest` with `sets` as its sets, and the totals of theirs."""
  problems = [f"set {s['name'] or 'first'}: {p}" for s in sets for p in s["problems"] or []]
  return {
    **manifest,
    "sets": sets,
    "counts": _summed([s["counts"] for s in sets]),
    "shards": _summed([s["shards"] for s in sets]),
    "complete": not problems,
    "problems": problems,
    "error_examples": {k: v for s in sets for k, v in (s["error_examples"] or {}).items()},
  }


def _summed(trees: List[Optional[Dict[str, Any]]]) -> Dict[str, Any]:
  """Dicts of counts summed key by key (nested dicts too); a `largest_` count
  is the largest, a flag holds when it holds in each."""
  out: Dict[str, Any] = {}
  for tree in trees:
    for k, v in (tree or {}).items():
      if isinstance(v, dict):
        out[k] = _summed([out.get(k), v])
      elif isinstance(v, bool):
        out[k] = out.get(k, True) and v
      elif k.startswith("largest_"):
        out[k] = max(out.get(k, 0), v)
      elif isinstance(v, (int, float)):
        out[k] = out.get(k, 0) + v
  return out


def set_lines(m: Dict[str, Any]) -> List[str]:
  """The lines that say what an output's sets hold, after a job with --add."""
  if not m.get("sets"):
    return []
  c = m["counts"]
  written = ", ".join(f"{s} {n}" for s, n in sorted(c["examples_written"].items()))
  return [
    f"  output holds     {c['images_used']} images in {len(m['sets'])} shard sets "
    f"({', '.join(s['name'] or 'first' for s in m['sets'])}); examples {written}"
  ]
