"""The benchmark at tiny sizes, so that it keeps working (no timing assertions).

`make test` measures each group in this process on the session's records and
model; the whole command (its fresh-process scaling runs, targets, table and
plot) runs in `make test-all`.
"""

import json
import math
import os
import subprocess
import sys

import pytest

from benchmarks.clicks import bench_clicks
from benchmarks.input import bench_input
from benchmarks.labels import bench_labels
from benchmarks.noc import bench_noc_source
from benchmarks.prep import bench_prep
from benchmarks.run import SETTINGS, STORAGE_ROWS, TARGETS
from benchmarks.serve import bench_serve
from benchmarks.storage import bench_storage
from benchmarks.training import bench_train
from tests.helpers import ROOT

FIGURES = (
  "input.on_the_fly_img_s",
  "input.precomputed_img_s",
  "input.read_ceiling_img_s",
  "train.synthetic_steps_s",
  "train.real_steps_s",
  "train.input_wait_fraction",
  "prep.kernel_objects_s",
  "prep.beam_objects_s",
  "clicks.ms_per_sample",
  "clicks.reference_ms_per_sample",
  "prep.peak_rss_mb.N",
  "prep.peak_rss_mb.16N",
  "prep.kernel_objects_s.16N",
  "prep.two_workers_speedup",
  "serve.latency_ms_p50",
  "serve.latency_ms_p95",
  "serve.rest_latency_ms_p50",
  "serve.rest_latency_ms_p95",
  "serve.rest_vs_saved_model",
  "serve.page_latency_ms_p50",
  "serve.page_latency_ms_p95",
  "serve.bad_5xx",
  "serve.bad_max_ms",
  "serve.bad_rss_after_vs_before",
  "serve.encoded_latency_ms_p50",
  "serve.encoded_rest_latency_ms_p50",
  "serve.encoded_rest_latency_ms_p95",
  "serve.encoded_rest_vs_saved_model",
  "noc.baseline_object_clicks_s",
  "noc.model_object_clicks_s",
  "labels.save_ms_p50",
  "labels.save_ms_p95",
  "labels.save_full_vs_empty",
)


# Measured only by the fresh-process runs of `bench_scaling`.
SCALING = ("prep.peak_rss_mb.N", "prep.peak_rss_mb.16N", "prep.kernel_objects_s.16N")
SCALING += ("prep.two_workers_speedup",)


def test_each_group_measures_its_figures(sample_dir, prep_dir, trained, tmp_path):
  s = SETTINGS["tiny"]
  work = str(tmp_path)
  figures = bench_clicks(s["click_repeats"])
  figures.update(bench_prep(sample_dir, os.path.join(work, "prep"), s))
  figures.update(bench_input(prep_dir, s["batch"], s["batches"], s["repeats"]))
  figures.update(
    bench_train(prep_dir, s["batch"], s["train_steps"], s["repeats"], s["width"], s["depth"])
  )
  figures.update(bench_storage(sample_dir, work, s))
  figures.update(bench_serve(trained, s["serve_repeats"]))
  figures.update(bench_noc_source(work, trained, s))
  figures.update(bench_labels(work, s["labels_fill"], s["serve_repeats"]))
  for name in set(FIGURES) - set(SCALING):
    value = figures[name]
    assert math.isfinite(value) and value >= 0, (name, value)
  for layout, _ in STORAGE_ROWS:
    assert figures[f"storage.{layout}.bytes_per_example"] > 0
  assert figures["labels.fill"] == s["labels_fill"]


@pytest.mark.slow
def test_benchmark_reports_every_figure(tmp_path):
  out, plot = str(tmp_path / "b.json"), str(tmp_path / "b.png")
  r = subprocess.run(
    [sys.executable, "-m", "benchmarks", "--tiny", "--json", out, "--plot", plot],
    capture_output=True,
    text=True,
    timeout=900,
    cwd=ROOT,
  )
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  result = json.load(open(out))
  for name in FIGURES:
    value = result["figures"][name]
    assert math.isfinite(value) and value >= 0, (name, value)
    assert f"`{name}`" in r.stdout  # in the printed table
  # At tiny sizes the two runs' times are within noise: the slope may be
  # undefined (NaN, reported as such), never a made-up number.
  marginal = result["figures"]["prep.beam_marginal_objects_s"]
  assert math.isnan(marginal) or marginal > 0
  for layout, _ in STORAGE_ROWS:
    for figure in ("bytes_per_example", "examples_s_per_core", "write_ms_per_example"):
      assert result["figures"][f"storage.{layout}.{figure}"] > 0
    assert f"`storage.{layout}`" in r.stdout
  # Stacking stores fewer bytes per (object, variant) than the layout before.
  before = result["figures"]["storage.variant.bytes_per_example"]
  assert result["figures"]["storage.object_raw.bytes_per_example"] < before
  assert result["figures"]["storage.object.bytes_per_example"] < before
  pairs = result["figures"]["prep.beam_marginal_vs_kernel_pairs"]
  assert len(pairs) == SETTINGS["tiny"]["pairs"] >= 1
  assert set(result["targets"]) == set(TARGETS)
  assert result["figures"]["labels.fill"] == SETTINGS["tiny"]["labels_fill"]
  assert result["environment"]["cores"] >= 1 and "tensorflow" in result["environment"]["versions"]
  assert os.path.getsize(plot) > 1000


@pytest.mark.parametrize("argv", [["--real-steps", "5"], ["--portable-objects", "5"]])
def test_a_groups_flag_without_the_group_is_refused(argv, capsys):
  from benchmarks import run  # pylint: disable=g-import-not-at-top

  with pytest.raises(SystemExit) as e:  # Not the default benchmark with the flag unused.
    run.main(argv)
  assert e.value.code == 2 and f"{argv[0]} needs --" in capsys.readouterr().err
