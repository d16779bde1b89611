"""Measures every claim of the product as ratios within one run.

    python -m benchmarks [--quick] [--json PATH] [--plot PATH] [--workdir DIR]
    python -m benchmarks --real DIR [--json PATH] [--workdir DIR] [...]   (`benchmarks.real`)
    python -m benchmarks --engine DIR --engine-base MODEL_DIR [...]       (`benchmarks.engine`)
    python -m benchmarks --boxes PREP --boxes-model MODEL [...]         (`benchmarks.boxes`)
    python -m benchmarks --portable EXPORT --portable-data PREP [...]   (`benchmarks.portable`)

Figures (each the median of several timed repetitions after a warm-up):

  input.on_the_fly_img_s     records without maps; distance maps built in a
                             tf.py_function per example (what the product replaces)
  input.precomputed_img_s    our records through our reader (parse + transform)
  input.read_ceiling_img_s   the same files read by TFRecordDataset alone
  train.synthetic_steps_s    the training step on in-memory tensors
  train.real_steps_s         the same step fed by our reader
  train.input_wait_fraction  share of the real run's step time waiting for input
  prep.kernel_objects_s      the pipeline's ops in a plain Python loop, one core
  prep.beam_objects_s        the whole pipeline on the DirectRunner, as the CLI runs it
  clicks.ms_per_sample       one object, one variant, 512x512: sampling + both maps
  clicks.reference_ms_per_sample   a full distance transform after every click
  prep.peak_rss_mb.N / .16N  peak memory of the pipeline at two data-set sizes
  prep.beam_marginal_objects_s  objects/s between N and 16N (fixed cost removed)
  prep.two_workers_speedup   16N with 2 DirectRunner worker threads vs 1 worker
  storage.*                  bytes per (object, variant), reader examples/s per core and
                             write time of the record layouts (`bench_storage`)
  serve.latency_ms_p50/p95   one 512x512 image, 5+5 clicks, loaded SavedModel
  serve.rest_latency_ms_p50/p95  the same through `beam-train serve`'s TF Serving
                             REST endpoint (JSON both ways), and its ratio to the
                             SavedModel's p50 (serve.rest_vs_saved_model)
  serve.page_latency_ms_p50/p95  a click through the page's own endpoint
  serve.encoded_*            a 512x600 JPEG as the encoded file: the SavedModel's
                             `serve_encoded` and REST with {"b64": ...}, timed in
                             turn (serve.encoded_rest_vs_saved_model)
  serve.bad_5xx / bad_max_ms / bad_rss_after_vs_before  requests meant to bring
                             the server down (`benchmarks.bad_requests`): answers
                             of 500, the slowest answer, RSS after / before
  labels.save_ms_p50/p95     a save into the label store holding `labels_fill`
                             images, and its ratio to a save into an empty one
  noc.*_object_clicks_s      NoC at source resolution (512x512 images): objects x
                             clicks per second, nearest-click baseline and model;
                             noc.edt_share_of_baseline: the distance transforms' share

This runner only sequences them: each group is measured in its module (clicks,
prep, input, training, storage, serve, noc, helpers in common), and report
holds the targets, the printed table and the plot.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Dict

from benchmarks import boxes, engine, portable, real
from benchmarks.clicks import bench_clicks
from benchmarks.common import environment, log, make_data, pipeline_in_fresh_process
from benchmarks.input import bench_input
from benchmarks.labels import bench_labels
from benchmarks.noc import bench_noc_source
from benchmarks.prep import bench_prep, bench_scaling
from benchmarks.report import TARGETS, check_targets, plot, table
from benchmarks.serve import bench_serve
from benchmarks.storage import STORAGE_ROWS, bench_storage
from benchmarks.training import bench_train, fit_model

# STORAGE_ROWS, TARGETS and pipeline_in_fresh_process live in their groups'
# modules; the tests and the docs name them here.
__all__ = ["SETTINGS", "STORAGE_ROWS", "TARGETS", "main", "measure", "pipeline_in_fresh_process"]

SETTINGS = {
  "quick": {
    "count": 24,
    "size": 256,
    "variants": 2,
    "batch": 8,
    "batches": 12,
    "repeats": 3,
    "train_steps": 5,
    "width": 8,
    "depth": 3,
    "rss_n": 12,
    "fit_steps": 20,
    "serve_repeats": 20,
    "click_repeats": 3,
    "noc_images": 4,
    "noc_size": 512,
    "noc_clicks": 20,
    "pairs": 3,
    "labels_fill": 1000,
  },
  "full": {
    "count": 64,
    "size": 256,
    "variants": 4,
    "batch": 16,
    "batches": 25,
    "repeats": 5,
    "train_steps": 10,
    "width": 16,
    "depth": 3,
    "rss_n": 16,
    "fit_steps": 100,
    "serve_repeats": 50,
    "click_repeats": 5,
    "noc_images": 8,
    "noc_size": 512,
    "noc_clicks": 20,
    "pairs": 3,
    "labels_fill": 10000,
  },
  # Tiny: what the smoke test runs to keep this code working (one pair of
  # fresh-process runs: the medians' code is the same for one).
  "tiny": {
    "count": 4,
    "size": 64,
    "variants": 2,
    "batch": 2,
    "batches": 2,
    "repeats": 1,
    "train_steps": 2,
    "width": 4,
    "depth": 2,
    "rss_n": 1,
    "fit_steps": 4,
    "serve_repeats": 2,
    "click_repeats": 1,
    "noc_images": 1,
    "noc_size": 96,
    "noc_clicks": 3,
    "pairs": 1,
    "labels_fill": 10,
  },
}


def measure(mode: str, workdir: str) -> Dict[str, Any]:
  """Every figure at `mode`'s SETTINGS, in one process, data and outputs in `workdir`."""
  s = SETTINGS[mode]
  figures: Dict[str, Any] = {}
  t0 = time.time()
  log(f"{mode} settings: {s}")
  figures.update(bench_clicks(s["click_repeats"]))
  data = make_data(workdir, s["count"], s["size"])
  prep_dir = os.path.join(workdir, "prep")
  figures.update(bench_prep(data, prep_dir, s))
  figures.update(bench_input(prep_dir, s["batch"], s["batches"], s["repeats"]))
  figures.update(
    bench_train(prep_dir, s["batch"], s["train_steps"], s["repeats"], s["width"], s["depth"])
  )
  figures.update(bench_scaling(workdir, s))
  figures.update(bench_storage(data, workdir, s))
  model_dir = fit_model(workdir, prep_dir, s)
  figures.update(bench_serve(model_dir, s["serve_repeats"]))
  figures.update(bench_noc_source(workdir, model_dir, s))
  figures.update(bench_labels(workdir, s["labels_fill"], s["serve_repeats"]))
  return {
    "mode": mode,
    "settings": s,
    "environment": environment(),
    "figures": figures,
    "targets": check_targets(figures),
    "seconds": time.time() - t0,
  }


# The benchmarks of their own flag, `--NAME` (the module's name) and its
# `--NAME-*` settings, each module adding them (`add_arguments`).
GROUPS = (real, engine, boxes, portable)


def _check_groups(parser: argparse.ArgumentParser, args, groups) -> None:
  """Refuses a group's own flag (--real-steps, ...) set without the group's
  flag (--real DIR): the default benchmark would run, the flag unused."""
  for action in parser._actions:  # pylint: disable=protected-access
    group = next((g for g in groups if action.dest.startswith(g + "_")), None)
    if group and getattr(args, group) is None and getattr(args, action.dest) != action.default:
      parser.error(f"{action.option_strings[0]} needs --{group}")


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(prog="python -m benchmarks")
  parser.add_argument("--quick", action="store_true", help="small sizes (a few minutes)")
  parser.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)
  parser.add_argument("--json", help="write the results here")
  parser.add_argument("--plot", help="write the input-pipeline plot (PNG) here")
  parser.add_argument("--workdir", help="keep the data and outputs here (default: a temp dir)")
  for group in GROUPS:
    group.add_arguments(parser)
  args = parser.parse_args(argv)
  _check_groups(parser, args, [g.__name__.rsplit(".", 1)[-1] for g in GROUPS])
  if args.real is not None:
    sys.exit(real.main(args))
  if args.boxes is not None:
    sys.exit(boxes.main(args))
  if args.portable is not None:
    sys.exit(portable.main(args))
  from pipelines import logs  # pylint: disable=g-import-not-at-top

  logs.quiet()
  if args.engine is not None:
    sys.exit(engine.main(args))
  mode = "tiny" if args.tiny else "quick" if args.quick else "full"
  workdir = args.workdir or tempfile.mkdtemp(prefix="beam_prep_bench_")
  os.makedirs(workdir, exist_ok=True)
  try:
    result = measure(mode, workdir)
  finally:
    if not args.workdir:
      shutil.rmtree(workdir, ignore_errors=True)
  print(table(result))
  print(f"\n({result['seconds']:.0f} s)")
  for path in (args.json, args.plot):
    if path and os.path.dirname(path):
      os.makedirs(os.path.dirname(path), exist_ok=True)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(result, f, indent=2, sort_keys=True)
  if args.plot:
    plot(result, args.plot)
