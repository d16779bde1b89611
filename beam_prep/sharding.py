"""The job's heavy stage: pointers grouped by shard, records streamed to files.

No pixel crosses a shuffle and no worker holds more than one image's records:

    pointers (image id, paths: a few hundred bytes each)
      -> split: the layout's, else a stable hash of the image id
      -> PlanShards: groups per split = images x bytes per image / target,
         bytes per image measured in the job on a fixed sample of inputs
      -> group = stable hash of the image id % groups of its split
      -> GroupByKey(split, group): pointers only
      -> WriteShards: per group, in a stable order, read the files, run the
         op stages, encode, and stream each record into a file of this
         attempt's own temp folder; a file past twice the target is closed
         and the next one started
      -> commit_files (once, after every group): moves complete files into
         place as SPLIT-SSSSS-of-NNNNN, in (split, group, part) order

The bytes of every file depend only on the inputs and the config: not on the
runner, the worker count, bundle order or retries. Failed bundle attempts
leave files only in their own temp folder, which the commit deletes.
"""

import hashlib
import json
import logging
import struct
import threading
import time
import uuid
import zlib
from typing import Any, Dict, Iterable, List, Optional, Tuple

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from beam_prep import coco, keys, readers
from beam_prep.ops import registry

# Outputs of WriteShards.
FILES_TAG = "files"
COUNTS_TAG = "counts"
ANALYSIS_TAG = "analysis"
PREVIEW_TAG = "preview"

RECORDS_KIND = "records"
ERRORS_KIND = "errors"
ERRORS_PREFIX = "errors"
ERRORS_SUFFIX = ".jsonl"

# Inputs whose records are computed once more to measure bytes per input.
PROBE_INPUTS = 16
# Images per group offered to the preview.
PREVIEW_PER_GROUP = 6


def stable_hash(text: str) -> int:
  """A hash that is the same in every process, runner and Python version."""
  return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


def split_of(image_id: str, eval_percent: int) -> str:
  """Train or eval, by a stable hash of the image id (all objects and
  variants of one image land in the same split)."""
  return keys.EVAL_SPLIT if stable_hash(image_id) % 100 < eval_percent else keys.TRAIN_SPLIT


def pointer_split(pointer: Dict[str, Any], eval_percent: int) -> str:
  """The layout's split when it fixes one (VOC lists, a manifest column), else by hash."""
  return pointer.get("split") or split_of(pointer["image_id"], eval_percent)


def pointer_order(pointer: Dict[str, Any]) -> Tuple[int, str]:
  """A total order of pointers that every run agrees on (hash first, so a
  sample taken by it is spread over the data)."""
  text = json.dumps(pointer, sort_keys=True, default=str)
  return stable_hash(pointer.get("image_id", "")), text


def _record_suffix(gzip: bool) -> str:
  return keys.RECORD_SUFFIX + (keys.GZIP_SUFFIX if gzip else "")


def _compression(gzip: bool) -> str:
  return CompressionTypes.GZIP if gzip else CompressionTypes.UNCOMPRESSED


def _masked_crc32c(data: bytes) -> int:
  import google_crc32c  # pylint: disable=g-import-not-at-top
  crc = google_crc32c.value(data)
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord_frame(payload: bytes) -> bytes:
  """One TFRecord: length, masked CRC-32C of the length, payload, its masked CRC."""
  length = struct.pack("<Q", len(payload))
  return (length + struct.pack("<I", _masked_crc32c(length)) + payload
          + struct.pack("<I", _masked_crc32c(payload)))


def error_pointer(error: Dict[str, Any]) -> Dict[str, Any]:
  """An input that failed before it had files to read, as a pointer that
  travels to a shard writer like any other (its error is written there)."""
  return {"image_id": error.get("image_id") or error.get("source", ""),
          "source": error.get("source", ""), "read_error": error}


class ImageProcessor:
  """Turns one input pointer into its serialized records and its errors.

  Reads the pointer's files, runs the job's op stages in order (the first
  stage makes units: objects, or images for classification) and encodes each
  finished example with the run's FeatureTable.

  Args:
    stages: (label, op chain) of each stage, as `PrepConfig.stages`.
    ops_module: module(s) the workers import first (user ops).
    table: the run's FeatureTable.
    image_level: stage name -> whether an error there loses the whole image.
    unit_ops: names of the ops of the first stage.
    summary_rows: the image's row for tf.Transform is its summary
      (`FeatureTable.summary_row`, for the default preprocessing_fn), else
      its first record.
  """

  def __init__(self, stages, ops_module: str, table, image_level: Dict[str, bool],
               unit_ops: Iterable[str], summary_rows: bool = True):
    self.summary_rows = summary_rows
    self._stages = [chain for _, chain in stages if chain]
    self._ops_module = ops_module
    self.table = table
    self._image_level = {coco.ANNOTATION_STAGE: False, **image_level}
    self._unit_ops = frozenset(unit_ops)
    self._fns = None

  def setup(self) -> None:
    if self._fns is None:
      registry.import_ops_modules(self._ops_module)
      self._fns = [registry.build_chain(chain) for chain in self._stages]

  def error_counts(self, error: Dict[str, Any]) -> Dict[str, int]:
    level = "image" if self._image_level.get(error["stage"], True) else "object"
    out = {f"errors_{level}": 1, f"reason/{error['reason']}": 1}
    if error["stage"] not in self._unit_ops:  # Lost after being counted as a unit.
      out["errors_after_units"] = 1
    return out

  def process(self, pointer: Dict[str, Any]) -> Tuple[List[bytes], List[Dict[str, Any]],
                                                      Dict[str, int], Optional[bytes]]:
    """-> (serialized records, error records, counts, the image's analysis row)."""
    self.setup()
    counts: Dict[str, int] = {}
    errors: List[Dict[str, Any]] = []

    def add(c):
      for k, v in c.items():
        counts[k] = counts.get(k, 0) + v

    def fail(error):
      errors.append(error)
      add(self.error_counts(error))

    for error in pointer.get("annotation_errors", ()):  # coco: annotations of no image.
      add({"objects": 1})
      fail(error)
    if pointer.get("no_image"):
      return [], errors, counts, None
    if "read_error" in pointer:
      add({"inputs_unreadable": 1})
      fail(pointer["read_error"])
      return [], errors, counts, None
    ex, error = readers.read_files(pointer)
    if error is not None:
      add({"inputs_unreadable": 1})
      fail(error)
      return [], errors, counts, None
    add({"images_decoded_input": 1})
    for error in ex.pop("annotation_errors", ()):  # coco: failed annotations of this image.
      add({"objects": 1})
      fail(error)
    current = [ex]
    for i, fn in enumerate(self._fns):
      after = []
      for item in current:
        outputs, failures = fn(item)
        for f in failures:
          fail(readers.error_record(f.stage, f.reason, f.detail, f.example))
        after.extend(outputs)
      current = after
      if i == 0:
        add({"objects": len(current)})
    records = [self.table.encode(out) for out in current]
    row = None
    if records:
      row = self.table.summary_row(current[0]) if self.summary_rows else records[0]
    return records, errors, counts, row


def merge_counts(dicts: Iterable[Dict[str, int]]) -> Dict[str, int]:
  out: Dict[str, int] = {}
  for d in dicts:
    for k, v in d.items():
      out[k] = out.get(k, 0) + v
  return dict(sorted(out.items()))


class MergeCounts(beam.CombineFn):
  """Sums count dicts (an empty dict when there is nothing)."""

  def create_accumulator(self):
    return {}

  def add_input(self, acc, counts):
    return merge_counts([acc, counts])

  def merge_accumulators(self, accs):
    return merge_counts(accs)

  def extract_output(self, acc):
    return acc


def _probe(sample: List[Dict[str, Any]], processor: ImageProcessor) -> Dict[str, float]:
  """Bytes per input and the gzip ratio, from a fixed sample's real records."""
  raw = packed = 0
  for pointer in sample:
    records, _, _, _ = processor.process(pointer)
    data = b"".join(tfrecord_frame(r) for r in records)
    raw += len(data)
    packed += len(zlib.compress(data, 6)) if data else 0
  return {"bytes_per_input": raw / max(len(sample), 1),
          "gzip_ratio": packed / raw if raw else 1.0,
          "probed_inputs": len(sample)}


def plan_groups(sizes: Dict[str, int], probe: Dict[str, float], target_bytes: float,
                gzip: bool) -> Dict[str, Any]:
  """Groups per split from the input counts and the measured bytes per input."""
  ratio = probe["gzip_ratio"] if gzip else 1.0
  per_input = probe["bytes_per_input"] * ratio
  groups = {split: max(1, int(round(n * per_input / target_bytes)))
            for split, n in sorted(sizes.items())}
  return {"groups": groups, "inputs": dict(sorted(sizes.items())),
          "bytes_per_input": round(per_input, 1), "target_bytes": target_bytes,
          # A file is closed past twice the target (in uncompressed bytes).
          "roll_bytes": 2 * target_bytes / ratio if ratio > 0 else 2 * target_bytes,
          "probed_inputs": probe["probed_inputs"]}


class PlanShards(beam.PTransform):
  """(split, pointer) pairs -> a singleton plan: groups per split and file size limits.

  The count per split comes from the data; the bytes per input from the
  real records of the `PROBE_INPUTS` first pointers in hash order (the same
  sample on every run, so the plan, and with it every file, repeats).
  """

  def __init__(self, processor: ImageProcessor, target_bytes: float, gzip: bool):
    super().__init__()
    self._processor = processor
    self._target = target_bytes
    self._gzip = gzip

  def expand(self, keyed):
    processor, target, gzip = self._processor, self._target, self._gzip
    sizes = (keyed
             | "Splits" >> beam.Keys()
             | "CountSplits" >> beam.combiners.Count.PerElement()
             | "SizesDict" >> beam.combiners.ToDict())
    probe = (keyed
             | "Pointers" >> beam.Values()
             | "Sample" >> beam.combiners.Top.Smallest(PROBE_INPUTS, key=pointer_order)
             | "MeasureBytes" >> beam.Map(_probe, processor))
    return probe | "Plan" >> beam.Map(
        lambda p, sizes: plan_groups(sizes, p, target, gzip), beam.pvalue.AsSingleton(sizes))


class _RollingFile:
  """Frames written to `PREFIX-PPPPP` files of at most `limit` bytes each
  (uncompressed; a single larger frame gets a file of its own)."""

  def __init__(self, prefix: str, suffix: str, limit: float, gzip: bool):
    self._prefix, self._suffix, self._limit, self._gzip = prefix, suffix, limit, gzip
    self._file = None
    self._size = self._records = 0
    self.done: List[Dict[str, Any]] = []

  def write(self, frame: bytes) -> None:
    if self._file is not None and self._size + len(frame) > self._limit:
      self.close()
    if self._file is None:
      path = f"{self._prefix}-{len(self.done):05d}{self._suffix}"
      self._file = FileSystems.create(path, compression_type=_compression(self._gzip))
      self._path, self._size, self._records = path, 0, 0
    self._file.write(frame)
    self._size += len(frame)
    self._records += 1

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
      self.done.append({"part": len(self.done), "temp": self._path, "records": self._records,
                        "bytes": self._size})
      self._file = None


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
  def add(cls, job: str, interval: float, plan: Dict[str, Any], inputs: int,
          objects: int) -> Optional[str]:
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
            "prep: %d inputs in %s groups (about %s of records per input)", total, groups, size)
      state["inputs"] += inputs
      state["objects"] += objects
      if now - state["last"] < interval:
        return None
      state["last"] = now
      done, elapsed = state["inputs"], now - state["start"]
      rate = done / elapsed if elapsed > 0 else 0.0
      line = (f"prep: {done} of {total} inputs ({state['objects']} objects), "
              f"{rate:.1f} inputs/s, {_duration(elapsed)} elapsed")
      if rate > 0 and total > done:
        line += f", about {_duration((total - done) / rate)} left"
    logging.getLogger("beam_prep").info(line)
    return line


class _WriteGroupFn(beam.DoFn):
  """Writes one group: its inputs in a stable order, record files and error files."""

  def __init__(self, processor: ImageProcessor, temp_root: str, gzip: bool,
               progress_seconds: float):
    self._processor = processor
    self._temp_root = temp_root
    self._gzip = gzip
    self._progress_seconds = progress_seconds

  def setup(self):
    self._processor.setup()
    self._written = Metrics.counter("beam_prep", "records_written")
    self._inputs = Metrics.counter("beam_prep", "inputs_done")
    self._failed = Metrics.counter("beam_prep", "errors")

  def process(self, kv, plan):
    (split, group), pointers = kv
    pointers = sorted(pointers, key=pointer_order)
    # This attempt's own folder: a retried bundle never meets its files.
    attempt = FileSystems.join(self._temp_root, uuid.uuid4().hex)
    name = f"{split}-{group:05d}"
    records = _RollingFile(FileSystems.join(attempt, name), _record_suffix(self._gzip),
                           plan["roll_bytes"],
                           self._gzip)
    errors = _RollingFile(FileSystems.join(attempt, f"{ERRORS_PREFIX}-{name}"), ERRORS_SUFFIX,
                          plan["roll_bytes"], False)
    counts: Dict[str, int] = {}
    previews = 0
    for pointer in pointers:
      serialized, errs, c, row = self._processor.process(pointer)
      counts = merge_counts([counts, c])
      if serialized:
        counts[f"examples/{split}"] = counts.get(f"examples/{split}", 0) + len(serialized)
        if split == keys.TRAIN_SPLIT:
          # tf.Transform sees every image once, as a small row, so the
          # statistics weigh images equally and cost a fraction of the job.
          yield beam.pvalue.TaggedOutput(ANALYSIS_TAG, row)
        if previews < PREVIEW_PER_GROUP:
          previews += 1
          yield beam.pvalue.TaggedOutput(
              PREVIEW_TAG, ((split != keys.TRAIN_SPLIT,) + pointer_order(pointer),
                            serialized[0]))
      for s in serialized:
        records.write(tfrecord_frame(s))
      for e in errs:
        errors.write(json.dumps(e, sort_keys=True).encode("utf-8") + b"\n")
      Progress.add(self._temp_root, self._progress_seconds, plan, 1, c.get("objects", 0))
      self._inputs.inc()
      self._written.inc(len(serialized))
      self._failed.inc(len(errs))
      for e in errs:
        Metrics.counter("beam_prep", f"error_{e['reason']}").inc()
    records.close()
    errors.close()
    for kind, f in ((RECORDS_KIND, records), (ERRORS_KIND, errors)):
      for info in f.done:
        yield beam.pvalue.TaggedOutput(FILES_TAG, dict(info, kind=kind, split=split, group=group))
    yield beam.pvalue.TaggedOutput(COUNTS_TAG, counts)


class WriteShards(beam.PTransform):
  """(split, pointer) pairs -> record and error files in a temp folder.

  With `progress_seconds` > 0, logs a progress line at that interval (to the
  `beam_prep` logger of the worker process: the console on the DirectRunner).

  Returns a tuple of PCollections tagged `files` (one dict per file written,
  for `commit_files`), `counts` (one dict per group), `analysis` (one row
  per train image for tf.Transform: see `ImageProcessor`) and `preview` (a few
  (order key, serialized record) pairs per group).
  """

  def __init__(self, processor: ImageProcessor, temp_root: str, gzip: bool,
               progress_seconds: float = 0.0):
    super().__init__()
    self._fn = _WriteGroupFn(processor, temp_root, gzip, progress_seconds)

  def expand(self, keyed_and_plan):
    keyed, plan = keyed_and_plan

    def to_group(kv, plan):
      split, pointer = kv
      return (split, stable_hash(pointer["image_id"]) % plan["groups"].get(split, 1)), pointer

    return (keyed
            | "ToGroup" >> beam.Map(to_group, beam.pvalue.AsSingleton(plan))
            | "GroupPointers" >> beam.GroupByKey()
            | "WriteGroups" >> beam.ParDo(self._fn, beam.pvalue.AsSingleton(plan)).with_outputs(
                FILES_TAG, COUNTS_TAG, ANALYSIS_TAG, PREVIEW_TAG))


def final_names(files: List[Dict[str, Any]], output_dir: str, gzip: bool,
                splits: Iterable[str]) -> List[Tuple[Optional[str], str, Dict[str, Any]]]:
  """(temp path or None, final path, info) of every file, numbered in
  (split, group, part) order. A split with no records gets one empty shard,
  so every split a reader expects exists."""
  suffix = _record_suffix(gzip)
  out = []
  by_split: Dict[str, List[Dict[str, Any]]] = {s: [] for s in splits}
  errors = []
  for f in files:
    if f["kind"] == RECORDS_KIND:
      by_split.setdefault(f["split"], []).append(f)
    else:
      errors.append(f)
  for split, items in sorted(by_split.items()):
    items = sorted(items, key=lambda f: (f["group"], f["part"]))
    n = max(len(items), 1)
    if not items:
      out.append((None, FileSystems.join(output_dir, keys.RECORDS_DIR,
                                         f"{split}-00000-of-00001{suffix}"),
                  {"kind": RECORDS_KIND, "split": split, "records": 0, "bytes": 0}))
    for i, f in enumerate(items):
      out.append((f["temp"], FileSystems.join(output_dir, keys.RECORDS_DIR,
                                              f"{split}-{i:05d}-of-{n:05d}{suffix}"), f))
  errors = sorted(errors, key=lambda f: (f["split"], f["group"], f["part"]))
  for i, f in enumerate(errors):
    out.append((f["temp"], FileSystems.join(
        output_dir, keys.ERRORS_DIR,
        f"{ERRORS_PREFIX}-{i:05d}-of-{len(errors):05d}{ERRORS_SUFFIX}"), f))
  return out


def commit_files(files: List[Dict[str, Any]], output_dir: str, temp_root: str, gzip: bool,
                 splits: Iterable[str]) -> Dict[str, Any]:
  """Moves every complete file into place; safe to run again after a failure.

  Returns a summary per split: files, records and bytes (and the errors' files).
  """
  plan = final_names(files, output_dir, gzip, splits)
  for folder in (keys.RECORDS_DIR, keys.ERRORS_DIR):
    path = FileSystems.join(output_dir, folder)
    if "://" not in path:
      import os  # pylint: disable=g-import-not-at-top
      os.makedirs(path, exist_ok=True)
  for temp, final, _ in plan:
    if temp is None:
      if not FileSystems.exists(final):
        with FileSystems.create(final, compression_type=_compression(gzip)):
          pass
    elif FileSystems.exists(temp):
      if FileSystems.exists(final):
        FileSystems.delete([final])
      FileSystems.rename([temp], [final])
    elif not FileSystems.exists(final):
      raise IOError(f"neither the temp file {temp} nor its final {final} exists: the output "
                    "was changed while the job ran")
  if FileSystems.exists(temp_root):
    FileSystems.delete([temp_root])
  summary: Dict[str, Any] = {}
  for _, final, info in plan:
    name = info["split"] if info["kind"] == RECORDS_KIND else ERRORS_KIND
    s = summary.setdefault(name, {"files": 0, "records": 0, "bytes": 0, "largest_bytes": 0})
    size = FileSystems.match([final])[0].metadata_list[0].size_in_bytes
    s["files"] += 1
    s["records"] += info["records"]
    s["bytes"] += size
    s["largest_bytes"] = max(s["largest_bytes"], size)
  return summary
