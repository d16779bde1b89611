"""Measures the preprocessing job: its kernel in a plain loop against the Beam job.

prep.kernel_objects_s      the pipeline's ops in a plain Python loop, one core
prep.beam_objects_s        the whole pipeline on the DirectRunner, as the CLI runs it
prep.peak_rss_mb.N / .16N  peak memory of the pipeline at two data-set sizes
prep.beam_marginal_objects_s  objects/s between N and 16N (fixed cost removed)
prep.two_workers_speedup   16N with 2 DirectRunner worker threads vs 1 worker
"""

import glob
import math
import os
import statistics
import time
from typing import Any, Dict

from benchmarks.common import log, make_data, pipeline_in_fresh_process, run_pipeline


def bench_kernel_loop(data: str, size: int, variants: int) -> float:
  """Objects/s of the job's kernel (read, decode, clicks, maps, encode) in a plain loop
  over the folders layout's pointers (the same kernel the job's shard writers run)."""
  from beam_prep.config import PrepConfig  # pylint: disable=g-import-not-at-top
  from beam_prep.kernel import Kernel  # pylint: disable=g-import-not-at-top
  from beam_prep.readers import resolve_layout  # pylint: disable=g-import-not-at-top

  layout = resolve_layout(data, "auto", "instances")  # The sample data's image folders.
  config = PrepConfig.from_dict(
    dict(input=data, output="unused", image_size=size, variants=variants, layout=layout.name)
  )
  kernel = Kernel(config.layout, config.stages, config.ops_module, config.features())
  kernel.setup()
  from beam_prep.shards.plan import pointer_split  # pylint: disable=g-import-not-at-top

  pointers = [layout.pointer(data, p) for p in sorted(glob.glob(layout.pattern(data)))]
  t = time.perf_counter()
  objects = 0
  for pointer in pointers:  # Each in its split, as the job: eval images also keep a source record.
    result = kernel.process(pointer, pointer_split(pointer, config.eval_percent))
    objects += result.tally.counts.get("objects_found", 0)
  return objects / (time.perf_counter() - t)


def bench_prep(data: str, prep_dir: str, s: Dict[str, Any]) -> Dict[str, Any]:
  """The kernel loop's objects/s over `data`, then the Beam job's (written to
  `prep_dir`, whose records the input and training figures read)."""
  kernel = bench_kernel_loop(data, s["size"], s["variants"])
  manifest = run_pipeline(data, prep_dir, s["size"], s["variants"])
  objects = manifest["counts"]["objects_found"]
  beam = objects / manifest["timing"]["wall_seconds"]
  log(f"prep: kernel loop {kernel:.1f} objects/s, Beam {beam:.1f} objects/s")
  return {
    "prep.kernel_objects_s": kernel,
    "prep.beam_objects_s": beam,
    "prep.objects": objects,
    "prep.runner": "DirectRunner in_memory, 1 worker",
  }


def bench_marginal(workdir: str, small: str, large: str, s: Dict[str, Any]) -> Dict[str, Any]:
  """The Beam job's marginal objects/s (the slope between N and 16N images, one
  worker, fresh processes) against the plain kernel loop over the 16N images,
  as `pairs` (a setting) paired measurements: the figures are the medians,
  the ratio the median of the pairs' ratios (the loop alone moves a lot
  between runs)."""
  one_worker = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]
  pairs = []
  for i in range(s["pairs"]):
    run_n = pipeline_in_fresh_process(
      small, os.path.join(workdir, f"rss_n_{i}"), s["size"], s["variants"], one_worker
    )
    run_16n = pipeline_in_fresh_process(
      large, os.path.join(workdir, f"rss_16n_{i}"), s["size"], s["variants"], one_worker
    )
    extra = run_16n["seconds"] - run_n["seconds"]
    marginal = (run_16n["objects"] - run_n["objects"]) / extra if extra > 0 else float("nan")
    kernel = bench_kernel_loop(large, s["size"], s["variants"])
    pairs.append(
      {
        "n": run_n,
        "16n": run_16n,
        "marginal": marginal,
        "kernel": kernel,
        "ratio": marginal / kernel,
      }
    )
    log(
      f"pair {i + 1}: Beam marginal {marginal:.1f} objects/s, kernel loop {kernel:.1f} "
      f"objects/s ({marginal / kernel:.2f})"
    )

  def median(values):  # Of the defined ones (a slope within noise is NaN).
    values = [v for v in values if math.isfinite(v)]
    return statistics.median(values) if values else float("nan")

  first = pairs[0]
  marginal = median(p["marginal"] for p in pairs)
  return {
    "prep.beam_marginal_objects_s": marginal,
    "prep.kernel_objects_s.16N": median(p["kernel"] for p in pairs),
    "prep.beam_marginal_vs_kernel_pairs": [p["ratio"] for p in pairs],
    "prep.beam_marginal_vs_kernel_median": median(p["ratio"] for p in pairs),
    "prep.beam_fixed_seconds": median(
      p["n"]["seconds"] - p["n"]["objects"] / p["marginal"] for p in pairs
    ),
    "prep.seconds_16n_1_worker": median(p["16n"]["seconds"] for p in pairs),
    "prep.peak_rss_mb.N": first["n"]["rss_mb"],
    "prep.peak_rss_mb.16N": first["16n"]["rss_mb"],
    "prep.rss_images.N": s["rss_n"],
    "prep.records_mb.16N": first["16n"]["records_mb"],
  }


def bench_scaling(workdir: str, s: Dict[str, Any]) -> Dict[str, Any]:
  """Memory and marginal rate at N and 16N images (`bench_marginal`), and the
  16N job with 2 DirectRunner worker threads against 1 worker."""
  small = make_data(workdir, s["rss_n"], s["size"], seed=1)
  large = make_data(workdir, 16 * s["rss_n"], s["size"], seed=1)
  out = bench_marginal(workdir, small, large, s)
  run_16n_2w = pipeline_in_fresh_process(
    large,
    os.path.join(workdir, "rss_16n_2w"),
    s["size"],
    s["variants"],
    ["--direct_running_mode=multi_threading", "--direct_num_workers=2"],
  )
  out["prep.seconds_16n_2_workers"] = run_16n_2w["seconds"]
  out["prep.two_workers_speedup"] = out["prep.seconds_16n_1_worker"] / run_16n_2w["seconds"]
  out["prep.peak_rss_mb.16N_2_workers"] = run_16n_2w["rss_mb"]
  log(
    f"memory: {out['prep.peak_rss_mb.N']:.0f} MB at N={s['rss_n']}, "
    f"{out['prep.peak_rss_mb.16N']:.0f} MB at 16N ({out['prep.records_mb.16N']:.0f} "
    f"MB of records); 2 workers {out['prep.two_workers_speedup']:.2f}x faster at 16N"
  )
  return out
