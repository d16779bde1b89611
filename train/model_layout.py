"""The layout of a model directory (`beam-train fit --model-dir`): the run's
settings (`beam_prep.keys.MODEL_CONFIG_FILE`, which beam-prep reads too, to
find the data a model was trained on), checkpoints, TensorBoard logs, the
serving exports (EXPORT_DIR/<version>/), the evaluation reports and the
final metrics.

This module imports nothing.
"""

CHECKPOINTS_DIR = "checkpoints"
TENSORBOARD_DIR = "tensorboard"
EXPORT_DIR = "export"
EVAL_DIR = "eval"
METRICS_FILE = "metrics.json"
NOC_FILE = "noc.json"  # In EVAL_DIR, or `beam-train evaluate --output`.


def threshold_name(t: float) -> str:
  """An IoU threshold as the figures' names write it: 0.85 -> "85"."""
  return f"{round(t * 100):d}"


def noc_key(t: float) -> str:
  """The name of NoC at IoU threshold `t` in noc.json and metrics.json: "noc@85"."""
  return f"noc@{threshold_name(t)}"
