"""Every op's TensorFlow twin against the op itself, on the same example.

Parametrized over every registered op that has a twin, the built-in ones and
those of the user modules in tests/fixtures: a new op with a twin and no case
here fails `test_every_op_with_a_twin_has_a_case`.
"""

import numpy as np
import pytest
import tensorflow as tf

from beam_prep import keys
from beam_prep.ops import registry
from beam_prep.ops.distance import distance_maps as np_distance_maps, tf_distance_map
from beam_prep.ops.image import IMAGE_PAD, fitted_size, resize_image, resize_nearest
from tests.helpers import png, scene

USER_MODULES = "tests.fixtures.user_ops,tests.fixtures.edge_ops"
registry.import_ops_modules(USER_MODULES)


def _object_example(size=64):
  """An object of a scene at the records' size, after the chain's click sampling."""
  img, inst = scene(80, ((6, 10, 40, 50), (45, 45, 75, 78)))
  chain = registry.build_chain(f"decode|resize({size})|split_objects|sample_clicks(seed=3)")
  outs, failures = chain({"image_id": "x", "image_bytes": png(img), "mask_bytes": png(inst, "L")})
  assert outs and not failures
  return outs[0]


def _encoded_example(height=40, width=40):
  img, inst = scene(max(height, width), ((4, 4, 30, 30),))
  img, inst = img[:height, :width], inst[:height, :width]
  return {"image_id": "x", "image_bytes": png(img), "mask_bytes": png(inst, "L")}


def _decoded_example(height=40, width=40):
  return registry.build_op(registry.parse_chain("decode")[0])(_encoded_example(height, width))


def _crop_request(call, height=40, width=40):
  """A decoded scene with the box the op gives its first object and a click:
  what the serving graph receives."""
  ex = _decoded_example(height, width)
  first = registry.build_op(registry.parse_chain(call)[0])(ex)[0]
  return dict(ex, crop_box=first[keys.CROP_BOX], positive_clicks=np.array([[10, 10]]))


# op call -> (example builder, tolerance on uint8 levels)
CASES = {
  "decode": (_encoded_example, 0),
  "resize(64)": (_decoded_example, 1),
  "resize(48)": (lambda: _decoded_example(33, 91), 1),  # Wide, odd sizes: padded below.
  "crop_objects(64)": (lambda: _crop_request("crop_objects(64)"), 0),  # magnified, padded
  "crop_objects(16, jitter=1.0, seed=4)": (
    lambda: _crop_request("crop_objects(16, jitter=1.0, seed=4)", 33, 91),
    0,
  ),  # shrunk
  "flip_variants": (_object_example, 0),  # variant 0: not flipped, as at serving time
  "distance_maps": (_object_example, 0),
  "click_disks(radius=5)": (_object_example, 0),
  "click_disks(radius=2.5)": (_object_example, 0),
  "cap_distance(64)": (
    lambda: registry.build_op(registry.parse_chain("distance_maps")[0])(_object_example()),
    0,
  ),
  "edges": (_object_example, 0),
  "prev_mask": (_object_example, 0),
}


def _tensors(ex):
  out = {}
  for k, v in ex.items():
    if isinstance(v, (np.ndarray, bytes)):
      out[k] = tf.constant(v)
  return out


def test_every_op_with_a_twin_has_a_case():
  with_twins = {n for n in registry.registered_ops() if registry.op_entry(n).twin is not None}
  covered = {registry.parse_chain(c)[0].name for c in CASES}
  assert with_twins <= covered, f"no twin test case for {sorted(with_twins - covered)}"


@pytest.mark.parametrize("call", sorted(CASES))
def test_twin_gives_the_ops_model_inputs(call):
  make, tolerance = CASES[call]
  spec = registry.parse_chain(call)[0]
  entry = registry.op_entry(spec.name)
  ex = make()
  out = registry.build_op(spec)(ex)
  want = out[0] if isinstance(out, list) else out
  got = registry.build_twin(spec)(_tensors(ex))
  checked = 0
  for key, feature in entry.produces.items():
    if feature.role != "model_input":
      continue
    g, w = got[key].numpy(), np.asarray(want[key])
    w = w.reshape(g.shape)
    assert g.dtype == w.dtype == np.dtype(feature.dtype), key
    diff = np.abs(g.astype(np.int64) - w.astype(np.int64))
    # resize: the same float32 arithmetic; TensorFlow's kernel may round one
    # level differently on a rare pixel. Every other twin is exact.
    assert diff.max() <= tolerance and (diff > 0).mean() < 0.001, key
    checked += 1
  assert checked, f"{call} produces no model input to compare"


@pytest.mark.parametrize(
  "h,w,n_pos,n_neg",
  [(64, 64, 1, 10), (37, 91, 5, 0), (128, 80, 0, 3), (200, 200, 3, 25), (1, 7, 1, 1)],
)
def test_tf_distance_maps_equal_numpy(h, w, n_pos, n_neg):
  rng = np.random.default_rng(h + w + n_pos)
  pos = np.stack([rng.integers(0, w, n_pos), rng.integers(0, h, n_pos)], 1).reshape(-1, 2)
  neg = np.stack([rng.integers(0, w, n_neg), rng.integers(0, h, n_neg)], 1).reshape(-1, 2)
  if n_neg:
    neg[0] = [w - 1, h - 1]  # Border clicks too.
  want = np_distance_maps(pos, neg, h, w)
  got = tf.stack([tf_distance_map(pos, h, w), tf_distance_map(neg, h, w)], -1)
  np.testing.assert_array_equal(got.numpy(), want)


def test_raw_bytes_equal_numpy_tobytes():
  from train.export.saved_model import to_raw_bytes  # pylint: disable=g-import-not-at-top

  x = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
  assert to_raw_bytes(tf.constant(x)).numpy() == x.tobytes()
  f = np.random.default_rng(1).normal(size=(3, 4, 1)).astype("<f4")
  assert to_raw_bytes(tf.constant(f)).numpy() == f.tobytes()


# Square, both orientations of several aspect ratios, odd sizes, a one-pixel
# row, and a frame that is not square.
RESIZE_CASES = [
  ((64, 64), "resize(64)"),
  ((120, 160), "resize(64)"),
  ((160, 120), "resize(64)"),
  ((37, 200), "resize(64)"),
  ((200, 37), "resize(64)"),
  ((300, 90), "resize(64)"),
  ((90, 300), "resize(64)"),
  ((91, 33), "resize(63)"),
  ((33, 91), "resize(63)"),
  ((65, 63), "resize(64)"),
  ((1, 97), "resize(64)"),
  ((120, 160), "resize(48, 80)"),
  ((160, 120), "resize(48, 80)"),
]


@pytest.mark.parametrize("shape,call", RESIZE_CASES)
def test_tf_resize_matches_the_beam_resize(shape, call):
  img = np.random.default_rng(shape[0] * shape[1]).integers(0, 256, shape + (3,), dtype=np.uint8)
  inst = np.random.default_rng(2).integers(0, 4, shape, dtype=np.uint8)
  spec = registry.parse_chain(call)[0]
  frame = (spec.args[0], spec.args[-1])
  want = registry.build_op(spec)({keys.IMAGE: img, keys.INSTANCE_MASK: inst})
  got = registry.build_twin(spec)({keys.IMAGE: tf.constant(img)})
  g = got[keys.IMAGE].numpy()
  assert g.shape == want[keys.IMAGE].shape == frame + (3,)
  # Same arithmetic; float rounding may differ by one level on a rare pixel.
  assert np.abs(g.astype(int) - want[keys.IMAGE].astype(int)).max() <= 1
  assert (g != want[keys.IMAGE]).mean() < 0.001
  assert (got[keys.HEIGHT].numpy(), got[keys.WIDTH].numpy()) == shape
  assert (want[keys.HEIGHT], want[keys.WIDTH]) == shape
  # The aspect ratio is kept: the limiting side fills the frame, the other
  # is within half a pixel of the source's proportion.
  fit_h, fit_w = (int(v) for v in fitted_size(*shape, *frame))
  scale = min(frame[0] / shape[0], frame[1] / shape[1])
  assert fit_h == frame[0] or fit_w == frame[1]
  assert abs(fit_h - shape[0] * scale) <= 0.5 and abs(fit_w - shape[1] * scale) <= 0.5
  # The image at the top left, resized as a whole; padding around it.
  np.testing.assert_array_equal(want[keys.IMAGE][:fit_h, :fit_w], resize_image(img, fit_h, fit_w))
  np.testing.assert_array_equal(
    want[keys.INSTANCE_MASK][:fit_h, :fit_w], resize_nearest(inst, fit_h, fit_w)
  )
  pad = np.ones(frame, bool)
  pad[:fit_h, :fit_w] = False
  assert (want[keys.IMAGE][pad] == IMAGE_PAD).all() and (g[pad] == IMAGE_PAD).all()
  assert (want[keys.INSTANCE_MASK][pad] == keys.IGNORE).all()


def test_fitted_size_is_the_same_in_tensorflow():
  for shape in [(h, w) for h in (1, 2, 3, 17, 64, 99, 1000, 4321) for w in (1, 5, 64, 333, 7000)]:
    for frame in ((64, 64), (63, 63), (48, 80)):
      want = tuple(int(v) for v in fitted_size(*shape, *frame))
      got = fitted_size(
        tf.constant(shape[0], tf.int64), tf.constant(shape[1], tf.int64), *frame, xp=tf
      )
      assert tuple(int(v) for v in got) == want, (shape, frame)


def test_resize_twin_moves_clicks_to_the_nearest_centre_and_clamps():
  twin = registry.build_twin(registry.parse_chain("resize(64)")[0])
  ex = {
    keys.IMAGE: tf.zeros([64, 64, 3], tf.uint8),
    keys.POSITIVE_CLICKS: tf.constant([[0, 0], [63, 10], [70, -5]], tf.int64),
  }
  assert twin(ex)[keys.POSITIVE_CLICKS].numpy().tolist() == [[0, 0], [63, 10], [63, 0]]
  # 128 x 32 fits as 64 x 16: both axes scale by one half, and clicks stay
  # in the valid region (x < 16), never in the padding.
  ex = {
    keys.IMAGE: tf.zeros([128, 32, 3], tf.uint8),
    keys.POSITIVE_CLICKS: tf.constant([[31, 127], [0, 1], [40, 3], [10, 64]], tf.int64),
  }
  assert twin(ex)[keys.POSITIVE_CLICKS].numpy().tolist() == [[15, 63], [0, 0], [15, 1], [5, 32]]
