"""What the training sides of the tasks share: the base class, the model's
arguments and the check of a model's output."""

import dataclasses
from typing import Any, Dict, List

import tensorflow as tf

from train.config import TrainConfig
from train.models import BUILTIN_ARGS


@dataclasses.dataclass(frozen=True)
class NoFitOptions:
  """The `beam-train fit` options of a task that has none of its own."""


class TrainingTask:
  """The training side of a task (subclass it and register the subclass under
  the task's name with `train.tasks.register_trainer`).

  Attributes:
    options: frozen dataclass of the task's own `beam-train fit` settings
      (`option` fields are flags; `TrainConfig.task_options` holds them).
    server: the serving module's class (`train.export.servers`).
    evaluators: what the task evaluates besides the eval metrics ("noc").
  """

  options = NoFitOptions
  server = None
  evaluators = ()
  default_model = ""

  def iterate(self, model, inputs, labels):
    """The training step's inputs after the task's no-gradient rounds (none: as they are)."""
    del model, labels
    return inputs

  def end_evaluations(self) -> Dict[str, str]:
    """{metrics key: name} of what `evaluate_end` runs after `fit`'s eval metrics
    (as this run's options ask)."""
    return {}

  def evaluate_end(self, model, prep, model_dir: str, log_dir: str, step: int) -> Dict[str, Any]:
    """Runs `end_evaluations` -> their metrics.json entries."""
    del model, prep, model_dir, log_dir, step
    return {}

  @staticmethod
  def summary_lines(metrics: Dict[str, Any], model_dir: str) -> List[str]:
    """What `beam-train fit` says of the run's metrics.json."""
    raise NotImplementedError


def fit_options(task_cls, settings: Dict[str, Any]):
  """`task_cls.options` from `TrainConfig.task_options` (the keys it has)."""
  names = {f.name for f in dataclasses.fields(task_cls.options)}
  return task_cls.options(**{k: v for k, v in settings.items() if k in names})


def model_spec(task, config: TrainConfig) -> Dict[str, Any]:
  return {
    "name": config.model or task.default_model,
    "input_channels": task.table.input_channels,
    "image_size": list(task.image_size),
    "model_args": dict(config.model_args),
    "builtin": {k: getattr(config, k) for k in BUILTIN_ARGS},
  }


def check_output(model, name: str, channels: int, image_size, want, what: str) -> None:
  """Runs `model` on one zero input of the records' shape and checks its output."""
  h, w = image_size
  try:
    out = model(tf.zeros([1, h, w, channels]), training=False)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(
      f"model {name!r} cannot take the records' input [B, {h}, {w}, {channels}]"
      f" (features.json's model inputs): {type(e).__name__}: {e}"
    ) from None
  if not hasattr(out, "shape"):
    raise ValueError(f"model {name!r} returns {type(out).__name__}, not one tensor")
  got = tuple(out.shape[1:])
  if got != tuple(want):
    raise ValueError(
      f"model {name!r} maps [1, {h}, {w}, {channels}] to {[1, *got]}; this task needs {what}"
    )
