"""A registry of tasks: what a kind of model learns from the inputs.

A task module declares, once, everything that differs between tasks: which
input labels it needs (instance masks or class names), the op stages of its
Beam job and the level each stage works at and how many records a unit
yields; its training side (`train.tasks`) registers itself under its name.
It registers an instance with `register_task`; nothing outside the task
modules compares task names.

    @register_task
    class Segmentation(Task):
      name = "segmentation"
      ...

This module is a leaf: it knows no task. The built-in tasks register
themselves when `beam_prep.tasks` is imported.
"""

import dataclasses
from typing import Dict, List

# Levels of the job's stages, in order: a stage's level is what its input
# example is. Failures are counted at the level of the stage they happen in.
INPUT, OBJECT, EXAMPLE = "input", "object", "example"
LEVELS = (INPUT, OBJECT, EXAMPLE)

_TASKS: Dict[str, "Task"] = {}


@dataclasses.dataclass(frozen=True)
class Stage:
  """One stage of the job: a Beam label, an op chain, the level of its input.

  `source`: the example after this stage is the input decoded at its own
  size (`image`, `instance_mask`); for eval inputs the kernel also writes it
  as a source record (`beam_prep.source_records`).
  """

  label: str
  chain: str
  level: str
  source: bool = False

  def __post_init__(self):
    if self.level not in LEVELS:
      raise ValueError(f"stage {self.label}: level must be one of {LEVELS}, got {self.level!r}")


@dataclasses.dataclass(frozen=True)
class NoOptions:
  """The options of a task that has none of its own."""

  @classmethod
  def from_dict(cls, d: Dict[str, object]) -> "NoOptions":
    if d:
      raise ValueError(f"unknown settings of this task: {sorted(d)}")
    return cls()


class Task:
  """What a task module declares (subclass it and register an instance).

  Attributes:
    name: the command and the `task` recorded in features.json.
    summary: one line for `--help`.
    labels: what an input must give: "instances" (an instance mask) or
      "classes" (a class name); input layouts that give it are offered.
    options: the frozen dataclass of the settings only this task has
      (`PrepConfig.options` holds one; each of its `option` fields is a flag
      of the task's command alone).

  Its training side (labels, loss and metrics, serving signatures and
  evaluators) registers itself under `name` in `train.tasks`
  (`register_trainer`); the Beam job never imports it.
  """

  name = ""
  summary = ""
  labels = ""
  options = NoOptions

  def stages(self, config) -> List[Stage]:
    """The job's stages, in level order (an input stage first)."""
    raise NotImplementedError

  def examples_per_unit(self, config) -> int:
    """Records each used unit yields (an object, or an image without objects)."""
    raise NotImplementedError

  def add_arguments(self, parser) -> None:
    """Adds options of its own that are not plain `PrepConfig` fields."""

  def config_fields(self, args) -> Dict[str, object]:
    """Config settings from the options `add_arguments` added (None: not given)."""
    del args
    return {}

  @property
  def one_label_per_image(self) -> bool:
    """Whether an image has one label (a class name): the same image read
    again under another id with another label (moved to another class's
    folder) is that image relabelled, not a new one. An image with
    instances may be read twice with other objects (a second object of it)."""
    return self.labels == "classes"

  def splits_objects(self, config) -> bool:
    """Whether an image fans out into objects counted on their own."""
    return any(s.level == OBJECT for s in self.stages(config))


def register_task(cls):
  """Registers a `Task` subclass (decorator); returns the class."""
  task = cls()
  if not task.name.isidentifier():
    raise ValueError(f"task name {task.name!r} is not an identifier")
  existing = _TASKS.get(task.name)
  if existing is not None and type(existing).__qualname__ != cls.__qualname__:
    raise ValueError(f"task {task.name!r} is already registered by {type(existing).__qualname__}")
  _TASKS[task.name] = task
  return cls


def get_task(name: str) -> Task:
  """The registered task `name`.

  Raises:
    ValueError: no such task, naming the registered ones.
  """
  try:
    return _TASKS[name]
  except KeyError:
    raise ValueError(f"task must be one of {task_names()}, got {name!r}") from None


def task_names() -> List[str]:
  return sorted(_TASKS)
