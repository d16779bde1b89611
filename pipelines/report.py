"""What a finished job says about itself: manifest.json, whether the output is
complete, the end-of-run summary and, for a failed job, why.

An output is complete (and gets `_SUCCESS`) only when its counts add up, it
holds at least one record, and no level (images, objects, examples) lost
more than `--max-error-fraction` of its units.
"""

from typing import Any, Dict, List, Optional

from apache_beam.io.filesystems import FileSystems

from beam_prep import keys
from beam_prep.config import PrepConfig
from beam_prep.features import FeatureTable
from beam_prep.kernel import Tally
from beam_prep.version import library_versions
from pipelines.shard_sets import set_lines

# (level, failed count, found count) of the manifest's counts.
LEVELS = (
  ("images", "images_failed", "inputs_read"),
  ("objects", "objects_failed", "objects_found"),
  ("examples", "example_errors", "examples_made"),
)
REASONS_SHOWN = 3


def problems(
  counts: Dict[str, Any],
  max_error_fraction: float,
  eval_only: bool = False,
  held: Optional[Dict[str, Any]] = None,
) -> List[str]:
  """Why an output is not complete ([]: it is).

  An evaluation-only output is judged by its images: its source records are
  what it is for, and objects too small for the records' size are still
  evaluated there. A job that adds to an output (`--add`) is judged with
  what the output `held` (its counts) before it: its failures against the
  images, objects and examples the output holds after it; one that found
  only images the output holds has nothing to write.
  """
  out = []
  if not counts["accounted"]:
    out.append(
      "the counts do not add up (examples written {w} + example errors {e} should equal the "
      "examples made {m}, one per used unit and variant): an op dropped or added examples".format(
        w=sum(counts["examples_written"].values()),
        e=counts["example_errors"],
        m=counts["examples_made"],
      )
    )
  if not sum(counts["examples_written"].values()) and not (
    (eval_only and counts.get("source_records")) or counts.get("images_known") or held
  ):
    out.append("no record was written")
  for level, failed, found in LEVELS[:1] if eval_only else LEVELS:
    total = counts[found] + _held_units(level, counts, held)
    if total and counts[failed] / total > max_error_fraction:
      also = " (with those the output held)" if held else ""
      out.append(
        f"{counts[failed]} of {total} {level}{also} failed "
        f"({counts[failed] / total:.0%}), over --max-error-fraction {max_error_fraction:g}"
      )
  return out


def _held_units(level: str, counts: Dict[str, Any], held: Optional[Dict[str, Any]]) -> int:
  """What an output held at `level` before a job added to it, less the job's
  inputs it held (counted in both)."""
  if held is None:
    return 0
  if level == "images":
    return held["images_used"] - counts.get("images_known", 0)
  if level == "objects":
    return held["objects_used"]
  return sum(held["examples_written"].values())


def manifest(
  config: PrepConfig,
  table: FeatureTable,
  tally: Tally,
  seconds: float,
  shards: Dict[str, Any],
  held: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
  """manifest.json: config, features, versions, counts, verdict, shards,
  timings (`held`: the counts of the output a job adds to, `problems`)."""
  task = config.task_object
  counts = tally.accounting(task.examples_per_unit(config), task.splits_objects(config))
  n_examples = sum(counts["examples_written"].values())
  found = problems(counts, config.max_error_fraction, config.eval_only, held)
  return {
    "pipeline": config.task,
    "splits_objects": task.splits_objects(config),
    "eval_only": config.eval_only,
    "config": config.to_dict(),
    "versions": library_versions(),
    "features": table.to_dict()["features"],
    "paths": {
      "records": FileSystems.join(config.output, keys.RECORDS_DIR),
      "transform": (
        None if config.eval_only else FileSystems.join(config.output, keys.TRANSFORM_DIR)
      ),
      "errors": FileSystems.join(config.output, keys.ERRORS_DIR),
      "preview": None,
    },
    "counts": counts,
    "complete": not found,
    "problems": found,
    "error_examples": dict(sorted(tally.samples.items())),
    "shards": shards,
    "timing": {
      "wall_seconds": round(seconds, 2),
      "examples_per_second": round(n_examples / seconds, 2) if seconds else None,
      "images_per_second": round(counts["inputs_read"] / seconds, 2) if seconds else None,
    },
  }


def summary_lines(m: Dict[str, Any]) -> List[str]:
  """The end-of-run summary, a few lines a person reads at a glance: the
  job's own counts (the set it added, after --add), then what the output holds."""
  if m.get("sets"):
    own = m["sets"][-1]
    return _job_lines({**m, "counts": own["counts"], "timing": own["timing"]}) + set_lines(m)
  return _job_lines(m)


def _job_lines(m: Dict[str, Any]) -> List[str]:
  c, t = m["counts"], m["timing"]
  ex = c["examples_written"]
  inputs = (
    f"  inputs read      {c['inputs_read']} images ({c['images_used']} used, "
    f"{c['images_failed']} failed)"
  )
  if c.get("images_known"):
    inputs += f"; {c['images_known']} held already, skipped"
    if c.get("images_relabelled"):
      inputs += (
        f" ({c['images_relabelled']} with other labels: run without --add to train on those)"
      )
  if m.get("splits_objects"):
    inputs += (
      f"; {c['objects_found']} objects ({c['objects_used']} used, {c['objects_failed']} failed)"
    )
    if c.get("objects_box_only"):
      inputs += f"; {c['objects_box_only']} box-only annotations (ignore regions)"
    if c.get("objects_margin_reduced"):
      inputs += (
        f"; {c['objects_margin_reduced']} thinner than the click margin "
        "(clicked at their most interior pixels)"
      )
  source = (
    f"; eval images at their own size {c['source_records']}" if c.get("source_records") else ""
  )
  lines = [
    inputs,
    f"  examples written train {ex.get('train', 0)}, eval {ex.get('eval', 0)} in "
    f"{sum(c.get('records_written', {}).values())} records{source} -> {m['paths']['records']}",
    f"  transform        {m['paths']['transform'] or 'none (an evaluation-only output)'}",
  ]
  if c["errors_total"]:
    reasons = ", ".join(f"{k} {v}" for k, v in c["errors_by_reason"].items())
    lines.append(f"  errors           {c['errors_total']} ({reasons}) -> {m['paths']['errors']}")
  else:
    lines.append("  errors           none")
  if m["paths"].get("preview"):
    lines.append(f"  preview          {m['paths']['preview']}")
  lines.append(
    f"  time             {t['wall_seconds']:.1f} s, "
    f"{t['examples_per_second']:.1f} examples/s, "
    f"{t['images_per_second']:.1f} images/s"
  )
  return lines


def _example_line(reason: str, n: int, error: Dict[str, Any]) -> str:
  where = error.get(keys.SOURCE, "")
  for k in (keys.OBJECT_ID, keys.VARIANT):
    if k in error:
      where += f", {k.replace('_id', '')} {error[k]}"
  return f"    {reason} x{n}: {error.get('stage', '?')}: {error.get('detail', '')} (e.g. {where})"


def failure_lines(m: Dict[str, Any]) -> List[str]:
  """Why a job failed: its problems, then the most frequent reasons with an example each."""
  lines = [f"  the output is not complete: {p}" for p in m["problems"]]
  reasons = sorted(m["counts"]["errors_by_reason"].items(), key=lambda kv: (-kv[1], kv[0]))
  if reasons:
    lines.append(f"  most frequent failures (all of them in {m['paths']['errors']}):")
  for reason, n in reasons[:REASONS_SHOWN]:
    lines.append(_example_line(reason, n, m["error_examples"].get(reason, {})))
  lines.append(f"  no {keys.SUCCESS_FILE} was written: beam-train refuses this output")
  if m.get("sets"):
    lines.append(
      f"  the sets before {m['sets'][-1]['name']} are unchanged: the next --add removes it "
      "first (the same command, once its inputs are mended)"
    )
  return lines
