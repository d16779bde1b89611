"""The records a run reads, checked before training: every shard readable and
of the same run, train records present, eval records found; a shard that
breaks while training is named.
"""

import dataclasses
from typing import Any, Dict


from beam_prep import keys
from beam_prep.prep_output import PrepOutput, RecordsError
from train import logs
from train.config import TrainConfig
from train.fit.data import InputReader


@dataclasses.dataclass
class Records:
  """What the shard check found before training."""

  skipped: Any  # With --skip-corrupt-records: what is skipped (else None).
  has_eval: bool  # Whether any eval shard holds a record.


def ran_with_eval_percent(prep: PrepOutput) -> str:
  percent = prep.manifest.get("config", {}).get("eval_percent")
  return "" if percent is None else f"; this output was made with --eval-percent {percent}"


def check_records(config: TrainConfig, prep: PrepOutput) -> Records:
  """Checks the shards before training; with --skip-corrupt-records, scans them.

  Raises:
    RecordsError: no train record, or a shard is unreadable or from another run.
  """
  files, eval_files = prep.files(keys.TRAIN_SPLIT), prep.files(keys.EVAL_SPLIT)
  if config.skip_corrupt_records:
    skipped, readable = _scan_records(prep, files, eval_files)
    has_train = skipped["train_records_readable"] > 0
    if not has_train and skipped["corrupt_shards"]:
      raise RecordsError(
        f"no train record of {prep.path} is readable; corrupt: "
        + ", ".join(skipped["corrupt_shards"])
      )
  else:
    skipped, readable = None, set(prep.check_shards(files + eval_files))
    has_train = any(p in readable for p in files)
  if not has_train:
    raise RecordsError(
      f"{prep.no_records(keys.TRAIN_SPLIT)}: nothing to train on. "
      f"{prep.join(keys.MANIFEST_FILE)} counts what the job read and wrote, and "
      f"{prep.join(keys.ERRORS_DIR)}/ lists each input that failed and why"
    )
  return Records(skipped, any(p in readable for p in eval_files))


def _scan_records(prep: PrepOutput, files, eval_files):
  """With --skip-corrupt-records: (what is skipped, the shards worth reading).

  What is skipped: corrupt shards, their errors, records readable, and
  records lost (from the manifest's counts). A corrupt shard is worth
  reading: its readable part is trained on.
  """
  scan = prep.scan_shards(files + eval_files)
  corrupt = {p: v["error"] for p, v in scan.items() if v["error"]}
  prep.check_shards([p for p in files + eval_files if scan[p]["records"] > 0])
  report: Dict[str, Any] = {"corrupt_shards": sorted(corrupt), "errors": corrupt}
  expected = prep.manifest.get("counts", {}).get("records_written")
  for split, split_files in ((keys.TRAIN_SPLIT, files), (keys.EVAL_SPLIT, eval_files)):
    readable = sum(scan[p]["records"] for p in split_files)
    report[f"{split}_records_readable"] = readable
    if expected is not None:
      report[f"{split}_records_skipped"] = max(expected.get(split, 0) - readable, 0)
  if corrupt:
    logs.get().info(
      "train: skipping the unreadable part of %d shard(s): %s; %s train records lost",
      len(corrupt),
      ", ".join(sorted(corrupt)),
      report.get("train_records_skipped", "an unknown number of"),
    )
  return report, {p for p, v in scan.items() if v["records"] or v["error"]}


def name_corrupt_shards(reader: InputReader, error: Exception) -> Exception:
  """Turns a read error in the middle of training into one naming the shard."""
  scan = reader.prep.scan_shards(reader.files(keys.TRAIN_SPLIT))
  bad = {p: v["error"] for p, v in scan.items() if v["error"]}
  if not bad:
    return error
  return RecordsError(
    "corrupt records in "
    + "; ".join(f"shard {p}: {e}" for p, e in sorted(bad.items()))
    + " (pass --skip-corrupt-records to train on the readable records)"
  )
