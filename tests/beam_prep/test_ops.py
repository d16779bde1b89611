"""The heavy ops on small numpy arrays, without Beam or TensorFlow."""

import numpy as np
import pytest
from scipy import ndimage

from beam_prep import keys
from beam_prep.ops import registry
from beam_prep.ops.clicks import ObjectGeometry, example_rng, sample_clicks
from beam_prep.ops.distance import distance_map, distance_maps
from beam_prep.ops.disks import disk_map
from beam_prep.ops.image import IMAGE, nearest_indices, resize_image


def _edt_reference(clicks_xy, h, w):
  grid = np.ones((h, w), bool)
  grid[clicks_xy[:, 1], clicks_xy[:, 0]] = False
  return np.minimum(np.rint(ndimage.distance_transform_edt(grid)), 255).astype(np.uint8)


@pytest.mark.parametrize("h,w,n", [(64, 64, 1), (50, 83, 7), (300, 40, 3), (512, 512, 12)])
def test_distance_map_matches_scipy_edt(h, w, n):
  rng = np.random.default_rng(h * w + n)
  clicks = np.stack([rng.integers(0, w, n), rng.integers(0, h, n)], axis=1)
  np.testing.assert_array_equal(distance_map(clicks, h, w), _edt_reference(clicks, h, w))


def test_distance_map_empty_and_corner_clicks():
  assert (distance_map(np.zeros((0, 2), int), 20, 30) == 255).all()
  got = distance_map(np.array([[0, 0], [29, 19]]), 20, 30)
  assert got[0, 0] == 0 and got[19, 29] == 0
  assert got.dtype == np.uint8 and got.shape == (20, 30)
  maps = distance_maps(np.array([[5, 5]]), np.zeros((0, 2), int), 20, 30)
  assert maps.shape == (20, 30, 2) and (maps[..., 1] == 255).all() and maps[5, 5, 0] == 0


def test_distance_map_caps_at_255():
  got = distance_map(np.array([[0, 0]]), 400, 400)
  assert got.max() == 255 and got[0, 254] == 254 and got[0, 399] == 255


def _scene():
  inst = np.zeros((120, 160), np.uint8)
  inst[20:80, 20:70] = 1  # a box
  inst[60:110, 90:150] = 2  # another object
  inst[19, 20:70] = keys.IGNORE  # VOC-style ignore band
  return inst


def test_sample_clicks_respects_the_paper_constraints():
  inst = _scene()
  mask = np.where(inst == 1, 1, np.where(inst == keys.IGNORE, keys.IGNORE, 0)).astype(np.uint8)
  op = sample_clicks(variants=6, seed=1)
  out = op({"image_id": "s", "object_id": 1, "mask": mask, "instance_mask": inst})
  assert len(out) == 6 and [o["variant"] for o in out] == list(range(6))
  inside = ndimage.distance_transform_edt(np.pad(mask == 1, 1))[1:-1, 1:-1]
  outside = ndimage.distance_transform_edt(mask != 1)
  strategies = set()
  for o in out:
    pos, neg = o["positive_clicks"], o["negative_clicks"]
    assert 1 <= len(pos) <= 5
    for x, y in pos:
      assert mask[y, x] == 1 and inside[y, x] >= 5
    d = np.sqrt(((pos[:, None] - pos[None]) ** 2).sum(-1)) + np.eye(len(pos)) * 99
    assert d.min() >= 10
    s = o["negative_strategy"]
    strategies.add(s)
    for x, y in neg:
      assert mask[y, x] == 0 and outside[y, x] >= 5
      if s == 1:
        assert outside[y, x] <= 40 and inst[y, x] == 0
      if s == 2:
        assert inst[y, x] == 2
    assert len(neg) == {1: 10, 2: 5, 3: 10}[s]
  assert strategies <= {1, 2, 3}


def test_sample_clicks_is_deterministic_and_variants_differ():
  inst = _scene()
  mask = (inst == 1).astype(np.uint8)
  ex = {"image_id": "s", "object_id": 1, "mask": mask, "instance_mask": inst}
  a = sample_clicks(variants=3, seed=7)(ex)
  b = sample_clicks(variants=3, seed=7)(ex)
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x["positive_clicks"], y["positive_clicks"])
    np.testing.assert_array_equal(x["negative_clicks"], y["negative_clicks"])
  assert not all(np.array_equal(a[0]["negative_clicks"], v["negative_clicks"]) for v in a[1:])
  # The generator depends only on its arguments.
  assert example_rng(7, "s", 1, 0).integers(1 << 30) == example_rng(7, "s", 1, 0).integers(1 << 30)


def test_object_too_small_is_an_example_error():
  mask = np.zeros((50, 50), np.uint8)
  mask[10:14, 10:14] = 1  # Thinner than the margin: clicked at its deepest pixels.
  pos, margin = ObjectGeometry(mask, None, 40, 5).sample_positive(3, 10, np.random.default_rng(0))
  assert margin == 2.0 and pos.shape == (1, 2)
  mask[10:14, 10:14] = 0  # No pixel left at the records' size.
  with pytest.raises(registry.ExampleError) as e:
    ObjectGeometry(mask, None, 40, 5)
  assert e.value.reason == "object_too_small"


def test_positive_pixels_drawn_are_exactly_the_interior_ones():
  rng = np.random.default_rng(4)
  mask = np.zeros((60, 70), np.uint8)
  mask[5:40, 3:50] = 1
  mask[20:25, 10:60] = 0  # a thin gap: interior pixels hug it
  geometry = ObjectGeometry(mask, None, 40, 5)
  pool = {tuple(p) for p in geometry.positive_pool()}
  inside = ndimage.distance_transform_edt(np.pad(mask == 1, 1))[1:-1, 1:-1]
  assert pool == {tuple(p) for p in np.argwhere(inside >= 5)}
  for _ in range(200):
    p = np.array([rng.integers(60), rng.integers(70)])
    assert geometry.interior(p) == (tuple(p) in pool)


def test_resize_identity_and_nearest():
  img = np.random.default_rng(0).integers(0, 256, (20, 30, 3), dtype=np.uint8)
  np.testing.assert_array_equal(resize_image(img, 20, 30), img)
  assert resize_image(img, 10, 40).shape == (10, 40, 3)
  assert nearest_indices(4, 2).tolist() == [1, 3]


def test_chain_parsing_fanout_and_failures():
  specs = registry.parse_chain("resize(8)|split_objects|sample_clicks(variants=2, seed=3)")
  assert [s.name for s in specs] == ["resize", "split_objects", "sample_clicks"]
  assert specs[2].kwargs == (("variants", 2), ("seed", 3))
  with pytest.raises(ValueError, match="literals"):
    registry.parse_chain("resize(open('x'))")
  with pytest.raises(ValueError, match="unknown op"):
    registry.build_chain("no_such_op")

  inst = np.zeros((64, 64), np.uint8)
  inst[5:45, 5:45] = 1
  inst[50:53, 50:53] = 2  # thinner than the click margin: clicked at its centre
  areas = np.zeros(256, np.int64)
  areas[[1, 2, 3]] = (1600, 9, 1)  # 3 was measured at the source; no pixel of it is left
  apply = registry.build_chain("split_objects|sample_clicks(variants=2)|distance_maps")
  outputs, failures = apply(
    {
      "image_id": "a",
      "image": np.zeros((64, 64, 3), np.uint8),
      "instance_mask": inst,
      "source_areas": areas,
    }
  )
  assert [(o["object_id"], o["variant"]) for o in outputs] == [(1, 0), (1, 1), (2, 0), (2, 1)]
  assert outputs[2]["positive_clicks"].tolist() == [[51, 51]]
  assert [(f.stage, f.reason, f.example["object_id"]) for f in failures] == [
    ("sample_clicks", "object_too_small", 3)
  ]
  assert outputs[0]["distance_maps"].shape == (64, 64, 2)


def test_user_registered_op_runs_in_a_chain():
  with registry.temporary_ops():

    @registry.register_op("test_invert", produces={"image": IMAGE})
    def _invert():
      def fn(ex):
        out = dict(ex)
        out["image"] = 255 - ex["image"]
        return out

      return fn

    apply = registry.build_chain("test_invert")
    outputs, failures = apply({"image": np.zeros((2, 2, 3), np.uint8)})
    assert not failures and (outputs[0]["image"] == 255).all()
    assert "test_invert" in registry.registered_ops()
    with pytest.raises(ValueError, match="already registered"):
      registry.register_op("test_invert")(lambda: None)


def test_builtin_ops_register_themselves_on_first_use():
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top

  code = "from beam_prep.ops import registry\nprint(' '.join(registry.registered_ops()))\n"
  out = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
  ).stdout.split()
  for name in (
    "decode",
    "resize",
    "split_objects",
    "sample_clicks",
    "distance_maps",
    "click_disks",
  ):
    assert name in out


@pytest.mark.parametrize("radius", [1, 2.5, 5, 12])
def test_click_disks_equal_a_distance_transform_threshold(radius):
  rng = np.random.default_rng(int(radius * 10))
  clicks = np.stack([rng.integers(0, 50, 4), rng.integers(0, 30, 4)], 1)
  grid = np.ones((30, 50), bool)
  grid[clicks[:, 1], clicks[:, 0]] = False
  want = (ndimage.distance_transform_edt(grid) <= radius).astype(np.uint8)
  np.testing.assert_array_equal(disk_map(clicks, 30, 50, radius), want)
  assert disk_map(np.zeros((0, 2)), 30, 50, radius).sum() == 0


def test_flip_variants_mirrors_odd_variants_with_their_clicks():
  from beam_prep import keys  # pylint: disable=g-import-not-at-top

  apply = registry.build_chain("split_objects|sample_clicks(variants=4, seed=2)|flip_variants")
  inst = np.zeros((40, 50), np.uint8)
  inst[5:30, 3:25] = 1
  image = np.random.default_rng(0).integers(0, 255, (40, 50, 3)).astype(np.uint8)
  outs, failures = apply({"image_id": "a", "image": image, "instance_mask": inst})
  assert not failures and [o["flipped"] for o in outs] == [0, 1, 0, 1]
  plain = registry.build_chain("split_objects|sample_clicks(variants=4, seed=2)")(
    {"image_id": "a", "image": image, "instance_mask": inst}
  )[0]
  for out, base in zip(outs, plain):
    if out["flipped"]:
      np.testing.assert_array_equal(out["image"], base["image"][:, ::-1])
      np.testing.assert_array_equal(out["mask"], base["mask"][:, ::-1])
      want = base[keys.POSITIVE_CLICKS].copy()
      want[:, 0] = 49 - want[:, 0]
      np.testing.assert_array_equal(out[keys.POSITIVE_CLICKS], want)
    else:
      np.testing.assert_array_equal(out["image"], base["image"])
    x, y = out[keys.POSITIVE_CLICKS][:, 0], out[keys.POSITIVE_CLICKS][:, 1]
    assert (out["mask"][y, x] == 1).all()  # clicks follow the (flipped) object


def _sized_scene():
  """Objects of 1600, 900, 144, 16 and 2 pixels in a 120 x 240 scene."""
  inst = np.zeros((120, 240), np.uint8)
  inst[10:50, 10:50] = 1
  inst[60:90, 100:130] = 2
  inst[20:32, 150:162] = 3
  inst[100:104, 200:204] = 4
  inst[70, 20:22] = 5
  return inst


def test_min_area_is_measured_before_the_resize():
  inst = _sized_scene()
  image = np.zeros(inst.shape + (3,), np.uint8)
  apply = registry.build_chain("object_areas|resize(60)|split_objects|require_min_area(500)")
  outputs, failures = apply({"image_id": "a", "image": image, "instance_mask": inst})
  assert sorted(o["object_id"] for o in outputs) == [1, 2]
  # At a quarter of the size the 2-pixel object is gone from the mask, yet
  # it is listed (measured at the source) and fails with its source area.
  assert 5 not in np.unique(outputs[0][keys.INSTANCE_MASK])
  got = {f.example["object_id"]: (f.reason, f.detail) for f in failures}
  assert set(got) == {3, 4, 5}
  for object_id, area in ((3, 144), (4, 16), (5, 2)):
    reason, detail = got[object_id]
    assert reason == "object_below_min_area"
    assert f"covers {area} pixels at the source resolution" in detail and "500" in detail
  # Without the measurement, split_objects lists what the resized mask holds.
  plain, _ = registry.build_chain("resize(60)|split_objects")(
    {"image_id": "a", "image": image, "instance_mask": inst}
  )
  assert 5 not in [o["object_id"] for o in plain]


def test_min_area_without_the_measurement_is_refused_before_the_job():
  from beam_prep.features import FeatureError  # pylint: disable=g-import-not-at-top

  specs = registry.parse_chain("decode|resize(64)|split_objects|require_min_area(10)")
  with pytest.raises(FeatureError, match="op 'require_min_area' reads 'source_areas'"):
    registry.check_chain(specs, ["image_id", "image_bytes", "instance_mask"], "the test layout")
  registry.check_chain(
    registry.parse_chain("decode|object_areas|resize(64)|split_objects|require_min_area(10)"),
    ["image_id", "image_bytes", "instance_mask"],
    "the test layout",
  )


def test_click_counts_drawn_as_ritm_draws_them():
  """prob_gamma g: low + k clicks with probability proportional to g^k; 0: uniform."""
  from beam_prep.ops.clicks import click_count  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(0)
  counts = np.bincount([click_count(rng, 1, 24, 0.8) for _ in range(20000)], minlength=25)[1:]
  want = 0.8 ** np.arange(24)
  np.testing.assert_allclose(counts / counts.sum(), want / want.sum(), atol=0.01)
  assert counts[0] > counts[4] > counts[12] > 0
  # 0 draws exactly what the uniform draw did, so default records are unchanged.
  a, b = np.random.default_rng(3), np.random.default_rng(3)
  assert [click_count(a, 1, 5, 0.0) for _ in range(50)] == [
    int(b.integers(1, 6)) for _ in range(50)
  ]


def test_prob_gamma_varies_both_click_counts():
  inst = _scene()
  mask = (inst == 1).astype(np.uint8)
  ex = {"image_id": "s", "object_id": 1, "mask": mask, "instance_mask": inst}
  out = sample_clicks(variants=200, seed=1, max_positive=24, prob_gamma=0.8, strategies=(1, 3))(ex)
  pos = [len(o["positive_clicks"]) for o in out]
  neg = [len(o["negative_clicks"]) for o in out]
  assert min(pos) == 1 and max(pos) > 5 and min(neg) < 10 and len(set(neg)) > 3
  assert pos.count(1) > pos.count(5)
  with pytest.raises(ValueError, match="prob_gamma"):
    sample_clicks(prob_gamma=1.5)


def test_protocol_share_gives_that_share_of_variants_the_protocols_clicks():
  """protocol_share s: each variant takes the protocol's clicks with
  probability s (with protocol_clicks 1: the protocol's first click alone,
  the case a model is measured from); 0: the draw among the strategies,
  unchanged; out of range or without strategy 4: refused, naming it."""
  from beam_prep.ops.clicks import PROTOCOL, protocol_clicks  # pylint: disable=g-import-not-at-top

  inst = _scene()
  mask = (inst == 1).astype(np.uint8)
  ex = {"image_id": "s", "object_id": 1, "mask": mask, "instance_mask": inst}
  first_pos, first_neg = protocol_clicks(mask, 1)
  kw = {"variants": 400, "seed": 2, "strategies": (1, 2, 3, 4), "protocol_clicks": 1}
  out = sample_clicks(protocol_share=0.6, **kw)(ex)
  protocol = [o for o in out if o["negative_strategy"] == PROTOCOL]
  assert 0.53 < len(protocol) / len(out) < 0.67, len(protocol)
  for o in protocol:
    np.testing.assert_array_equal(o["positive_clicks"], first_pos)
    np.testing.assert_array_equal(o["negative_clicks"], first_neg)
  assert {o["negative_strategy"] for o in out} - {PROTOCOL} <= {1, 2, 3}
  every = sample_clicks(protocol_share=1.0, **kw)(ex)
  assert all(o["negative_strategy"] == PROTOCOL for o in every)
  # 0: the variants records were made with before the share existed.
  drawn = sample_clicks(**kw)(ex)
  assert 0.15 < sum(o["negative_strategy"] == PROTOCOL for o in drawn) / len(drawn) < 0.35
  with pytest.raises(ValueError, match="protocol_share must be in"):
    sample_clicks(protocol_share=1.5)
  with pytest.raises(ValueError, match="needs strategy 4"):
    sample_clicks(protocol_share=0.5, strategies=(1, 2, 3))


def test_the_field_preset_draws_up_to_24_clicks_and_the_default_chain_is_unchanged():
  from beam_prep import kit  # pylint: disable=g-import-not-at-top
  from beam_prep.config import PrepConfig  # pylint: disable=g-import-not-at-top

  field = PrepConfig.from_dict({"input": "x", "output": "y", **kit.preset(PrepConfig, "field")})
  spec = next(s for s in registry.parse_chain(field.chain) if s.name == "sample_clicks")
  assert dict(spec.kwargs)["max_positive"] == 24 and dict(spec.kwargs)["prob_gamma"] == 0.8
  plain = PrepConfig.from_dict({"input": "x", "output": "y"})
  assert "prob_gamma" not in plain.chain
