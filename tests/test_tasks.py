"""Tasks on both sides: the chains a config makes, and the trainer's task by features.json."""

import pytest

from beam_prep import tasks
from beam_prep.config import PrepConfig
from beam_prep.ops import registry


@pytest.mark.parametrize("encoding,ops", [
    ("distance", ["distance_maps"]), ("disks", ["click_disks"]),
    ("both", ["distance_maps", "click_disks"])])
def test_click_encoding_chooses_the_encoding_ops(encoding, ops):
  registry.import_ops_modules("tests.fixtures.edge_ops")
  config = PrepConfig(input="x", output="y", click_encoding=encoding, ops="edges",
                      ops_module="tests.fixtures.edge_ops")
  labels = [label for label, _ in config.stages]
  assert labels == ["DecodeExamples", "SampleClicks", "EncodeClicks"]
  last = [s.name for s in registry.parse_chain(config.stages[-1][1])]
  assert last == ops + ["edges"]
  registry.build_chain(config.chain)  # every op exists, every argument is a literal


def test_click_settings_reach_the_chain_text():
  config = PrepConfig(input="x", output="y", variants=3, seed=7)
  spec = registry.parse_chain(config.stages[1][1])[0]
  assert spec.name == "sample_clicks" and dict(spec.kwargs)["variants"] == 3
  assert dict(spec.kwargs)["seed"] == 7


def test_classification_chain_and_error_levels():
  config = PrepConfig(input="x", output="y", task="classification")
  assert [s.name for s in registry.parse_chain(config.chain)] == [
      "decode", "resize", "require_label"]
  task = tasks.get("classification")
  assert task.image_level("require_label", config) and task.records_per_unit(config) == 1
  seg = PrepConfig(input="x", output="y", variants=3)
  assert tasks.get("segmentation").image_level("resize", seg)
  assert not tasks.get("segmentation").image_level("sample_clicks", seg)
  assert tasks.get("segmentation").records_per_unit(seg) == 3
  with pytest.raises(ValueError, match="task must be one of"):
    tasks.get("detection")
