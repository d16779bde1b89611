"""The shard plan: splits, a stable order, and groups per split from measured bytes."""

import hashlib
import json
import zlib
from typing import Any, Dict, List, Tuple

import apache_beam as beam

from beam_prep import keys
from beam_prep.kernel import Kernel
from beam_prep.shards.files import tfrecord_frame

# Inputs whose records are computed once more to measure bytes per input.
PROBE_INPUTS = 16


def stable_hash(text: str) -> int:
  """A hash that is the same in every process, runner and Python version."""
  return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


def split_of(image_id: str, eval_percent: int) -> str:
  """Train or eval, by a stable hash of the image id (all objects and
  variants of one image land in the same split)."""
  return keys.EVAL_SPLIT if stable_hash(image_id) % 100 < eval_percent else keys.TRAIN_SPLIT


def pointer_split(pointer: Dict[str, Any], eval_percent: int) -> str:
  """The layout's split when it fixes one (VOC lists, a manifest column), else by
  hash; every input is eval in an evaluation-only run (`eval_percent` 100)."""
  if eval_percent >= 100:
    return keys.EVAL_SPLIT
  return pointer.get(keys.SPLIT) or split_of(pointer[keys.IMAGE_ID], eval_percent)


def pointer_order(pointer: Dict[str, Any]) -> Tuple[int, str]:
  """A total order of pointers that every run agrees on (hash first, so a
  sample taken by it is spread over the data)."""
  text = json.dumps(pointer, sort_keys=True, default=str)
  return stable_hash(pointer.get(keys.IMAGE_ID, "")), text


def error_pointer(error: Dict[str, Any]) -> Dict[str, Any]:
  """An input that failed before it had files to read, as a pointer that
  travels to a shard writer like any other (its error is written there)."""
  return {
    keys.IMAGE_ID: error.get(keys.IMAGE_ID) or error.get(keys.SOURCE, ""),
    keys.SOURCE: error.get(keys.SOURCE, ""),
    "read_error": error,
  }


def is_input(pointer: Dict[str, Any]) -> bool:
  """Whether a pointer is an input (not the failed objects of no image)."""
  return not pointer.get("no_image")


def probe(sample: List[Dict[str, Any]], kernel: Kernel) -> Dict[str, float]:
  """Bytes per input and the gzip ratio, from a fixed sample's real records."""
  raw = packed = 0
  for pointer in sample:
    data = b"".join(tfrecord_frame(r) for r in kernel.process(pointer).records)
    raw += len(data)
    packed += len(zlib.compress(data, 6)) if data else 0
  return {
    "bytes_per_input": raw / max(len(sample), 1),
    "gzip_ratio": packed / raw if raw else 1.0,
    "probed_inputs": len(sample),
  }


def plan_groups(
  sizes: Dict[str, int], measured: Dict[str, float], target_bytes: float, gzip: bool
) -> Dict[str, Any]:
  """Groups per split from the input counts and the measured bytes per input."""
  ratio = measured["gzip_ratio"] if gzip else 1.0
  per_input = measured["bytes_per_input"] * ratio
  groups = {
    split: max(1, int(round(n * per_input / target_bytes))) for split, n in sorted(sizes.items())
  }
  return {
    "groups": groups,
    "inputs": dict(sorted(sizes.items())),
    "bytes_per_input": round(per_input, 1),
    "target_bytes": target_bytes,
    # A file is closed past twice the target (in uncompressed bytes).
    "roll_bytes": 2 * target_bytes / ratio if ratio > 0 else 2 * target_bytes,
    "probed_inputs": measured["probed_inputs"],
  }


class PlanShards(beam.PTransform):
  """(split, pointer) pairs -> a singleton plan: groups per split and file size limits.

  The count per split comes from the data (inputs only); the bytes per input
  from the real records of the `PROBE_INPUTS` first pointers in hash order
  (the same sample on every run, so the plan, and with it every file, repeats).
  """

  def __init__(self, kernel: Kernel, target_bytes: float, gzip: bool):
    super().__init__()
    self._kernel = kernel
    self._target = target_bytes
    self._gzip = gzip

  def expand(self, keyed: beam.PCollection) -> beam.PCollection:
    kernel, target, gzip = self._kernel, self._target, self._gzip
    inputs = keyed | "InputsOnly" >> beam.Filter(lambda kv: is_input(kv[1]))
    sizes = (
      inputs
      | "Splits" >> beam.Keys()
      | "CountSplits" >> beam.combiners.Count.PerElement()
      | "SizesDict" >> beam.combiners.ToDict()
    )
    measured = (
      inputs
      | "Pointers" >> beam.Values()
      | "Sample" >> beam.combiners.Top.Smallest(PROBE_INPUTS, key=pointer_order)
      | "MeasureBytes" >> beam.Map(probe, kernel)
    )
    return measured | "Plan" >> beam.Map(
      lambda m, sizes: plan_groups(sizes, m, target, gzip), beam.pvalue.AsSingleton(sizes)
    )
