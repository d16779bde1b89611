"""The per-input kernel without Beam: what one input becomes, and its counts."""

import pytest

from beam_prep.config import PrepConfig
from beam_prep.kernel import OP_BUG_AFTER, Kernel, Tally
from beam_prep.ops import registry
from tests.helpers import png, scene


def _kernel(tmp_path, **kw):
  config = PrepConfig.from_dict(
    dict(input=str(tmp_path), output="unused", layout="folders", image_size=48, variants=2, **kw)
  )
  registry.import_ops_modules(config.ops_module)
  return Kernel(config.layout, config.stages, config.ops_module, config.features())


def _pointer(tmp_path, name="a", boxes=((4, 4, 30, 30), (36, 36, 38, 38)), mask=True):
  (tmp_path / "images").mkdir(exist_ok=True)
  (tmp_path / "masks").mkdir(exist_ok=True)
  img, inst = scene(48, boxes)
  (tmp_path / "images" / f"{name}.png").write_bytes(png(img))
  if mask:
    (tmp_path / "masks" / f"{name}.png").write_bytes(png(inst, "L"))
  return {
    "image_id": name,
    "source": str(tmp_path / "images" / f"{name}.png"),
    "mask_source": str(tmp_path / "masks" / f"{name}.png"),
  }


def test_one_input_counts_at_each_level(tmp_path):
  # The 2x2 object is under the minimum area; the 3x3 one is thinner than the click margin.
  boxes = ((4, 4, 30, 30), (36, 36, 38, 38), (40, 4, 43, 7))
  result = _kernel(tmp_path, min_object_area=5).process(_pointer(tmp_path, boxes=boxes))
  c = result.tally.counts
  assert (c["inputs_read"], c.get("images_failed", 0)) == (1, 0)
  assert (c["objects_found"], c["objects_failed"], c["objects_margin_reduced"]) == (3, 1, 1)
  assert (c["examples_made"], c.get("example_errors", 0)) == (4, 0)
  # One record per object: the object once, with its two click variants.
  assert len(result.records) == 2 and result.row is not None
  assert (c["examples/train"], c["records/train"]) == (4, 2)
  acc = result.tally.accounting(per_unit=2, splits_objects=True)
  assert acc["accounted"] and acc["objects_margin_reduced"] == 1
  assert [e["reason"] for e in result.errors] == ["object_below_min_area"]
  assert result.tally.samples["object_below_min_area"]["object_id"] == 2


def test_image_failures_and_listed_objects_are_counted_once(tmp_path):
  kernel = _kernel(tmp_path)
  pointer = dict(_pointer(tmp_path, "b", mask=False), objects_listed=3)
  result = kernel.process(pointer)
  c = result.tally.counts
  assert (c["inputs_read"], c["images_failed"]) == (1, 1)
  assert (c["objects_found"], c["objects_failed"], c["objects_of_failed_images"]) == (3, 3, 3)
  assert [e["reason"] for e in result.errors] == ["missing_mask"]
  gone = kernel.process(
    {
      "image_id": "c",
      "source": str(tmp_path / "nope.png"),
      "mask_source": str(tmp_path / "nope_mask.png"),
    }
  )
  assert [e["reason"] for e in gone.errors] == ["missing_image"]
  total = Tally().merge(result.tally).merge(gone.tally)
  acc = total.accounting(per_unit=2, splits_objects=True)
  assert acc["accounted"] and acc["images_failed"] == 2 and acc["objects_used"] == 0


def test_an_op_bug_stops_after_its_first_examples(tmp_path):
  kernel = _kernel(tmp_path, ops="depth_feature", ops_module="tests.fixtures.bug_ops")
  pointers = [_pointer(tmp_path, f"p{i}", boxes=((4, 4, 30, 30),)) for i in range(OP_BUG_AFTER)]
  with pytest.raises(registry.OpBugError, match="op 'depth_feature' raised KeyError: 'depth'"):
    for pointer in pointers:  # 2 examples per input
      kernel.process(pointer)


def test_classification_counts_images_and_examples(tmp_path):
  (tmp_path / "cat").mkdir()
  img, _ = scene(48)
  (tmp_path / "cat" / "x.png").write_bytes(png(img))
  config = PrepConfig(
    input=str(tmp_path), output="unused", task="classification", layout="classes", image_size=32
  )
  kernel = Kernel(config.layout, config.stages, "", config.features())
  result = kernel.process(
    {"image_id": "cat/x", "source": str(tmp_path / "cat" / "x.png"), "label": "cat"}
  )
  acc = result.tally.accounting(per_unit=1, splits_objects=False)
  assert acc["accounted"] and acc["examples_made"] == 1 and len(result.records) == 1
  assert acc["objects_found"] == 0


def test_min_object_area_dead_letters_small_objects_with_their_source_area(tmp_path):
  boxes = ((2, 2, 42, 42), (44, 44, 47, 47), (2, 44, 4, 46))  # 1600, 9 and 4 pixels.
  kernel = _kernel(tmp_path, min_object_area=10)
  assert any("object_areas|crop_objects(48" in s.chain for s in kernel.stages)
  result = kernel.process(_pointer(tmp_path, boxes=boxes))
  c = result.tally.counts
  assert (c["objects_found"], c["objects_failed"]) == (3, 2)
  details = sorted((e["object_id"], e["reason"], e["detail"]) for e in result.errors)
  assert [(i, r) for i, r, _ in details] == [
    (2, "object_below_min_area"),
    (3, "object_below_min_area"),
  ]
  assert "covers 9 pixels" in details[0][2] and "covers 4 pixels" in details[1][2]
  assert result.tally.accounting(per_unit=2, splits_objects=True)["accounted"]


def test_an_eval_image_keeps_its_source_record_only_when_it_was_used(tmp_path):
  """An eval input that decodes writes its image at its own size once; one
  that fails after decoding (a mask with no object) writes none."""
  from beam_prep import keys, source_records  # pylint: disable=g-import-not-at-top

  kernel = _kernel(tmp_path)
  used = kernel.process(_pointer(tmp_path), keys.EVAL_SPLIT)
  assert used.source is not None and used.tally.counts["examples/source"] == 1
  assert source_records.decode(used.source)["instance_mask"].shape == (48, 48)
  assert kernel.process(_pointer(tmp_path), keys.TRAIN_SPLIT).source is None
  empty = kernel.process(_pointer(tmp_path, "e", boxes=()), keys.EVAL_SPLIT)
  assert empty.tally.counts.get("images_failed") == 1 and empty.source is None
