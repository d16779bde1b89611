"""The built-in tasks; importing this package registers them (see `registry`)."""

from beam_prep.tasks import classification, segmentation  # noqa: F401  pylint: disable=unused-import
from beam_prep.tasks.registry import Stage, Task, get_task, register_task, task_names  # noqa: F401
