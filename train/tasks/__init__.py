"""The training sides of the tasks, one module each (`segmentation`,
`classification`), on `base.TrainingTask`.

A task is declared once, by its module in `beam_prep.tasks`; its training
side registers itself under the task's name (`register_trainer`), and the
modules here are imported with this package. An instance is built from the prep output's
`features.json` (its `task` field),
the tf.Transform output and the run's `TrainConfig.task_options`. It names the
raw features the transform reads and those evaluation needs, builds the model
(input channels from the declared model inputs), turns transformed features
into labels, gives the per-example loss, turns eval batches into per-example
counts that `summarize` reduces to metrics, runs its evaluations at the end of
`fit` and says what `fit` prints of them.
"""

from typing import Dict, List

import tensorflow_transform as tft

from beam_prep import tasks as prep_tasks
from beam_prep.features import FeatureTable
from train.config import TASK_OPTIONS

_TRAINERS: Dict[str, type] = {}


def register_trainer(task_name: str):
  """Class decorator: the class is the training side of the task `task_name`
  (declared in `beam_prep.tasks`); its `options` become `beam-train fit` flags."""

  def register(cls):
    _TRAINERS[task_name] = cls
    if cls.options not in TASK_OPTIONS:
      TASK_OPTIONS.append(cls.options)
    return cls

  return register


def task_class(name: str):
  """The training side of the task named `name` (features.json's `task`)."""
  prep_tasks.get_task(name)  # An unknown task is named as such.
  if name not in _TRAINERS:
    raise ValueError(
      f"task {name!r} has no training side: register one with "
      f"@train.tasks.register_trainer({name!r}) on its class, in a module "
      "imported before training"
    )
  return _TRAINERS[name]


def make_task(table: FeatureTable, tft_output: tft.TFTransformOutput, settings=None):
  """The task named by features.json, for this run (`settings`: `TrainConfig.task_options`)."""
  return task_class(table.task)(table, tft_output, settings or {})


def option_classes() -> List[type]:
  """The `beam-train fit` options of every registered task's training side."""
  return list(TASK_OPTIONS)


# The built-in training sides register themselves.
from train.tasks import classification, segmentation  # pylint: disable=wrong-import-position,unused-import  # noqa: E402,F401
