"""Tasks on both sides: the chains a config makes, and the trainer's task by features.json."""

import pytest

from beam_prep import tasks
from beam_prep.config import PrepConfig
from beam_prep.ops import registry


@pytest.mark.parametrize(
  "encoding,ops",
  [
    ("distance", ["distance_maps"]),
    ("disks", ["click_disks"]),
    ("both", ["distance_maps", "click_disks"]),
  ],
)
def test_click_encoding_chooses_the_encoding_ops(encoding, ops):
  registry.import_ops_modules("tests.fixtures.edge_ops")
  config = PrepConfig.from_dict(
    dict(
      input="x",
      output="y",
      click_encoding=encoding,
      ops="edges",
      ops_module="tests.fixtures.edge_ops",
    )
  )
  assert [s.label for s in config.stages] == [
    "DecodeExamples",
    "SplitObjects",
    "SampleClicks",
    "EncodeClicks",
  ]
  assert [s.level for s in config.stages] == ["input", "input", "object", "example"]
  last = [s.name for s in registry.parse_chain(config.stages[-1].chain)]
  assert last == ops + ["edges"]
  registry.build_chain(config.chain)  # every op exists, every argument is a literal


def test_click_settings_reach_the_chain_text():
  config = PrepConfig.from_dict(dict(input="x", output="y", variants=3, seed=7))
  stage = next(s for s in config.stages if s.label == "SampleClicks")
  spec = registry.parse_chain(stage.chain)[0]
  assert spec.name == "sample_clicks" and dict(spec.kwargs)["variants"] == 3
  assert dict(spec.kwargs)["seed"] == 7


def test_classification_chain_and_error_levels():
  config = PrepConfig(input="x", output="y", task="classification")
  assert [s.name for s in registry.parse_chain(config.chain)] == [
    "decode",
    "resize",
    "require_label",
  ]
  task = tasks.get_task("classification")
  assert [s.level for s in config.stages] == ["input", "example"]
  assert task.examples_per_unit(config) == 1 and not task.splits_objects(config)
  seg = PrepConfig.from_dict(dict(input="x", output="y", variants=3))
  assert tasks.get_task("segmentation").examples_per_unit(seg) == 3
  assert tasks.get_task("segmentation").splits_objects(seg)
  with pytest.raises(ValueError, match="task must be one of"):
    tasks.get_task("detection")


def test_the_training_side_is_found_through_the_task_declaration():
  """beam-train finds a task's training class by the one declaration of the
  task (its `trainer`); a task without one, or an unknown name, is refused."""
  from beam_prep.tasks import registry as task_registry  # pylint: disable=g-import-not-at-top
  from train import tasks as train_tasks  # pylint: disable=g-import-not-at-top
  from train.tasks.classification import ClassificationTask  # pylint: disable=g-import-not-at-top
  from train.tasks.segmentation import SegmentationTask  # pylint: disable=g-import-not-at-top

  assert train_tasks.task_class("segmentation") is SegmentationTask
  assert train_tasks.task_class("classification") is ClassificationTask

  @task_registry.register_task
  class Untrained(task_registry.Task):  # pylint: disable=unused-variable
    name = "untrained_test_task"
    labels = "instances"

  try:
    with pytest.raises(
      ValueError, match=r"'untrained_test_task' has no training side: .*register_trainer"
    ):
      train_tasks.task_class("untrained_test_task")
  finally:
    task_registry._TASKS.pop("untrained_test_task")  # pylint: disable=protected-access
  with pytest.raises(ValueError, match="task must be one of"):
    train_tasks.task_class("depth")


def test_the_segmentation_options_are_the_tasks_own_and_default_to_the_ops():
  """PrepConfig holds no segmentation setting; the options' defaults are the ops' own."""
  import dataclasses
  import inspect
  from beam_prep.tasks.segmentation import ClickConfig, SegmentationOptions

  shared = {f.name for f in dataclasses.fields(PrepConfig)}
  assert not shared & {f.name for f in dataclasses.fields(SegmentationOptions)}
  clicks = inspect.signature(registry.op_entry("sample_clicks").factory).parameters
  for f in dataclasses.fields(ClickConfig):
    if f.name in clicks:
      assert f.default == clicks[f.name].default, f.name
  crop = inspect.signature(registry.op_entry("crop_objects").factory).parameters
  assert SegmentationOptions.crop_context == crop["context"].default
  assert SegmentationOptions.crop_min_size == crop["min_side"].default
  # Flat in a dict (config files, config.json), sorted out by the task.
  config = PrepConfig.from_dict({"input": "x", "output": "y", "variants": 4, "clicks": {"d": 30}})
  assert config.options.variants == 4 and config.options.clicks.d == 30
  assert PrepConfig.from_dict(config.to_dict()) == config
  with pytest.raises(ValueError, match="unknown config keys: \\['varients'\\]"):
    PrepConfig.from_dict({"input": "x", "output": "y", "varients": 4})
  with pytest.raises(ValueError, match="unknown config keys: \\['variants'\\]"):
    PrepConfig.from_dict({"input": "x", "output": "y", "task": "classification", "variants": 4})
