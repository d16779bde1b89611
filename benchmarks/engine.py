"""The data engine on a real data set: clicks per object, round after round.

    python -m benchmarks --engine DIR --engine-base MODEL_DIR [--engine-rounds 3]
                         [--engine-objects 60] [--engine-layout auto]
                         [--engine-steps 100] [--engine-minutes 5]
                         [--workdir W] [--json FILE]

DIR is any input `beam-prep segmentation` reads; its objects, taken in a
fixed order (by image id, then object id), are cut into --engine-rounds
batches of --engine-objects. A simulated annotator labels them through a
running `beam-train serve` (the page's own endpoints, as a person's browser
calls them) with the protocol's clicker (`train.evaluate.clicker.next_click_of`: the
next click in the larger error) until IoU >= 0.90 or 20 clicks, and saves
what the model gave at that moment, not the truth. Round 1 is labelled
with MODEL_DIR; between rounds `beam-train engine` fine-tunes the served
model on every label saved so far, and the server serves the result.

The same objects are also labelled with MODEL_DIR never retrained (a second
server of its export, saving nothing): `frozen_clicks_per_object`. The
frozen pass of each batch after the first runs while the engine retrains,
so its click latency (clicks made while the round's process ran) against
that of the first batch (nothing retraining) says whether clicks wait on a
retrain.

JSON: `rounds`, one entry per round: `round`, `objects`,
`clicks_per_object` (mean), `frozen_clicks_per_object`, `label_iou` (the
saved labels' mean IoU with the truth), `iou_at_1` and `frozen_iou_at_1`
(mean IoU after the first click), `retrain_seconds` (the round of the
engine before it; null for round 1), `published` and `judged` (whether
that round published its model, and its NoC@90 and the served model's on
the held-out labels: `beam-train engine --judge-percent`), `version` (the
model that labelled it); `latency_ms`: p50 and p95 of clicks idle and
during a retrain.
"""

import argparse
import contextlib
import dataclasses
import os
import shutil
import time
from typing import Any, Dict, List, Optional

import numpy as np

from benchmarks.common import environment, log, refuse, run_and_write, run_command, serving, url_of
from beam_prep.kit import with_default
from train.engine import ENGINE_DIR, judged_text, rounds as engine_rounds
from train.serve.config import ENGINE_FIELDS, ServeConfig
from train.evaluate.simulate import TARGET_IOU, Annotator, label_batch, source_objects

PROG = "python -m benchmarks --engine"
# The served server's rounds run when the benchmark starts them, never by its count of saves.
NEVER = 10**9


def add_arguments(parser: argparse.ArgumentParser) -> None:
  """The `--engine` flags of `python -m benchmarks`."""
  parser.add_argument(
    "--engine",
    metavar="DIR",
    help="measure the data engine on DIR (any "
    "layout beam-prep segmentation reads); --json and --workdir apply",
  )
  parser.add_argument(
    "--engine-base",
    metavar="MODEL_DIR",
    help="--engine: the beam-train fit model dir the rounds start from",
  )
  parser.add_argument(
    "--engine-rounds",
    type=int,
    default=3,
    metavar="R",
    help="--engine: rounds of labelling, the engine running between two (default: %(default)s)",
  )
  parser.add_argument(
    "--engine-objects",
    type=int,
    default=60,
    metavar="N",
    help="--engine: objects labelled per round (default: %(default)s)",
  )
  parser.add_argument(
    "--engine-layout",
    default="auto",
    metavar="NAME",
    help="--engine: DIR's input layout, as beam-prep segmentation's --layout "
    "(default: %(default)s)",
  )
  # A round's settings: serve's `--engine-*` flags, their defaults and help.
  fields = {f.name: f for f in dataclasses.fields(ServeConfig)}
  for name in ENGINE_FIELDS:
    default = fields[name].default
    parser.add_argument(
      "--" + name.replace("_", "-"),
      type=type(default),
      default=default,
      help="--engine: " + with_default(fields[name].metadata["help"], default),
    )


# ---- the objects ---------------------------------------------------------------


def _objects(data: str, layout: str, base: str, workdir: str) -> List[Dict[str, Any]]:
  """Every object of DIR at its image's own size, in a fixed order: {image_id,
  image, label (uint8: 1 object, 0 background, 255 ignore)}."""
  from beam_prep.prep_output import PrepOutput  # pylint: disable=g-import-not-at-top
  from pipelines import cli  # pylint: disable=g-import-not-at-top

  out = os.path.join(workdir, "source")
  if not os.path.exists(os.path.join(out, "_SUCCESS")):
    argv = ["segmentation", "--config", PrepOutput.of_model(base).join("config.json")]
    argv += ["--input", data, "--layout", layout, "--output", out, "--eval-percent", "100"]
    argv += ["--overwrite", "--progress-seconds", "0", "--max-error-fraction", "1"]
    log_path = os.path.join(workdir, "source.log")
    if run_command(cli.main, argv, log_path):
      raise RuntimeError(f"beam-prep segmentation of {data} failed: see {log_path}")
  return source_objects(out)


# ---- the run -------------------------------------------------------------------


def _serve_config(save_dir: str = "", args=None) -> Dict[str, Any]:
  """A benchmark server's settings: with a save dir, its rounds run by
  `--engine-every`'s mechanism, started by the benchmark itself between
  batches."""
  engine = (
    {"engine_every": NEVER, **{k: getattr(args, k) for k in ENGINE_FIELDS}} if save_dir else {}
  )
  return {"save_dir": save_dir, "poll_seconds": 1.0, "max_clicks": 64, **engine}


def _ms(value: Optional[float]) -> str:
  return "-" if value is None else f"{value:.1f}"


def _percentiles(values: List[float]) -> Dict[str, float]:
  if not values:
    return {"p50": None, "p95": None, "clicks": 0}
  return {
    "p50": float(np.percentile(values, 50)),
    "p95": float(np.percentile(values, 95)),
    "clicks": len(values),
  }


def _summary(number, results, frozen, retrain: Dict[str, Any]) -> Dict[str, Any]:
  """A round's figures; `retrain`: the engine's entry of the round before it ({} for round 1)."""
  mean = lambda rs, k: float(np.mean([r[k] for r in rs])) if rs else None
  return {
    "round": number,
    "objects": len(results),
    "clicks_per_object": mean(results, "clicks"),
    "frozen_clicks_per_object": mean(frozen, "clicks"),
    "label_iou": mean(results, "label_iou"),
    "iou_at_1": mean(results, "iou_at_1"),
    "frozen_iou_at_1": mean(frozen, "iou_at_1"),
    "retrain_seconds": retrain["seconds"]["total"] if retrain else None,
    "published": bool(retrain["published"]) if retrain else None,
    "judged": retrain.get("judged"),
    "version": results[0]["version"] if results else None,
  }


def _rounds(batches, workdir: str, served, frozen_url: str) -> tuple:
  """Labels each batch with the server `served` ((server, versions) of
  `serving`); retrains between batches while the frozen pass of the next runs."""
  from train.serve import app as serve_app  # pylint: disable=g-import-not-at-top
  from train.serve.rounds import LOG_FILE  # pylint: disable=g-import-not-at-top

  server, versions = served
  retrain = server.app.extensions[serve_app.ROUNDS]
  labels_dir = os.path.join(workdir, "labels")
  labeller = Annotator(url_of(server), save=True)
  frozen_annotator = Annotator(frozen_url, save=False)
  frozen = [label_batch(frozen_annotator, batches[0])]
  idle = [ms for _, ms in frozen_annotator.latencies]
  busy, out = [], []
  for number, batch in enumerate(batches, start=1):
    last = {}
    if number > 1:
      before = versions.current.version
      started = time.time()
      retrain.start()
      mark = len(frozen_annotator.latencies)
      frozen.append(label_batch(frozen_annotator, batch))
      retrain.wait()
      if retrain.failed:
        raise RuntimeError(
          f"the engine round failed: see {os.path.join(labels_dir, ENGINE_DIR, LOG_FILE)}"
        )
      ended = time.time()
      busy += [ms for t, ms in frozen_annotator.latencies[mark:] if t < ended]
      last = engine_rounds(os.path.join(labels_dir, ENGINE_DIR))[-1]
      published = bool(last["published"])
      while published and versions.current.version == before and time.time() - ended < 120:
        time.sleep(0.5)
      log(
        f"engine: retrain {number - 1} took {ended - started:.0f} s with its process's "
        f"start ({last.get('seconds', {}).get('total', 0):.0f} s its own work); "
        f"{'published' if published else 'not published'}: serving version "
        f"{versions.current.version}"
      )
    results = label_batch(labeller, batch)
    out.append(_summary(number, results, frozen[number - 1], last))
    log(
      f"engine: round {number}: {out[-1]['clicks_per_object']:.2f} clicks per object "
      f"(frozen {out[-1]['frozen_clicks_per_object']:.2f}), labels' IoU "
      f"{out[-1]['label_iou']:.3f}, IoU@1 {out[-1]['iou_at_1']:.3f}"
    )
  return out, idle, busy


def run(args: argparse.Namespace) -> Dict[str, Any]:
  """The whole measurement (see the module docstring)."""
  from train.export.saved_model import latest_export  # pylint: disable=g-import-not-at-top

  workdir = os.path.abspath(args.workdir or "out/bench_engine")
  os.makedirs(workdir, exist_ok=True)
  objects = _objects(os.path.abspath(args.engine), args.engine_layout, args.engine_base, workdir)
  n = args.engine_rounds * args.engine_objects
  if len(objects) < args.engine_rounds:
    raise RuntimeError(f"{args.engine}: {len(objects)} objects, fewer than the rounds")
  objects = objects[:n]
  size = len(objects) // args.engine_rounds
  batches = [objects[i * size : (i + 1) * size] for i in range(args.engine_rounds)]
  served = os.path.join(workdir, "served")
  for folder in (served, os.path.join(workdir, "labels")):
    shutil.rmtree(folder, ignore_errors=True)
  shutil.copytree(args.engine_base, served)
  log(
    f"engine: {len(objects)} objects of {args.engine} in {args.engine_rounds} rounds; "
    f"from {args.engine_base}; work in {workdir}"
  )
  with contextlib.ExitStack() as stack:
    labelled = stack.enter_context(
      serving(served, **_serve_config(os.path.join(workdir, "labels"), args))
    )
    frozen, _ = stack.enter_context(serving(latest_export(args.engine_base), **_serve_config()))
    rounds, idle, busy = _rounds(batches, workdir, labelled, url_of(frozen))
  latency = {"idle": _percentiles(idle), "retrain": _percentiles(busy)}
  if latency["idle"]["p95"] and latency["retrain"]["p95"]:
    latency["retrain_vs_idle_p95"] = latency["retrain"]["p95"] / latency["idle"]["p95"]
  return {
    "data": os.path.abspath(args.engine),
    "base": os.path.abspath(args.engine_base),
    "rounds": rounds,
    "latency_ms": latency,
    "target_iou": TARGET_IOU,
    "settings": {k: v for k, v in vars(args).items() if k.startswith("engine")},
    "environment": environment(),
  }


def main(args: argparse.Namespace) -> int:
  if not args.engine_base:
    return refuse(PROG, "--engine-base MODEL_DIR is required")
  path = args.json or os.path.join(
    os.path.abspath(args.workdir or "out/bench_engine"), "engine.json"
  )
  return run_and_write(lambda: run(args), path, table)


def _verdict(entry: Dict[str, Any]) -> str:
  """The table's cell of the round before `entry`: published or not, and why."""
  if entry["published"] is None:
    return "-"
  why = f" ({judged_text(entry['judged'])})" if entry["judged"] else ""
  return ("yes" if entry["published"] else "no") + why


def table(result: Dict[str, Any]) -> str:
  lines = [
    "| round | objects | clicks/object | frozen | labels' IoU | IoU@1 | frozen IoU@1 "
    "| retrain s | published |",
    "|---|---|---|---|---|---|---|---|---|",
  ]
  for r in result["rounds"]:
    lines.append(
      f"| {r['round']} | {r['objects']} | {r['clicks_per_object']:.2f} | "
      f"{r['frozen_clicks_per_object']:.2f} | {r['label_iou']:.3f} | "
      f"{r['iou_at_1']:.3f} | {r['frozen_iou_at_1']:.3f} | "
      f"{r['retrain_seconds'] if r['retrain_seconds'] is not None else '-'} | "
      f"{_verdict(r)} |"
    )
  lat = result["latency_ms"]
  lines.append("")
  lines.append(
    f"click latency ms: idle p50 {_ms(lat['idle']['p50'])}, p95 {_ms(lat['idle']['p95'])}; "
    f"during a retrain p50 {_ms(lat['retrain']['p50'])}, p95 {_ms(lat['retrain']['p95'])}"
  )
  return "\n".join(lines)
