"""Dead-letter records: what failed, where it came from, at which stage, and why."""

from typing import Any, Dict

from beam_prep import keys

# Stage name of failures before any op ran (listing or reading an input).
READ_STAGE = "read"


def error_record(stage: str, reason: str, detail: str, ex: Dict[str, Any]) -> Dict[str, Any]:
  """A dead-letter entry: where the input came from, which stage, and why."""
  rec = {
    keys.SOURCE: ex.get(keys.SOURCE, ""),
    keys.IMAGE_ID: ex.get(keys.IMAGE_ID, ""),
    "stage": stage,
    "reason": reason,
    "detail": detail,
  }
  for k in (keys.OBJECT_ID, keys.VARIANT):
    if k in ex:
      rec[k] = int(ex[k])
  return rec
