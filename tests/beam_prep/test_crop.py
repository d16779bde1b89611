"""Object-centred crops (`beam_prep.ops.crop`): the geometry in numpy and
TensorFlow, the op on scenes, placing predictions back, the job on a
photograph of small objects, and the serving graph against the job's crop
records at the source resolution."""

import glob
import json

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from beam_prep import keys, source_records
from beam_prep.features import FeatureTable
from beam_prep.ops import crop, registry
from beam_prep.ops.serving import ServingSide
from beam_prep.record_codec import RecordCodec
from tests.helpers import manifest, png, run_cli, scene


def _crop_op(call="crop_objects(32)"):
  return registry.build_op(registry.parse_chain(call)[0])


def _scene_example(size=80, boxes=((6, 10, 40, 50), (45, 45, 75, 78))):
  img, inst = scene(size, boxes)
  return {keys.IMAGE_ID: "s", keys.IMAGE: img, keys.INSTANCE_MASK: inst}


@pytest.mark.parametrize("seed", range(4))
def test_the_box_holds_the_object_and_is_the_same_in_tensorflow(seed):
  rng = np.random.default_rng(seed)
  for _ in range(50):
    top, left = (int(v) for v in rng.integers(-20, 500, 2))
    bottom, right = top + int(rng.integers(0, 300)), left + int(rng.integers(0, 300))
    ratio, min_side = crop.context_ratio(float(rng.uniform(0, 2))), int(rng.integers(1, 64))
    y0, x0, side = crop.square_box(top, left, bottom, right, ratio, min_side)
    extent = max(bottom - top + 1, right - left + 1)
    assert side == max(-(-extent * ratio // 1000), min_side)
    assert y0 <= top and bottom < y0 + side and x0 <= left and right < x0 + side
    got = crop.square_box(
      *(tf.constant(v, tf.int64) for v in (top, left, bottom, right)), ratio, min_side, xp=tf
    )
    assert [int(v) for v in got] == [y0, x0, side]


@pytest.mark.parametrize(
  "box", [(-10, 5, 60), (20, -30, 500), (0, 0, 50), (400, 300, 17), (10, 10, 200), (-40, -40, 20)]
)
def test_the_crop_is_the_same_bytes_in_tensorflow(box):
  image = np.random.default_rng(1).integers(0, 256, (300, 400, 3), dtype=np.uint8)
  want = crop.crop_image(image, *box, 48)
  got = crop.crop_image_tf(tf.constant(image), *(tf.constant(v, tf.int64) for v in box), 48)
  np.testing.assert_array_equal(got.numpy(), want)


def test_each_object_is_cut_with_context_and_others_are_background():
  ex = _scene_example()
  outs = _crop_op("crop_objects(32, context=0.4, min_side=8)")(ex)
  assert [o[keys.OBJECT_ID] for o in outs] == [1, 2]
  for o in outs:
    x0, y0, x1, y1 = o[keys.CROP_BOX]
    assert x1 - x0 == y1 - y0
    obj = ex[keys.INSTANCE_MASK] == o[keys.OBJECT_ID]
    ys, xs = np.nonzero(obj)
    extent = max(np.ptp(ys), np.ptp(xs)) + 1
    assert x1 - x0 == -(-extent * 1400 // 1000)  # 1.4x the object's long side
    assert o[keys.IMAGE].shape == (32, 32, 3) and o[keys.MASK].shape == (32, 32)
    mask = o[keys.MASK]
    assert set(np.unique(mask)) <= {0, 1, keys.IGNORE} and (mask == 1).any()
    # The other object shows in the crop's instance mask, as background in the label.
    other = (
      (o[keys.INSTANCE_MASK] != o[keys.OBJECT_ID])
      & (o[keys.INSTANCE_MASK] != 0)
      & (o[keys.INSTANCE_MASK] != keys.IGNORE)
    )
    assert (mask[other] == 0).all()
  # The second object's box reaches past the image: padding is black and ignore.
  last = outs[1]
  assert last[keys.CROP_BOX][2] > 80
  assert (last[keys.MASK][:, -1] == keys.IGNORE).all()
  assert (last[keys.IMAGE][:, -1] == 0).all()


def test_jitter_keeps_the_object_inside_and_follows_the_seed():
  ex = _scene_example()
  boxes = lambda call: [tuple(o[keys.CROP_BOX]) for o in _crop_op(call)(ex)]  # pylint: disable=unnecessary-lambda-assignment
  plain = boxes("crop_objects(32)")
  for seed in range(6):
    jittered = boxes(f"crop_objects(32, jitter=1.0, seed={seed})")
    assert jittered == boxes(f"crop_objects(32, jitter=1.0, seed={seed})")
    for (x0, y0, x1, y1), p, o in zip(jittered, plain, _crop_op()(ex)):
      assert p[2] - p[0] <= x1 - x0 <= 2 * (p[2] - p[0]) + 1
      ys, xs = np.nonzero(ex[keys.INSTANCE_MASK] == o[keys.OBJECT_ID])
      assert y0 <= ys.min() and ys.max() < y1 and x0 <= xs.min() and xs.max() < x1
  assert len({tuple(boxes(f"crop_objects(32, jitter=1.0, seed={s})")) for s in range(6)}) > 1


def test_a_prediction_is_placed_back_where_its_crop_came_from():
  ex = _scene_example()
  for o in _crop_op("crop_objects(64)")(ex):
    truth = ex[keys.INSTANCE_MASK] == o[keys.OBJECT_ID]
    placed = (
      crop.place_back(
        tf.constant((o[keys.MASK] == 1).astype(np.float32)), tf.constant(o[keys.CROP_BOX]), 80, 80
      ).numpy()
      > 0.5
    )
    iou = (placed & truth).sum() / (placed | truth).sum()
    assert iou > 0.9, iou
    x0, y0, x1, y1 = o[keys.CROP_BOX]
    outside = np.ones((80, 80), bool)
    outside[max(y0, 0) : y1, max(x0, 0) : x1] = False
    assert not placed[outside].any()


@pytest.mark.parametrize(
  "box,size", [((3, 7, 103, 107), 48), ((-20, -5, 180, 195), 64), ((10, 10, 74, 74), 64)]
)
def test_clicks_go_back_and_forth_when_the_crop_does_not_magnify(box, size):
  clicks = np.stack(np.meshgrid(np.arange(size), np.arange(size)), -1).reshape(-1, 2)
  source = crop.clicks_to_source(clicks, box, size)
  x0, y0, x1, _ = box
  back = crop.clicks_to_crop(tf.constant(source), x0, y0, x1 - x0, size).numpy()
  np.testing.assert_array_equal(back, clicks)


def _photograph(root, n_objects=30, width=1000, height=872, seed=0):
  """A COCO file of one photograph with small objects (150-900 pixels)."""
  rng = np.random.default_rng(seed)
  image = rng.integers(60, 200, (height, width, 3), dtype=np.uint8)
  annotations, taken = [], np.zeros((height, width), bool)
  while len(annotations) < n_objects:
    area = rng.uniform(150, 900)
    h = int(np.sqrt(area * rng.uniform(0.5, 2)))
    w = int(area / h)
    y, x = int(rng.integers(0, height - h)), int(rng.integers(0, width - w))
    if taken[max(y - 4, 0) : y + h + 4, max(x - 4, 0) : x + w + 4].any():
      continue
    taken[y : y + h, x : x + w] = True
    image[y : y + h, x : x + w] = rng.integers(0, 255, 3)
    poly = [float(v) for v in (x, y, x + w, y, x + w, y + h, x, y + h)]
    annotations.append(
      {
        "id": len(annotations) + 1,
        "image_id": 1,
        "category_id": 1,
        "segmentation": [poly],
        "area": float(w * h),
        "bbox": [x, y, w, h],
        "iscrowd": 0,
      }
    )
  Image.fromarray(image).save(root / "photo.jpg", quality=95)
  (root / "instances.json").write_text(
    json.dumps(
      {
        "images": [{"id": 1, "file_name": "photo.jpg", "height": height, "width": width}],
        "annotations": annotations,
        "categories": [{"id": 1, "name": "thing"}],
      }
    )
  )
  return str(root / "instances.json")


@pytest.mark.parametrize("crop_mode,least", [("object", 0.9), ("none", 0.0)])
def test_small_objects_of_a_photograph_get_records(tmp_path, crop_mode, least):
  coco_json = _photograph(tmp_path)
  out = str(tmp_path / f"out_{crop_mode}")
  code = run_cli(
    [
      "segmentation",
      "--input",
      coco_json,
      "--output",
      out,
      "--layout",
      "coco",
      "--image-size",
      "128",
      "--variants",
      "1",
      "--eval-percent",
      "0",
      "--crop",
      crop_mode,
      "--max-error-fraction",
      "1",
    ]
  )
  counts = manifest(out)["counts"]
  assert counts["objects_found"] == 30
  used = counts["objects_used"] / counts["objects_found"]
  assert code == 0 and used >= least, counts
  if crop_mode == "object":  # Each crop magnifies its object: the click margin fits.
    assert counts["objects_margin_reduced"] == 0, counts
  else:  # The whole photograph at 128 px leaves these objects thinner than the margin.
    assert counts["objects_margin_reduced"] > 0.5 * counts["objects_used"], counts


def test_the_serving_graph_makes_the_records_from_the_source_image(prep_dir):
  """For the job's crop records: given the record's box and its clicks (moved to
  the source), the serving twins give the records' bytes from the source image."""
  from train.export.serving_inputs import run_plan, serving_plan  # pylint: disable=g-import-not-at-top

  table = FeatureTable.load(prep_dir)
  assert keys.CROP_BOX in table
  plan = serving_plan(table)
  size = table.image_size[0]
  sources = {}
  for path in sorted(glob.glob(keys.record_pattern(prep_dir, source_records.SPLIT))):
    for r in tf.data.TFRecordDataset(path):
      src = source_records.decode(r.numpy())
      sources[src[keys.IMAGE_ID]] = src[keys.IMAGE]
  images = encodings = 0
  for path in sorted(glob.glob(keys.record_pattern(prep_dir, keys.EVAL_SPLIT))):
    for serialized in tf.data.TFRecordDataset(path):
      for rec in RecordCodec(table).decode_examples(serialized.numpy()):
        box = rec[keys.CROP_BOX]
        clicks = {
          k: crop.clicks_to_source(rec[k], box, size)
          for k in (keys.POSITIVE_CLICKS, keys.NEGATIVE_CLICKS)
        }
        served = run_plan(
          plan,
          table,
          {
            keys.IMAGE: tf.constant(sources[rec[keys.IMAGE_ID]]),
            keys.CROP_BOX: tf.constant(box),
            **{k: tf.constant(v) for k, v in clicks.items()},
          },
        )
        assert served[keys.IMAGE].numpy() == rec[keys.IMAGE].tobytes()
        images += 1
        back = [
          crop.clicks_to_crop(tf.constant(clicks[k]), box[0], box[1], box[2] - box[0], size).numpy()
          for k in clicks
        ]
        if all(np.array_equal(b, rec[k]) for b, k in zip(back, clicks)):
          for key in table.keys("model_input"):
            assert served[key].numpy() == rec[key].tobytes(), key
          encodings += 1
  assert images and encodings, (images, encodings)


def _colour_model(tmp_path, image, instances, size):
  """Crop records of one image, and a model that marks the red pixels (what the
  objects here are), through the records' own transform -> the server."""
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow_transform as tft  # pylint: disable=g-import-not-at-top
  from tests.helpers import records  # pylint: disable=g-import-not-at-top
  from train.fit.data import Decoder  # pylint: disable=g-import-not-at-top
  from train.export.servers import SegmentationServer  # pylint: disable=g-import-not-at-top
  from train.export.serving_inputs import model_inputs  # pylint: disable=g-import-not-at-top

  for sub, arr, mode in (("images", image, None), ("masks", instances, "L")):
    (tmp_path / "data" / sub).mkdir(parents=True)
    (tmp_path / "data" / sub / "a.png").write_bytes(png(arr, mode))
  out = str(tmp_path / "prep")
  assert (
    run_cli(
      [
        "segmentation",
        "--input",
        str(tmp_path / "data"),
        "--output",
        out,
        "--layout",
        "folders",
        "--image-size",
        str(size),
        "--variants",
        "1",
        "--eval-percent",
        "0",
      ]
    )
    == 0
  )
  table = FeatureTable.load(out)
  transform = tft.TFTransformOutput(f"{out}/{keys.TRANSFORM_DIR}")
  serialized = records(out)[0].SerializeToString()
  raw = Decoder(table, table.keys("model_input")).decode(tf.constant([serialized]), False)
  x = model_inputs(table, transform.transform_raw_features(raw))
  redness = (x[0, ..., 0] - x[0, ..., 1]).numpy()
  label = RecordCodec(table).decode_numpy(serialized)[keys.MASK].reshape(size, size)
  middle = (redness[label == 1].mean() + redness[label == 0].mean()) / 2
  model = keras.Sequential(
    [
      keras.Input((size, size, table.input_channels)),
      keras.layers.Lambda(lambda t: 100.0 * (t[..., 0:1] - t[..., 1:2] - middle)),
    ]
  )
  return SegmentationServer(model, transform, table)


def _red_disks(h, w, disks):
  """An image of red disks (x, y, r) on grey, and its instance mask."""
  yy, xx = np.mgrid[:h, :w]
  image = np.full((h, w, 3), 80, np.uint8)
  instances = np.zeros((h, w), np.uint8)
  for i, (cx, cy, r) in enumerate(disks, 1):
    disk = (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r
    image[disk] = (200, 40, 30)
    instances[disk] = i
  return image, instances


def test_the_region_a_crop_saw_is_its_box_cut_to_the_image():
  """`seen`, where the serving graph refines the probabilities: the crop's
  box (x0, y0, x1, y1, x1 and y1 exclusive) inside the image."""
  side = crop.CropServing(48)
  seen = lambda box, h, w: side.seen({keys.CROP_BOX: tf.constant(box, tf.int64)}, h, w).numpy()  # noqa: E731
  np.testing.assert_array_equal(seen([-10, 5, 90, 105], 50, 80), [0, 5, 80, 50])
  np.testing.assert_array_equal(seen([3, 4, 20, 21], 50, 80), [3, 4, 20, 21])
  whole = ServingSide().seen({}, tf.constant(50), tf.constant(80)).numpy()
  np.testing.assert_array_equal(whole, [0, 0, 80, 50])


def test_a_model_trained_on_crops_is_served_on_the_crop_of_its_object(tmp_path):
  """A wide image, crop records, and a model that marks the object's colour:
  the first click's mask (the whole image seen at the records' size) covers
  the object, the next one (the crop of the previous mask, placed back) fits
  it at the source's size; given a previous mask elsewhere, the crop is the
  box of both and nothing is predicted outside it."""
  h, w, (cx, cy, r) = 90, 270, (200, 45, 14)
  image, instances = _red_disks(h, w, [(cx, cy, r)])
  obj = instances == 1
  server = _colour_model(tmp_path, image, instances, 48)
  click, none = tf.constant([[cx, cy]], tf.int32), tf.zeros([0, 2], tf.int32)
  served = server.serve(tf.constant(image), click, none)["mask"].numpy().astype(bool)
  assert served.shape == (h, w)
  assert (served & obj).sum() / (served | obj).sum() > 0.7  # 378 px seen in 48
  zoomed = (
    server.serve_iterative(tf.constant(image), click, none, tf.constant(served.astype(np.uint8)))[
      "mask"
    ].numpy()
    > 0
  )
  assert (zoomed & obj).sum() / (zoomed | obj).sum() > 0.9
  previous = np.zeros((h, w), np.uint8)
  previous[5:15, 5:15] = 1
  prob = server.serve_iterative(tf.constant(image), click, none, tf.constant(previous))[
    "probabilities"
  ].numpy()
  y0, x0, side = crop.square_box(5, 5, cy, cx, 1400, 32)
  outside = np.ones((h, w), bool)
  outside[max(y0, 0) : y0 + side, max(x0, 0) : x0 + side] = False
  assert outside.any() and (prob[outside] == 0).all() and prob[~outside].max() > 0


def test_the_first_click_sees_the_whole_image_the_next_zoom_in_and_a_box_is_its_crop(tmp_path):
  """No previous mask: the crop is cut around the whole image (RITM's first
  prediction), so an object far from the click's neighbourhood is still in
  view; with a previous mask the crop zooms in on it; a box prompt is cropped
  with its context."""
  image, instances = _red_disks(300, 400, [(100, 80, 6), (290, 190, 70)])
  server = _colour_model(tmp_path, image, instances, 48)
  none = tf.zeros([0, 2], tf.int32)
  click = tf.constant([[290, 190]], tf.int32)
  first = server.serve(tf.constant(image), click, none)
  mask = first["mask"].numpy().astype(bool)
  assert (mask & (instances == 2)).sum() / (instances == 2).sum() > 0.8  # the large disk
  # The colour model sees the small one too, though at 48 px it is one pixel
  # and the guided filter takes it under the threshold: its probabilities
  # stand above the background's.
  first_prob = first["probabilities"].numpy()
  assert first_prob[instances == 1].mean() > 0.3 > np.percentile(first_prob[instances == 0], 99)
  zoomed = server.serve_iterative(
    tf.constant(image), click, none, tf.constant((instances == 2).astype(np.uint8))
  )
  prob = zoomed["probabilities"].numpy()
  assert (prob[instances == 1] == 0).all()  # outside the crop around the previous mask
  obj = instances == 2
  got = zoomed["mask"].numpy().astype(bool)
  assert (got & obj).sum() / (got | obj).sum() > 0.9

  # A box around the small disk: the model sees the box widened, with its
  # context (the whole image at 48 px shows the disk as a pixel),
  # its centre is the click, and nothing outside the box is object.
  box = tf.constant([92, 72, 108, 88], tf.int32)
  out = server.serve_box(tf.constant(image), box, none, none)
  got, small = out["mask"].numpy().astype(bool), instances == 1
  assert (got & small).sum() / (got | small).sum() > 0.7
  inside = np.zeros(got.shape, bool)
  inside[72:89, 92:109] = True
  assert (out["probabilities"].numpy()[~inside] == 0).all()
  centre = tf.constant([[100, 80]], tf.int32)
  same = server.serve_box(tf.constant(image), box, centre, none)["probabilities"]
  np.testing.assert_array_equal(same.numpy(), out["probabilities"].numpy())
  whole = server.serve(tf.constant(image), centre, none)["mask"].numpy().astype(bool)
  assert (whole & small).sum() / (whole | small).sum() < 0.5  # What the box's crop fixes.
