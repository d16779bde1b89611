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
