"""Thin objects: clicked at their most interior pixels instead of failing, and counted.

An object with no pixel `d_margin` from its boundary at the records' size (a
ski, a knife, a tie) gets its positive clicks on its deepest pixels; only an
object with no pixel left at that size fails (`object_too_small`).
"""

import numpy as np
import pytest
from scipy import ndimage

from beam_prep import keys
from beam_prep.ops import registry
from beam_prep.ops.clicks import (
  MARGIN_REDUCED,
  ObjectGeometry,
  example_rng,
  sample_clicks,
  sample_variant,
)
from tests.helpers import dead_letters, examples, manifest, png, run_cli

D_MARGIN = 5


def _inside(obj):
  return ndimage.distance_transform_edt(np.pad(obj, 1))[1:-1, 1:-1]


def _diagonal_bar(size=128, start=20, stop=108, half_width=1):
  """A bar along the diagonal, 2 * half_width + 1 pixels wide along each row."""
  yy, xx = np.mgrid[:size, :size]
  return (np.abs(yy - xx) <= half_width) & (yy >= start) & (yy < stop)


def _scene_with_bar(size=128):
  """Instance ids: 1 the diagonal bar, 2 a thick box off it."""
  inst = np.zeros((size, size), np.uint8)
  inst[_diagonal_bar(size)] = 1
  inst[8:40, 70:120] = 2
  return inst


def _object(inst, object_id, image_id="thin"):
  return {
    keys.IMAGE_ID: image_id,
    keys.OBJECT_ID: object_id,
    keys.MASK: (inst == object_id).astype(np.uint8),
    keys.INSTANCE_MASK: inst,
  }


def _check_clicks(variant, inst, object_id):
  obj = inst == object_id
  deepest = _inside(obj)
  pos, neg = variant[keys.POSITIVE_CLICKS], variant[keys.NEGATIVE_CLICKS]
  assert pos.shape[0] >= 1
  for x, y in pos:
    assert obj[y, x] and deepest[y, x] == deepest.max()
  outside = ndimage.distance_transform_edt(~obj)
  for x, y in neg:
    assert not obj[y, x] and outside[y, x] >= D_MARGIN


def test_the_bar_has_no_pixel_the_margin_from_its_boundary():
  assert _inside(_diagonal_bar()).max() < D_MARGIN


@pytest.mark.parametrize("strategy", [1, 2, 3, 4])
def test_a_thin_object_gets_clicks_with_every_strategy(strategy):
  inst = _scene_with_bar()
  variants = sample_clicks(variants=4, seed=3, d_margin=D_MARGIN, strategies=(strategy,))(
    _object(inst, 1)
  )
  assert [v[keys.VARIANT] for v in variants] == [0, 1, 2, 3]
  for v in variants:
    assert v[MARGIN_REDUCED] is True
    assert v[keys.NEGATIVE_STRATEGY] == strategy
    _check_clicks(v, inst, 1)
    if strategy != 4:  # The protocol may stop after its first, positive click.
      assert v[keys.NEGATIVE_CLICKS].shape[0] >= 1


def test_a_thin_object_gets_several_spaced_positive_clicks():
  inst = _scene_with_bar()
  variants = sample_clicks(
    variants=8, seed=0, d_margin=D_MARGIN, d_step=10, min_positive=5, max_positive=5
  )(_object(inst, 1))
  for v in variants:
    pos = v[keys.POSITIVE_CLICKS]
    assert pos.shape[0] >= 2
    d2 = ((pos[:, None] - pos[None]) ** 2).sum(-1) + 10**2 * np.eye(len(pos))
    assert d2.min() >= 10**2


def test_thin_object_clicks_are_deterministic_and_per_variant():
  inst = _scene_with_bar()
  a = sample_clicks(variants=3, seed=7)(_object(inst, 1))
  b = sample_clicks(variants=3, seed=7)(_object(inst, 1))
  for x, y in zip(a, b):
    for key in (keys.POSITIVE_CLICKS, keys.NEGATIVE_CLICKS):
      np.testing.assert_array_equal(x[key], y[key])
  # A variant's clicks do not depend on the variants sampled before it.
  geometry = ObjectGeometry(_object(inst, 1)[keys.MASK], inst, 40, 5)
  alone = sample_variant(
    geometry,
    example_rng(7, "thin", 1, 2),
    min_positive=1,
    max_positive=5,
    negatives=(10, 5, 10),
    d_step=10,
    strategies=(1, 2, 3),
  )
  for key in (keys.POSITIVE_CLICKS, keys.NEGATIVE_CLICKS, keys.NEGATIVE_STRATEGY):
    np.testing.assert_array_equal(alone[key], a[2][key])
  other = sample_clicks(variants=3, seed=8)(_object(inst, 1))
  assert not all(
    np.array_equal(x[keys.NEGATIVE_CLICKS], y[keys.NEGATIVE_CLICKS]) for x, y in zip(a, other)
  )


def test_an_object_wide_enough_keeps_the_margin_and_is_not_marked():
  inst = _scene_with_bar()
  for v in sample_clicks(variants=3, seed=1, d_margin=D_MARGIN)(_object(inst, 2)):
    assert v[MARGIN_REDUCED] is False
    inside = _inside(inst == 2)
    for x, y in v[keys.POSITIVE_CLICKS]:
      assert inside[y, x] >= D_MARGIN


def test_sample_positive_reports_the_margin_it_kept():
  mask = np.zeros((50, 50), np.uint8)
  mask[10:14, 10:14] = 1  # 4 x 4: its deepest pixels are 2 px from its boundary
  pos, margin = ObjectGeometry(mask, None, 40, D_MARGIN).sample_positive(
    3, 10, np.random.default_rng(0)
  )
  assert margin == 2.0 and pos.shape[0] == 1
  assert tuple(pos[0]) in {(11, 11), (11, 12), (12, 11), (12, 12)}
  mask[20:40, 20:40] = 1
  _, margin = ObjectGeometry(mask, None, 40, D_MARGIN).sample_positive(
    3, 10, np.random.default_rng(0)
  )
  assert margin == D_MARGIN


def test_an_object_with_no_pixel_at_the_records_size_fails():
  mask = np.zeros((64, 64), np.uint8)
  mask[:2, :2] = keys.IGNORE
  with pytest.raises(registry.ExampleError) as e:
    sample_clicks()({keys.IMAGE_ID: "gone", keys.OBJECT_ID: 1, keys.MASK: mask})
  assert e.value.reason == "object_too_small"
  assert "no pixel of the object is left at the records' size (64x64)" in e.value.detail


def _data(root):
  """a: 128 px, the diagonal bar (1) and a box (2). b: 512 px, a box (1) and
  a line one pixel wide (2) that its crop, resized to 128 px, misses."""
  (root / "images").mkdir(parents=True)
  (root / "masks").mkdir()
  a = _scene_with_bar()
  b = np.zeros((512, 512), np.uint8)
  b[50:200, 20:200] = 1
  b[50:450, 300] = 2
  for name, inst in (("a", a), ("b", b)):
    img = np.where(inst[..., None] > 0, 210, 60).astype(np.uint8).repeat(3, -1)
    (root / "images" / f"{name}.png").write_bytes(png(img))
    (root / "masks" / f"{name}.png").write_bytes(png(inst, "L"))


def test_the_job_writes_thin_objects_and_counts_them(tmp_path, capsys):
  data, out = tmp_path / "d", str(tmp_path / "out")
  _data(data)
  assert (
    run_cli(
      [
        "segmentation",
        "--input",
        str(data),
        "--output",
        out,
        "--image-size",
        "128",
        "--variants",
        "2",
        "--eval-percent",
        "0",
      ]
    )
    == 0
  )
  printed = capsys.readouterr().out
  c = manifest(out)["counts"]
  assert (c["objects_found"], c["objects_used"], c["objects_failed"]) == (4, 3, 1)
  assert c["objects_margin_reduced"] == 1 and c["accounted"]
  assert c["errors_by_reason"] == {"object_too_small": 1}
  assert "1 thinner than the click margin" in printed
  [letter] = dead_letters(out)
  assert (letter["image_id"], letter["object_id"]) == ("b", 2)
  assert "no pixel of the object is left at the records' size" in letter["detail"]
  bar = [
    e
    for e in examples(out, keys.TRAIN_SPLIT)
    if (e[keys.IMAGE_ID], int(e[keys.OBJECT_ID])) == ("a", 1)
  ]
  assert len(bar) == 2
  for e in bar:
    mask = e[keys.MASK][..., 0]
    pos, neg = e[keys.POSITIVE_CLICKS], e[keys.NEGATIVE_CLICKS]
    assert pos.shape[0] >= 1 and all(mask[y, x] == 1 for x, y in pos)
    assert all(mask[y, x] != 1 for x, y in neg)
