"""The data engine benchmark at tiny sizes, so that it keeps working: two
rounds on the sample data, every figure of its JSON present (no timing
assertions)."""

import json
import math
import subprocess
import sys

from tests.helpers import ROOT

ROUND_FIELDS = (
  "round",
  "objects",
  "clicks_per_object",
  "frozen_clicks_per_object",
  "label_iou",
  "iou_at_1",
  "frozen_iou_at_1",
  "retrain_seconds",
  "version",
)


def test_engine_benchmark_reports_every_round(sample_dir, trained, tmp_path):
  out = tmp_path / "engine.json"
  r = subprocess.run(
    [
      sys.executable,
      "-m",
      "benchmarks",
      "--engine",
      sample_dir,
      "--engine-base",
      trained,
      "--engine-rounds",
      "2",
      "--engine-objects",
      "1",
      "--engine-steps",
      "1",
      "--engine-minutes",
      "0",
      "--workdir",
      str(tmp_path / "work"),
      "--json",
      str(out),
    ],
    capture_output=True,
    text=True,
    timeout=900,
    cwd=ROOT,
  )
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  result = json.load(open(out))
  first, second = result["rounds"]
  for entry in (first, second):
    assert set(ROUND_FIELDS) <= set(entry) and entry["objects"] == 1
    assert 1 <= entry["clicks_per_object"] <= 20 and 1 <= entry["frozen_clicks_per_object"] <= 20
    assert 0 <= entry["label_iou"] <= 1 and 0 <= entry["iou_at_1"] <= 1
  # Round 1 is the base model's own labelling: the frozen pass is the same model.
  assert first["clicks_per_object"] == first["frozen_clicks_per_object"]
  assert first["retrain_seconds"] is None and second["retrain_seconds"] > 0
  assert second["version"] > first["version"]  # Labelled by the model the round published.
  idle = result["latency_ms"]["idle"]
  assert idle["clicks"] > 0 and math.isfinite(idle["p95"])
  assert "| 2 | 1 |" in r.stdout
