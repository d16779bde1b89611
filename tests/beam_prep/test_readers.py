"""Every input layout and option of the pipelines, run for real on the DirectRunner."""

import os

import numpy as np
import tensorflow as tf
import tensorflow_transform as tft
from PIL import Image

from beam_prep import keys
from beam_prep.features import FeatureTable
from beam_prep.ops.image import voc_palette
from beam_prep.record_codec import RecordCodec
from tests.helpers import dead_letters, manifest, png, records, run_cli, scene


def _voc(root):
  """Pascal VOC's lists and files, and what CVAT's "Segmentation mask"
  export adds: a list of its own name (default.txt) naming an image in a
  folder, saved as PNG, its mask painted with VOC's palette in RGB."""
  for d in ("JPEGImages/sub", "SegmentationObject/sub", "ImageSets/Segmentation"):
    os.makedirs(root / d, exist_ok=True)
  ids = {"train": ["2007_000001", "2007_000002"], "val": ["2007_000003"]}
  for split, names in ids.items():
    _voc_list(root, split, names)
    for name in names:
      img, inst = scene(48, ((5, 5, 30, 30), (28, 28, 46, 46)))
      Image.fromarray(img).save(root / "JPEGImages" / f"{name}.jpg", quality=95)
      (root / "SegmentationObject" / f"{name}.png").write_bytes(png(inst, "L"))
  _voc_list(root, "trainval", ids["train"] + ids["val"])  # VOC's union of the two: no new image.
  _voc_list(
    root, "Validation", ["2007_000002"]
  )  # In train.txt too: evaluated, so never trained on.
  img, inst = scene(48, ((3, 3, 20, 40), (25, 25, 45, 45)))
  (root / "JPEGImages/sub/frame_1.png").write_bytes(png(img))
  (root / "SegmentationObject/sub/frame_1.png").write_bytes(png(voc_palette()[inst]))
  Image.fromarray(img).save(root / "JPEGImages/sub/frame_0.jpg")  # A frame CVAT left unlabelled:
  _voc_list(root, "default", ["sub/frame_0", "sub/frame_1"])  # first in its list, yet read.
  Image.fromarray(img).save(root / "JPEGImages/2008_000100.jpg")  # VOC's test: no mask.
  _voc_list(root, "test", ["2008_000100"])
  # Listed but missing: must reach the dead letters.
  with open(root / "ImageSets/Segmentation/val.txt", "a") as f:
    f.write("2007_999999\n")
  return {"train": ["2007_000001"], "eval": ["2007_000002", "2007_000003"]}


def _voc_list(root, name, ids):
  (root / "ImageSets/Segmentation" / f"{name}.txt").write_text("\n".join(ids) + "\n")


def test_voc_layout_keeps_its_splits(tmp_path):
  ids = _voc(tmp_path / "voc")
  out = str(tmp_path / "out")
  argv = ["segmentation", "--input", str(tmp_path / "voc"), "--output", out]
  assert run_cli(argv + ["--image-size", "32", "--variants", "1"]) == 0
  m = manifest(out)
  assert m["config"]["layout"] == "voc"
  c = m["counts"]
  assert c["errors_by_reason"] == {"missing_image": 1, "missing_mask": 1, "unlabelled_list": 1}, c
  assert c["inputs_read"] == 7 and c["images_failed"] == 3, c
  objects = {}
  for split in ("train", "eval"):
    for r in records(out, split):
      image_id = r.features.feature["image_id"].bytes_list.value[0].decode()
      objects.setdefault((split, image_id), set()).add(
        r.features.feature["object_id"].int64_list.value[0]
      )
  cvat = [key for key in objects if key[1] == "sub/frame_1"]
  assert len(cvat) == 1 and objects.pop(cvat[0]) == {1, 2}  # Split by --eval-percent.
  assert sorted(objects) == sorted((split, i) for split, names in ids.items() for i in names)
  sources = sorted(d["source"] for d in dead_letters(out))
  assert sources[0].endswith("test.txt") and sources[1].endswith("2007_999999.jpg")
  assert sources[2].endswith("sub/frame_0.jpg"), sources


def test_classification_from_class_folders(tmp_path):
  root = tmp_path / "classes"
  rng = np.random.default_rng(0)
  counts = {"drusen": 5, "normal": 3, "cnv": 2}
  for label, n in counts.items():
    (root / label).mkdir(parents=True)
    for i in range(n):
      (root / label / f"img{i}.png").write_bytes(
        png(rng.integers(0, 255, (20, 24), dtype=np.uint8), "L")
      )  # grey: converted
  (root / "normal" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
  out = str(tmp_path / "out")
  assert (
    run_cli(
      [
        "classification",
        "--input",
        str(root),
        "--output",
        out,
        "--image-size",
        "16",
        "--eval-percent",
        "0",
      ]
    )
    == 0
  )
  c = manifest(out)["counts"]
  assert c["inputs_read"] == 11 and c["images_failed"] == 1
  assert c["examples_written"] == {"train": 10, "eval": 0} and c["accounted"]
  recs = records(out, "train")
  labels = sorted(r.features.feature["label"].bytes_list.value[0].decode() for r in recs)
  assert labels == sorted(sum(([k] * v for k, v in counts.items()), []))
  tft_out = tft.TFTransformOutput(os.path.join(out, "transform"))
  # Full-pass vocabulary, most frequent first.
  assert tft_out.vocabulary_by_name(keys.LABEL_VOCABULARY) == [b"drusen", b"normal", b"cnv"]
  parsed = tf.io.parse_example([r.SerializeToString() for r in recs], tft_out.raw_feature_spec())
  t = tft_out.transform_raw_features(parsed)
  assert t["image"].shape[1:] == (16, 16, 3)
  got = dict(
    zip([label.decode() for label in parsed["label"].numpy()], t["label"].numpy().tolist())
  )
  assert got == {"drusen": 0, "normal": 1, "cnv": 2}


def test_manifest_csv_and_jsonl_with_escapes_refused(tmp_path):
  data = tmp_path / "data"
  (data / "imgs").mkdir(parents=True)
  img, inst = scene(40)
  (data / "imgs" / "a.png").write_bytes(png(img))
  (data / "imgs" / "a_mask.png").write_bytes(png(inst, "L"))
  (tmp_path / "secret.png").write_bytes(png(img))
  (data / "list.csv").write_text(
    "image,mask,split\nimgs/a.png,imgs/a_mask.png,eval\n../secret.png,imgs/a_mask.png,train\n"
  )
  out = str(tmp_path / "out_csv")
  assert (
    run_cli(
      [
        "segmentation",
        "--input",
        str(data / "list.csv"),
        "--output",
        out,
        "--image-size",
        "32",
        "--variants",
        "1",
      ]
    )
    == 0
  )
  c = manifest(out)["counts"]
  assert c["errors_by_reason"] == {"path_outside_root": 1}
  assert c["examples_written"] == {"train": 0, "eval": 1}
  (data / "list.jsonl").write_text(
    '{"image": "imgs/a.png", "mask": "imgs/a_mask.png"}\n{not json\n{"mask": "x.png"}\n'
  )
  out = str(tmp_path / "out_jsonl")
  assert (
    run_cli(
      [
        "segmentation",
        "--input",
        str(data / "list.jsonl"),
        "--output",
        out,
        "--image-size",
        "32",
        "--variants",
        "1",
        "--eval-percent",
        "0",
        "--max-error-fraction",
        "1",
      ]
    )
    == 0
  )
  c = manifest(out)["counts"]
  assert c["errors_by_reason"] == {"bad_manifest_row": 2}
  assert c["inputs_read"] == 3 and c["examples_written"]["train"] == 1


def _folders(root, n=3):
  (root / "images").mkdir(parents=True)
  (root / "masks").mkdir()
  for i in range(n):
    img, inst = scene(48, ((4 + i, 4, 30, 34), (30, 30, 46, 46)))
    (root / "images" / f"s{i}.png").write_bytes(png(img))
    (root / "masks" / f"s{i}.png").write_bytes(png(inst, "L"))


def test_user_op_gzip_and_flipped_variants(tmp_path):
  _folders(tmp_path / "d")
  out = str(tmp_path / "out")
  assert (
    run_cli(
      [
        "segmentation",
        "--input",
        str(tmp_path / "d"),
        "--output",
        out,
        "--image-size",
        "48",
        "--variants",
        "2",
        "--flip-variants",
        "--compression",
        "gzip",
        "--eval-percent",
        "0",
        "--ops-module",
        "tests.fixtures.user_ops",
        "--ops",
        "cap_distance(64)",
      ]
    )
    == 0
  )
  assert "train-00000-of-00001.tfrecord.gz" in os.listdir(os.path.join(out, "records"))
  table = FeatureTable.load(out)
  # Flipping runs per variant, so each variant keeps its own (mirrored) image.
  assert table[keys.IMAGE].stacked and not table[keys.IMAGE_ID].stacked
  examples = [
    ex
    for r in records(out, "train")
    for ex in RecordCodec(table).decode_examples(r.SerializeToString())
  ]
  assert len(examples) == manifest(out)["counts"]["examples_written"]["train"] == 12
  for ex in examples:
    assert ex["distance_maps"].max() <= 64  # the user's op ran inside the pipeline
    assert ex[keys.FLIPPED] == ex[keys.VARIANT] % 2
    mask = ex[keys.MASK][..., 0]
    assert all(mask[y, x] == 1 for x, y in ex[keys.POSITIVE_CLICKS])  # clicks follow the mask
  obj1 = [ex for ex in examples if ex[keys.OBJECT_ID] == 1 and ex[keys.IMAGE_ID] == "s0"]
  masks = {int(ex[keys.FLIPPED]): ex[keys.MASK][..., 0] for ex in obj1}
  np.testing.assert_array_equal(masks[1], masks[0][:, ::-1])


def test_min_object_area_is_measured_at_the_source(tmp_path):
  """A 2:1 image with objects of 1600, 900, 144, 16 and 2 pixels, records at a
  half its size: the three under 500 source pixels are dead letters
  with their areas, the 2-pixel one too although the resize erased it."""
  data = tmp_path / "d"
  (data / "images").mkdir(parents=True)
  (data / "masks").mkdir()
  inst = np.zeros((120, 240), np.uint8)
  for i, (y0, x0, y1, x1) in enumerate(
    (
      (10, 10, 50, 50),
      (60, 100, 90, 130),
      (20, 150, 32, 162),
      (100, 200, 104, 204),
      (70, 20, 71, 22),
    ),
    start=1,
  ):
    inst[y0:y1, x0:x1] = i
  img = np.where(inst[..., None] > 0, 220, 60).astype(np.uint8).repeat(3, -1)
  (data / "images" / "a.png").write_bytes(png(img))
  (data / "masks" / "a.png").write_bytes(png(inst, "L"))
  out = str(tmp_path / "out")
  assert (
    run_cli(
      [
        "segmentation",
        "--input",
        str(data),
        "--output",
        out,
        "--image-size",
        "120",
        "--variants",
        "1",
        "--min-object-area",
        "500",
        "--eval-percent",
        "0",
        "--max-error-fraction",
        "1",
      ]
    )
    == 0
  )
  m = manifest(out)
  c = m["counts"]
  assert m["config"]["min_object_area"] == 500
  assert (c["objects_found"], c["objects_failed"]) == (5, 3) and c["accounted"]
  assert c["errors_by_reason"] == {"object_below_min_area": 3}
  letters = {d["object_id"]: d for d in dead_letters(out)}
  assert sorted(letters) == [3, 4, 5]
  for object_id, area in ((3, 144), (4, 16), (5, 2)):
    assert f"covers {area} pixels at the source resolution" in letters[object_id]["detail"]
  assert sorted(r.features.feature[keys.OBJECT_ID].int64_list.value[0] for r in records(out)) == [
    1,
    2,
  ]


def test_folders_say_which_files_they_do_not_read(tmp_path, capsys):
  from beam_prep.layouts import folders  # pylint: disable=g-import-not-at-top
  from pipelines import logs  # pylint: disable=g-import-not-at-top

  img, inst = scene(24, ((3, 3, 12, 12),))
  for path, data in (
    ("images/a.png", png(img)),
    ("masks/a.png", png(inst, "L")),
    ("images/sub/b.png", png(img)),  # In a folder under images/: not read.
    ("masks/c.png", png(inst, "L")),  # No image c: not read.
    ("masks/.DS_Store", b""),
  ):
    (tmp_path / "r" / path).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "r" / path).write_bytes(data)
  root = str(tmp_path / "r")
  nested, orphans = folders.unread(root)
  assert nested == [os.path.join(root, "images", "sub", "b.png")]
  assert orphans == [os.path.join(root, "masks", "c.png")]
  logs.quiet()  # The command's console lines, as a job prints them.
  folders.Folders().check_input(folders.ReadOptions(root))
  said = capsys.readouterr().out
  assert "1 not read, files in folders under" in said and "sub/b.png" in said, said
  assert "1 not read, masks with no image of their name" in said and "masks/c.png" in said
  os.remove(os.path.join(root, "images", "a.png"))  # Only nested images: refused, saying where.
  assert run_cli(["segmentation", "--input", root, "--output", str(tmp_path / "o")]) == 2
  assert "the 1 files are in folders under it" in capsys.readouterr().out
  os.remove(os.path.join(root, "images", "sub", "b.png"))  # No image at all: refused too.
  assert run_cli(["segmentation", "--input", root, "--output", str(tmp_path / "o")]) == 2
  assert "no image matches" in capsys.readouterr().out
