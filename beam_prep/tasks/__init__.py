"""The built-in tasks; importing this package registers them (see `registry`)."""

from beam_prep.tasks import classification, segmentation  # noqa: F401  pylint: disable=unused-import
from beam_prep.tasks.registry import (Stage, Task, fields_of_other_tasks, get_task,  # noqa: F401
                                      register_task, task_names)
