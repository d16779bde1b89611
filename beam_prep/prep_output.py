"""`PrepOutput`: a beam-prep output folder, opened in one place.

A beam-prep output (local or gs://, read through `tf.io.gfile`) holds:

  features.json   the FeatureTable: what each record holds (`.table`)
  transform/      the tf.Transform output (`.tft_output`, opened on first use)
  records/        `<split>-NNNNN-of-NNNNN.tfrecord[.gz]` shards (`.files(split)`)
  manifest.json   the job's counts and settings (`.manifest`)
  errors/         the inputs that failed, with the reason
  _SUCCESS        written last: the output is complete (`.check_complete()`)

`read_numpy(split)` gives a split's examples as dicts of numpy arrays, each
(object, variant) of a record on its own (`RecordCodec.decode_examples`:
per-pixel features [H, W, C] in their declared dtype, string scalars as str,
int64 lists as arrays).

It lives with the data contract, below both command lines: the trainer, the
export, the NoC evaluation, the demo, the benchmark and the preview all build
on it, and it imports nothing of `train` or `pipelines`.
"""

import functools
import json
import os
import zlib
from typing import Any, Dict, Iterator, List, Optional, Sequence

import tensorflow as tf
import tensorflow_transform as tft
from google.protobuf.message import DecodeError

from beam_prep import keys
from beam_prep.features import FeatureError, FeatureTable
from beam_prep.record_codec import RecordCodec

# What a manifest says of each shard set (`beam-prep --add`: `sets_of`).
SET_KEYS = ("config", "counts", "shards", "complete", "problems", "timing", "error_examples")

# Records `read_numpy` decodes in one call (`RecordCodec.decode_records`): a
# call costs about what 15 records do, so one call per record would be slow.
READ_BATCH = 64


def sets_of(manifest: Dict[str, Any]) -> List[Dict[str, Any]]:
  """A manifest's shard sets, each with its `name` and `SET_KEYS` (an output
  no --add job added to: one set, "", its own)."""
  if manifest.get("sets"):
    return list(manifest["sets"])
  return [{"name": "", **{k: manifest.get(k) for k in SET_KEYS}}]


class RecordsError(Exception):
  """The records cannot be trained on; the message names the folder or shard and why."""


class PrepOutput:
  """One beam-prep output folder.

  Nothing is read when it is built: the table, the transform output and the
  manifest are read on first use, once.

  Args:
    path: the output folder (local or a gs:// URL). A local path is made
      absolute, so that what records it (a model dir's config.json) does not
      depend on the folder a command runs in.
    table: the output's FeatureTable when the caller has it already
      (default: read from features.json on first use).
  """

  def __init__(self, path: str, table: Optional[FeatureTable] = None):
    path = path.rstrip("/") or path
    self.path = path if keys.is_remote(path) else os.path.abspath(path)
    if table is not None:
      self.table = table  # Fills the cached property.

  def __repr__(self) -> str:
    return f"PrepOutput({self.path!r})"

  def join(self, *parts: str) -> str:
    return (
      "/".join([self.path, *parts])
      if keys.is_remote(self.path)
      else os.path.join(self.path, *parts)
    )

  @functools.cached_property
  def table(self) -> FeatureTable:
    """features.json."""
    return FeatureTable.load(self.path)

  @functools.cached_property
  def tft_output(self) -> tft.TFTransformOutput:
    """The tf.Transform output under transform/."""
    return tft.TFTransformOutput(self.join(keys.TRANSFORM_DIR))

  @functools.cached_property
  def manifest(self) -> Dict[str, Any]:
    """manifest.json, or {} when the output has none."""
    path = self.join(keys.MANIFEST_FILE)
    if not tf.io.gfile.exists(path):
      return {}
    with tf.io.gfile.GFile(path) as f:
      return json.load(f)

  @classmethod
  def of_model(cls, model_dir: str) -> "PrepOutput":
    """The output a `beam-train fit` model dir was trained on (its config.json's `data`).

    Model dirs written before the path was stored absolute hold it as it was
    typed, relative to the folder fit ran in. That folder is found from the
    recorded `model_dir` (also as typed): it is what remains of this model
    dir's absolute path once the recorded one is taken off its end. When that
    does not fit (the model dir was moved), the data path is taken relative
    to the model dir.

    Raises:
      FileNotFoundError: no config.json, or the recorded data is not there.
    """
    path = os.path.join(model_dir, keys.MODEL_CONFIG_FILE)
    if not tf.io.gfile.exists(path):
      raise FileNotFoundError(
        f"{path} not found: {model_dir} is not a beam-train fit model dir (pass --data PREP_OUTPUT)"
      )
    with tf.io.gfile.GFile(path) as f:
      recorded = json.load(f)
    if not isinstance(recorded, dict) or not isinstance(recorded.get("data"), str):
      raise FileNotFoundError(
        f"{path} names no training data: {model_dir} is not a beam-train fit model dir"
        + (
          " (it is a beam-prep output)"
          if tf.io.gfile.exists(os.path.join(model_dir, keys.MANIFEST_FILE))
          else ""
        )
      )
    data = recorded["data"]
    if not keys.is_remote(data) and not os.path.isabs(data) and not keys.is_remote(model_dir):
      data = os.path.join(_fit_folder(model_dir, recorded.get("model_dir", "")), data)
    prep = cls(os.path.normpath(data) if not keys.is_remote(data) else data)
    if not tf.io.gfile.exists(prep.path):
      raise FileNotFoundError(
        f"{model_dir} was trained on {recorded['data']} ({path}), which is not at "
        f"{prep.path}; pass --data PREP_OUTPUT"
      )
    return prep

  # ---- completeness -------------------------------------------------------

  def check_complete(self) -> None:
    """Refuses a folder that is not a finished beam-prep output.

    The job writes `_SUCCESS` last, after every shard, the transform and the
    manifest; without it the records may be a partial set.

    Raises:
      RecordsError: naming the folder and what to do.
    """
    if not tf.io.gfile.exists(self.path):
      raise RecordsError(f"{self.path} does not exist (expected a beam-prep output)")
    if tf.io.gfile.exists(self.join(keys.SUCCESS_FILE)):
      return
    if self._is_records_folder():
      parent = os.path.dirname(self.path)
      raise RecordsError(
        f"{self.path} is the {keys.RECORDS_DIR}/ folder of a beam-prep output, not the "
        f"output itself: give its parent, --data {parent}"
      )
    why = "the job that writes it is still running, failed or was stopped"
    if tf.io.gfile.exists(self.join(keys.MANIFEST_FILE)):
      problems = self.manifest.get("problems") or []
      if problems:  # The job ended, and said why its output is not complete.
        why = "the job failed: " + "; ".join(problems)
    raise RecordsError(
      f"{self.path} is not a complete beam-prep output: {keys.SUCCESS_FILE} is missing, so "
      f"{why}. See its manifest.json and errors/; run beam-prep again (with --overwrite)"
    )

  def check_trainable(self) -> None:
    """`check_complete`, and refuses an evaluation-only output (no train
    records, no transform): it can be evaluated on, not trained on.

    Raises:
      RecordsError: naming the folder and what to do.
    """
    self.check_complete()
    if self.manifest.get("eval_only"):
      raise RecordsError(
        f"{self.path} is an evaluation-only output (--eval-percent 100, or a layout whose "
        "every input is eval): it has no train records and no transform. Train on another "
        "prep output, and evaluate on this one: beam-train evaluate --data "
        f"{self.path} --model MODEL_DIR"
      )

  def _is_records_folder(self) -> bool:
    """Whether this folder holds shards itself (the records/ subfolder was given)."""
    return os.path.basename(self.path) == keys.RECORDS_DIR and bool(
      tf.io.gfile.glob(keys.record_pattern(os.path.dirname(self.path), "*"))
    )

  # ---- records ------------------------------------------------------------

  def files(self, split: str) -> List[str]:
    """The record shards of a split ("train", "eval", "source"; "*" for the
    train and eval records), sorted; [] when none."""
    if split == "*":
      return sorted(self.files(keys.TRAIN_SPLIT) + self.files(keys.EVAL_SPLIT))
    return sorted(tf.io.gfile.glob(keys.record_pattern(self.path, split)))

  def dataset(self, split: str) -> tf.data.Dataset:
    """The serialized records of a split, shard after shard, in file order."""
    files = self.files(split)
    if not files:
      return tf.data.Dataset.from_tensor_slices(tf.constant([], tf.string))
    return tf.data.TFRecordDataset(files, compression_type=keys.compression_of(files[0]))

  # `keys` hides the keys module inside; the name is the one callers know.
  def read_numpy(
    self,
    split: str,
    keys: Optional[Sequence[str]] = None,  # pylint: disable=redefined-outer-name
    limit: int = 0,
  ) -> Iterator[Dict[str, Any]]:
    """A split's examples decoded to numpy dicts, in file order (a record's
    variants in the order it holds them).

    Args:
      split: "train" or "eval".
      keys: the features to keep (default: all the record holds).
      limit: stop after this many examples (0: all).

    Yields:
      One dict per example (`RecordCodec.decode_examples`).
    """
    n, codec = 0, RecordCodec(self.table)
    # A record holds at least one example: `limit` records are enough.
    for batch in self.dataset(split).batch(min(READ_BATCH, limit) if limit else READ_BATCH):
      for examples in codec.decode_records(list(batch.numpy())):
        for rec in examples:
          if limit and n >= limit:
            return
          n += 1
          yield rec if keys is None else {k: rec[k] for k in keys if k in rec}

  def has_records(self, split: str) -> bool:
    """Whether any shard of the split holds a record (reads each shard's first).

    An unreadable shard counts as holding records: reading it is what names
    the damage (`check_shards`).
    """
    for path in self.files(split):
      try:
        if _first_record(path) is not None:
          return True
      except tf.errors.OpError:
        return True
    return False

  def no_records(self, split: str) -> str:
    """Why a split has no records, for a message: its shards and the manifest's counts."""
    files = self.files(split)
    where = (
      f"0 in its {len(files)} {keys.RECORDS_DIR}/{split}-* shard(s)"
      if files
      else f"no {keys.RECORDS_DIR}/{split}-* shard"
    )
    counts = self.manifest.get("counts", {})
    told = [
      f"{counts[k]} {what}"
      for k, what in (("inputs_read", "inputs read"), ("images_failed", "failed"))
      if k in counts
    ]
    reasons = counts.get("errors_by_reason") or {}
    if reasons:
      told.append("errors " + ", ".join(f"{r} x{n}" for r, n in sorted(reasons.items())))
    manifest = f"; {keys.MANIFEST_FILE}: {', '.join(told)}" if told else ""
    return f"{self.path} has no {split} records ({where}{manifest})"

  def check_shards(self, files: Sequence[str]) -> List[str]:
    """Checks each shard's first record against features.json, cheaply.

    Catches a shard from another run (other features or image size) or an
    unreadable shard before training starts.

    Returns:
      The shards that hold at least one record.

    Raises:
      RecordsError: naming the shard and the reason.
    """
    holding = []
    for path in files:
      try:
        first = _first_record(path)
      except tf.errors.OpError as e:
        raise RecordsError(
          f"shard {path} cannot be read: {e.message.strip()} (pass "
          "--skip-corrupt-records to train without its bad part)"
        ) from None
      if first is None:
        continue  # An empty shard (a split smaller than the shard count).
      holding.append(path)
      try:
        RecordCodec(self.table).decode_examples(first)
      except FeatureError as e:  # A per-pixel feature of another size.
        raise RecordsError(f"shard {path}: {e} (a shard from another run?)") from None
      except (ValueError, zlib.error, DecodeError) as e:
        raise RecordsError(
          f"shard {path} does not match the features of its features.json "
          f"(a shard from another run?): {e}"
        ) from None
    return holding

  @staticmethod
  def scan_shards(files: Sequence[str]) -> Dict[str, Dict[str, object]]:
    """Reads every shard fully: readable records and the error, if any, per shard."""
    out = {}
    for path in files:
      n, error = 0, None
      try:
        for _ in tf.data.TFRecordDataset(path, compression_type=keys.compression_of(path)):
          n += 1
      except tf.errors.OpError as e:
        error = e.message.strip().splitlines()[0]
      out[path] = {"records": n, "error": error}
    return out


def _first_record(path: str) -> Optional[bytes]:
  """A shard's first record (None: empty), read by TensorFlow's record reader
  (CRCs checked) without a tf.data pipeline, which costs about 15 ms a shard."""
  options = tf.io.TFRecordOptions(keys.compression_of(path))
  return next(tf.compat.v1.io.tf_record_iterator(path, options), None)


def _fit_folder(model_dir: str, recorded_model_dir: str) -> str:
  """The folder `beam-train fit` ran in, from where its model dir is now and
  how it was typed then; the model dir itself when the two do not line up."""
  here = os.path.abspath(model_dir)
  typed = os.path.normpath(recorded_model_dir) if recorded_model_dir else ""
  if typed and not os.path.isabs(typed) and here.endswith(os.sep + typed):
    return here[: len(here) - len(typed)].rstrip(os.sep) or os.sep
  return here
