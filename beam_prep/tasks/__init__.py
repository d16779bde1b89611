"""The built-in tasks; importing this package registers them (see `registry`)."""

from beam_prep.tasks import classification, segmentation  # noqa: F401  pylint: disable=unused-import
from beam_prep.tasks.registry import (
  NoOptions,
  Stage,
  Task,
  get_task,
  register_task,  # noqa: F401
  task_names,
)
