"""Dead-letter records: what failed, where it came from, at which stage, and why."""

from typing import Any, Dict

# Stage name of failures before any op ran (listing or reading an input).
READ_STAGE = "read"


def error_record(stage: str, reason: str, detail: str, ex: Dict[str, Any]) -> Dict[str, Any]:
  """A dead-letter entry: where the input came from, which stage, and why."""
  rec = {
      "source": ex.get("source", ""),
      "image_id": ex.get("image_id", ""),
      "stage": stage,
      "reason": reason,
      "detail": detail,
  }
  for k in ("object_id", "variant"):
    if k in ex:
      rec[k] = int(ex[k])
  return rec
