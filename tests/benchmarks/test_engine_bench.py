"""The data engine benchmark at tiny sizes, so that it keeps working: two
rounds on the sample data, every figure of its JSON present (no timing
assertions). Its round between the two is a real `--engine-*` round of the
server it runs (`train.serve.rounds`): what that round read and published is
checked here too."""

import dataclasses
import json
import math
import os

import pytest

from beam_prep import keys
from benchmarks import run as bench
from train import engine

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


def test_engine_benchmark_reports_every_round(sample_dir, trained, tmp_path, capsys):
  out, work = tmp_path / "engine.json", tmp_path / "work"
  argv = ["--engine", sample_dir, "--engine-base", trained, "--engine-rounds", "2"]
  argv += ["--engine-objects", "1", "--engine-steps", "1", "--engine-minutes", "0"]
  argv += ["--engine-lr-scale", "0.5", "--workdir", str(work), "--json", str(out)]
  with pytest.raises(SystemExit) as e:
    bench.main(argv)
  printed = capsys.readouterr().out
  assert e.value.code == 0, printed[-3000:]
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
  assert "| 2 | 1 |" in printed
  _check_the_round(str(work / "served"), str(work / "labels"), second["version"])


def _check_the_round(served: str, labels: str, version: int) -> None:
  """The round read the label saved with the served model's transform, at
  the learning rate --engine-lr-scale asked, and published the version
  that labelled round 2; with fewer labels since than --min-new, no round runs."""
  (done,) = engine.rounds(os.path.join(labels, engine.ENGINE_DIR))
  assert done["version"] == version and done["from"] == served
  assert done["images"] == done["new_images"] == 1
  with open(os.path.join(done["model_dir"], keys.MODEL_CONFIG_FILE)) as f:
    round_config = json.load(f)
  with open(os.path.join(served, keys.MODEL_CONFIG_FILE)) as f:
    assert round_config["learning_rate"] == json.load(f)["learning_rate"] * 0.5
  assert round_config["warmup_steps"] == _default("warmup_steps")  # Serve's, then the engine's.
  with open(os.path.join(round_config["data"], keys.CONFIG_FILE)) as f:
    assert json.load(f)["transform_from"] == served
  log = _Log()
  config = engine.EngineConfig(labels=labels, model=served, min_new=2)  # Round 2's one label.
  assert engine.run_round(config, log) is None, log.lines
  assert "1 image(s) labelled since the last round (--min-new 2): no round" in log.lines[-1]


def _default(name: str):
  return next(f.default for f in dataclasses.fields(engine.EngineConfig) if f.name == name)


class _Log:
  def __init__(self):
    self.lines = []

  def info(self, fmt, *args):
    self.lines.append(fmt % args)
