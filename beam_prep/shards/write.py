"""The shard writer: per group of pointers, the kernel's records streamed into files.

`WriteShards` groups (split, pointer) pairs by the plan's groups and, per
group in a stable order, runs the kernel (`beam_prep.kernel`) on each input
and writes its records and dead letters into files of this attempt's own
temp folder (`commit_files` moves them into place once every group is done).
"""

import json
import logging
import threading
import time
import uuid
from typing import Any, Dict, Optional

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from beam_prep import image_index, keys, source_records
from beam_prep.kernel import Kernel, Tally
from beam_prep.shards.files import (
  ERRORS_KIND,
  ERRORS_PREFIX,
  ERRORS_SUFFIX,
  INDEX_KIND,
  RECORDS_KIND,
  RollingFile,
  record_suffix,
  tfrecord_frame,
)
from beam_prep.shards.plan import pointer_order, stable_hash

# Outputs of WriteShards.
FILES_TAG = "files"
TALLY_TAG = "tally"
ANALYSIS_TAG = "analysis"
PREVIEW_TAG = "preview"

# Images per group offered to the preview.
PREVIEW_PER_GROUP = 6


class MergeTallies(beam.CombineFn):
  """Sums `Tally`s (an empty one when there is nothing)."""

  def create_accumulator(self):
    return Tally()

  def add_input(self, acc, tally):
    return acc.merge(tally)

  def merge_accumulators(self, accs):
    out = Tally()
    for acc in accs:
      out.merge(acc)
    return out

  def extract_output(self, acc):
    return acc


def _duration(seconds: float) -> str:
  seconds = int(round(seconds))
  if seconds < 60:
    return f"{seconds} s"
  if seconds < 3600:
    return f"{seconds // 60} min {seconds % 60:02d} s"
  return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


class Progress:
  """One progress line per interval for all shard writers of a job in this
  process (the DirectRunner's threads share it): inputs done of the total,
  objects, rate, elapsed time and an estimate of the time left."""

  _lock = threading.Lock()
  _jobs: Dict[str, Dict[str, Any]] = {}

  @classmethod
  def add(
    cls, job: str, interval: float, plan: Dict[str, Any], inputs: int, objects: int
  ) -> Optional[str]:
    """Counts work done; returns the line when one is due (and logs it)."""
    if interval <= 0:
      return None
    now = time.monotonic()
    total = sum(plan["inputs"].values())
    with cls._lock:
      state = cls._jobs.get(job)
      if state is None:
        state = cls._jobs[job] = {"start": now, "last": now, "inputs": 0, "objects": 0}
        order = sorted(plan["groups"], key=lambda split: (split != keys.TRAIN_SPLIT, split))
        groups = " + ".join(f"{plan['groups'][split]} {split}" for split in order)
        size = plan["bytes_per_input"]
        size = f"{size / 1e6:.1f} MB" if size >= 1e5 else f"{size / 1e3:.0f} kB"
        logging.getLogger("beam_prep").info(
          "prep: %d inputs in %s groups (about %s of records per input)", total, groups, size
        )
      state["inputs"] += inputs
      state["objects"] += objects
      if now - state["last"] < interval:
        return None
      state["last"] = now
      done, elapsed = state["inputs"], now - state["start"]
      rate = done / elapsed if elapsed > 0 else 0.0
      line = (
        f"prep: {done} of {total} inputs ({state['objects']} objects), "
        f"{rate:.1f} inputs/s, {_duration(elapsed)} elapsed"
      )
      if rate > 0 and total > done:
        line += f", about {_duration((total - done) / rate)} left"
    logging.getLogger("beam_prep").info(line)
    return line


class _GroupFiles:
  """The record and dead-letter files of one group, in one attempt's folder."""

  def __init__(self, temp_root: str, split: str, group: int, plan, gzip: bool):
    # This attempt's own folder: a retried bundle never meets its files.
    attempt = FileSystems.join(temp_root, uuid.uuid4().hex)
    name = f"{split}-{group:05d}"
    self.split, self.group = split, group
    self.records = RollingFile(
      FileSystems.join(attempt, name), record_suffix(gzip), plan["roll_bytes"], gzip
    )
    self.errors = RollingFile(
      FileSystems.join(attempt, f"{ERRORS_PREFIX}-{name}"), ERRORS_SUFFIX, plan["roll_bytes"], False
    )
    # Eval images at their own size, beside the eval records of the group.
    self.sources = RollingFile(
      FileSystems.join(attempt, f"{source_records.SPLIT}-{name}"),
      record_suffix(gzip),
      plan["roll_bytes"],
      gzip,
    )
    self.index = RollingFile(
      FileSystems.join(attempt, f"{image_index.INDEX_PREFIX}-{name}"),
      image_index.INDEX_SUFFIX,
      plan["roll_bytes"],
      False,
    )

  def write(self, result) -> None:
    for s in result.records:
      self.records.write(tfrecord_frame(s))
    if result.source is not None:
      self.sources.write(tfrecord_frame(result.source))
    for e in result.errors:
      self.errors.write(json.dumps(e, sort_keys=True).encode("utf-8") + b"\n")
    if result.index is not None:
      self.index.write(json.dumps(result.index, sort_keys=True).encode("utf-8") + b"\n")

  def close(self):
    """Closes the files; yields one info dict per file written."""
    files = (
      (RECORDS_KIND, self.split, self.records),
      (ERRORS_KIND, self.split, self.errors),
      (RECORDS_KIND, source_records.SPLIT, self.sources),
      (INDEX_KIND, self.split, self.index),
    )
    for kind, split, f in files:
      f.close()
      for info in f.done:
        yield dict(info, kind=kind, split=split, group=self.group)


class _WriteGroupFn(beam.DoFn):
  """Writes one group: its inputs in a stable order, record files and error files."""

  def __init__(self, kernel: Kernel, temp_root: str, gzip: bool, progress_seconds: float):
    self._kernel = kernel
    self._temp_root = temp_root
    self._gzip = gzip
    self._progress_seconds = progress_seconds

  def setup(self):
    self._kernel.setup()
    self._written = Metrics.counter("beam_prep", "records_written")
    self._inputs = Metrics.counter("beam_prep", "inputs_done")
    self._failed = Metrics.counter("beam_prep", "errors")

  def process(self, kv, plan):
    (split, group), pointers = kv
    files = _GroupFiles(self._temp_root, split, group, plan, self._gzip)
    tally, previews = Tally(), 0
    for pointer in sorted(pointers, key=pointer_order):
      result = self._kernel.process(pointer, split)
      tally.merge(result.tally)
      if result.records:
        if split == keys.TRAIN_SPLIT:
          # tf.Transform sees every image once, as a small row, so the
          # statistics weigh images equally and cost a fraction of the job.
          yield beam.pvalue.TaggedOutput(ANALYSIS_TAG, result.row)
        if previews < PREVIEW_PER_GROUP:
          previews += 1
          yield beam.pvalue.TaggedOutput(
            PREVIEW_TAG, ((split != keys.TRAIN_SPLIT,) + pointer_order(pointer), result.records[0])
          )
      files.write(result)
      self._count(result, plan)
    for info in files.close():
      yield beam.pvalue.TaggedOutput(FILES_TAG, info)
    yield beam.pvalue.TaggedOutput(TALLY_TAG, tally)

  def _count(self, result, plan) -> None:
    """Beam counters and the progress line."""
    Progress.add(
      self._temp_root,
      self._progress_seconds,
      plan,
      result.tally.counts.get("inputs_read", 0),
      result.tally.counts.get("objects_found", 0),
    )
    self._inputs.inc()
    self._written.inc(len(result.records))
    self._failed.inc(len(result.errors))
    for e in result.errors:
      Metrics.counter("beam_prep", f"error_{e['reason']}").inc()


class WriteShards(beam.PTransform):
  """(split, pointer) pairs -> record and error files in a temp folder.

  With `progress_seconds` > 0, logs a progress line at that interval (to the
  `beam_prep` logger of the worker process: the console on the DirectRunner).

  Returns a tuple of PCollections tagged `files` (one dict per file written,
  for `commit_files`), `tally` (one `Tally` per group), `analysis` (one row
  per train image for tf.Transform: see `Kernel`) and `preview` (a few
  (order key, serialized record) pairs per group).
  """

  def __init__(self, kernel: Kernel, temp_root: str, gzip: bool, progress_seconds: float = 0.0):
    super().__init__()
    self._fn = _WriteGroupFn(kernel, temp_root, gzip, progress_seconds)

  def expand(self, keyed_and_plan):
    keyed, plan = keyed_and_plan

    def to_group(kv, plan):
      split, pointer = kv
      return (split, stable_hash(pointer[keys.IMAGE_ID]) % plan["groups"].get(split, 1)), pointer

    return (
      keyed
      | "ToGroup" >> beam.Map(to_group, beam.pvalue.AsSingleton(plan))
      | "GroupPointers" >> beam.GroupByKey()
      | "WriteGroups"
      >> beam.ParDo(self._fn, beam.pvalue.AsSingleton(plan)).with_outputs(
        FILES_TAG, TALLY_TAG, ANALYSIS_TAG, PREVIEW_TAG
      )
    )
