"""Measures NoC at source resolution: objects x clicks per second, baseline and model.

noc.*_object_clicks_s      NoC at source resolution (512x512 images): objects x
                           clicks per second, nearest-click baseline and model;
                           noc.edt_share_of_baseline: the distance transforms' share
"""

import os
import time
from typing import Any, Dict

import numpy as np

from benchmarks.common import log, make_data, run_pipeline
from train.evaluate import protocol


def bench_noc_source(workdir: str, model_dir: str, s: Dict[str, Any]) -> Dict[str, float]:
  """NoC at source resolution (`beam-train evaluate --data`): objects x clicks
  per second for the nearest-click baseline and the model, as a command runs
  it (the loop's one trace included), and the share of
  the baseline's time its distance transforms take (2 per click per object,
  timed alone on masks of the same size)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from train.evaluate import clicker, source_eval  # pylint: disable=g-import-not-at-top
  from beam_prep.prep_output import PrepOutput  # pylint: disable=g-import-not-at-top

  data = make_data(workdir, s["noc_images"], s["noc_size"], seed=2)
  prep = os.path.join(workdir, "noc_prep")
  run_pipeline(data, prep, s["size"], 1, eval_percent=100, max_error_fraction=1.0)
  out, k = {}, s["noc_clicks"]
  for name, predictor in (
    ("baseline", clicker.baseline_logits),
    ("model", source_eval.ServedPredictor(model_dir)),
  ):
    args = (PrepOutput(prep), {name: predictor}, k, protocol.NOC_IOU_THRESHOLDS, clicker.PRED_THR)
    source_eval.run(*args, max_objects=1)  # Warm-up: first calls; the timed run traces once.
    t = time.perf_counter()
    rows, _ = source_eval.run(*args)
    seconds = time.perf_counter() - t
    out[f"noc.{name}_object_clicks_s"] = len(rows) * k / seconds
    out[f"noc.{name}_seconds"] = seconds
  side = s["noc_size"]
  mask = tf.constant(np.random.default_rng(0).random((1, side, side)) < 0.9)
  clicker.edt_squared(mask)
  t = time.perf_counter()
  for _ in range(4):
    clicker.edt_squared(mask).numpy()
  edt = (time.perf_counter() - t) / 4
  out["noc.objects"] = len(rows)
  out["noc.edt_share_of_baseline"] = 2 * len(rows) * k * edt / out["noc.baseline_seconds"]
  log(
    f"NoC at source resolution ({s['noc_size']} px): baseline "
    f"{out['noc.baseline_object_clicks_s']:.1f} object-clicks/s (distance transforms "
    f"{100 * out['noc.edt_share_of_baseline']:.0f}% of it), model "
    f"{out['noc.model_object_clicks_s']:.1f} object-clicks/s"
  )
  return out
