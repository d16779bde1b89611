"""The training sides of the tasks, one module each (`segmentation`,
`classification`), on `base.TrainingTask`.

A task is declared once, by its module in `beam_prep.tasks`; its `trainer`
names its class here ("train.tasks.segmentation:SegmentationTask"). An
instance is built from the prep output's `features.json` (its `task` field),
the tf.Transform output and the run's `TrainConfig.task_options`. It names the
raw features the transform reads and those evaluation needs, builds the model
(input channels from the declared model inputs), turns transformed features
into labels, gives the per-example loss, turns eval batches into per-example
counts that `summarize` reduces to metrics, runs its evaluations at the end of
`fit` and says what `fit` prints of them.
"""

import importlib
from typing import List

import tensorflow_transform as tft

from beam_prep import tasks as prep_tasks
from beam_prep.features import FeatureTable


def task_class(name: str):
  """The training side of the task named `name` (features.json's `task`): the
  class its declaration in `beam_prep.tasks` names as `trainer`."""
  task = prep_tasks.get_task(name)
  module, _, attr = task.trainer.partition(":")
  if not (module and attr):
    raise ValueError(f"task {name!r} declares no training side (its `trainer`, "
                     "'module:Class', is empty)")
  return getattr(importlib.import_module(module), attr)


def make_task(table: FeatureTable, tft_output: tft.TFTransformOutput, settings=None):
  """The task named by features.json, for this run (`settings`: `TrainConfig.task_options`)."""
  return task_class(table.task)(table, tft_output, settings or {})


def option_classes() -> List[type]:
  """The `beam-train fit` options of every registered task's training side."""
  classes = []
  for name in prep_tasks.task_names():
    if not prep_tasks.get_task(name).trainer:
      continue
    options = task_class(name).options
    if options not in classes:
      classes.append(options)
  return classes
