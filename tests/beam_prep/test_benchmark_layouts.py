"""The benchmark sets' layouts (GrabCut, Berkeley, DAVIS, COCO-MVal, SBD) on
small files written in each set's format, through the real `beam-prep`
CLI with `--layout auto`; and their mask codings against a numpy
transcription of RITM's loaders (`isegm/data/datasets/`)."""

import os

import numpy as np
import pytest
from PIL import Image
from scipy import io as sio

from beam_prep import keys
from beam_prep.layouts import paired, sbd
from beam_prep.ops.registry import ExampleError
from beam_prep.readers import resolve_layout
from tests.helpers import dead_letters, examples, manifest, run_cli

S = 32  # Image side; records keep it (--image-size S), so masks compare pixel for pixel.
SBD_SIZE = 64  # Room for an object sparse in its box yet with clickable pixels.


# ---- RITM's mask handling, transcribed (the reference) ------------------------


def ritm_read(path):
  """cv2.imread(path) (BGR, 8 bits)."""
  return np.asarray(Image.open(path).convert("RGB"))[..., ::-1]


def ritm_trimap(path):
  """GrabCutDataset / BerkeleyDataset .get_sample, then DSample.gt_mask: 1, 0, -1 ignore."""
  m = ritm_read(path)[:, :, 0].astype(np.int32)
  m[m == 128] = -1
  m[m > 128] = 1
  gt = (m == 1).astype(np.int32)
  gt[m == -1] = -1
  return gt


def ritm_nonzero(path):
  """DavisDataset.get_sample (also COCO_MVal's loader), then DSample.gt_mask."""
  m = np.max(ritm_read(path).astype(np.int32), axis=2)
  m[m > 0] = 1
  return (m == 1).astype(np.int32)


def ritm_sbd_objects(inst, split):
  """SBDEvaluationDataset's (instance id -> binary mask) pairs (eval), or
  SBDDataset's objects after remove_buggy_masks (train, threshold 0.08)."""
  counts = np.bincount(inst.flatten())
  ids = [i for i in np.nonzero(counts)[0].tolist() if i != 0]
  if split == "train":
    kept = []
    for i in ids:
      obj = inst == i
      rows, cols = np.any(obj, axis=1), np.any(obj, axis=0)
      rmin, rmax = np.where(rows)[0][[0, -1]]
      cmin, cmax = np.where(cols)[0][[0, -1]]
      if obj.sum() / ((rmax - rmin + 1) * (cmax - cmin + 1)) >= 0.08:
        kept.append(i)
    ids = kept
  return {i: (inst == i).astype(np.int32) for i in ids}


def as_ritm(instance_mask, object_id=1):
  """Our coding (1 object, 255 ignore) in RITM's (1 object, -1 ignore)."""
  out = (instance_mask == object_id).astype(np.int32)
  out[instance_mask == keys.IGNORE] = -1
  return out


# ---- writing data sets --------------------------------------------------------


def _image(path, seed, size=S):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  rgb = np.random.default_rng(seed).integers(0, 255, (size, size, 3), dtype=np.uint8)
  Image.fromarray(rgb).save(path)


def _mask(path, arr, mode=None):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  Image.fromarray(arr, mode=mode).save(path)


def _trimap(y0, x0, size, band=2):
  """A square object (255) with an unlabelled band (128) around it."""
  m = np.zeros((S, S), np.uint8)
  m[y0 - band : y0 + size + band, x0 - band : x0 + size + band] = 128
  m[y0 : y0 + size, x0 : x0 + size] = 255
  return m


def _prep(root, out, size=S):
  """The job on whole images (`--crop none`): a record's mask is the layout's
  mask at the records' size, compared here with RITM's reading."""
  return run_cli(
    [
      "segmentation",
      "--input",
      str(root),
      "--output",
      str(out),
      "--image-size",
      str(size),
      "--variants",
      "1",
      "--eval-percent",
      "0",
      "--max-error-fraction",
      "1",
      "--crop",
      "none",
    ]
  )


def _masks(out, split="*", size=S):
  """(image_id, object_id) -> the record's mask, uint8 [size, size]."""
  got = {}
  for ex in examples(str(out), split):
    got[(ex[keys.IMAGE_ID], int(ex[keys.OBJECT_ID]))] = ex[keys.MASK].reshape(size, size)
  return got


def _run(root, out, size=S):
  assert _prep(root, out, size) == 0
  m = manifest(str(out))
  return m["config"]["layout"], m["counts"], _masks(out, size=size)


# ---- the single-object sets through the CLI ----------------------------------


def test_grabcut_keeps_the_ignore_band_and_refuses_a_colour_mask(tmp_path):
  root = tmp_path / "GrabCut"
  _image(root / "data_GT" / "a.jpg", 0)
  _image(root / "data_GT" / "b.bmp", 1)  # GrabCut's images are .jpg and .bmp
  _mask(root / "boundary_GT" / "a.bmp", _trimap(6, 6, 14))
  _mask(root / "boundary_GT" / "b.png", _trimap(10, 4, 9, band=3))
  _image(root / "data_GT" / "c.jpg", 2)
  colour = np.zeros((S, S, 3), np.uint8)
  colour[5:20, 5:20] = (255, 0, 0)
  _mask(root / "boundary_GT" / "c.png", colour)
  layout, c, masks = _run(root, tmp_path / "out")
  assert layout == "grabcut"
  assert c["errors_by_reason"] == {"unexpected_mask_value": 1}
  assert set(masks) == {("a", 1), ("b", 1)}
  for name, mask_file in (("a", "a.bmp"), ("b", "b.png")):
    source = np.asarray(Image.open(root / "boundary_GT" / mask_file))
    assert ((masks[name, 1] == keys.IGNORE) == (source == 128)).all()
    np.testing.assert_array_equal(
      as_ritm(masks[name, 1]), ritm_trimap(root / "boundary_GT" / mask_file)
    )
  (letter,) = dead_letters(str(tmp_path / "out"))
  assert letter["source"].endswith("c.jpg") and "c.png: a colour mask" in letter["detail"]


def test_berkeley_is_told_from_instance_id_folders_by_its_name(tmp_path):
  root = tmp_path / "Berkeley"
  for i, name in enumerate(("101085", "12003")):
    _image(root / "images" / f"{name}.jpg", i)
    _mask(root / "masks" / f"{name}.png", _trimap(8 + i, 8, 12))
  _image(root / "images" / "no_mask.jpg", 5)
  layout, c, masks = _run(root, tmp_path / "out")
  assert layout == "berkeley"
  assert c["errors_by_reason"] == {"missing_mask": 1}
  assert set(masks) == {("101085", 1), ("12003", 1)}
  for name in ("101085", "12003"):
    np.testing.assert_array_equal(
      as_ritm(masks[name, 1]), ritm_trimap(root / "masks" / f"{name}.png")
    )
    assert (masks[name, 1] == keys.IGNORE).any()
  (letter,) = dead_letters(str(tmp_path / "out"))
  assert letter["reason"] == "missing_mask" and "no file named no_mask.*" in letter["detail"]
  # The same folders under another name are the instance-id layout.
  other = tmp_path / "instances"
  os.rename(root, other)
  assert resolve_layout(str(other), "auto", "instances").name == "folders"


def test_black_and_white_masks_in_images_and_masks_are_one_object_each(tmp_path):
  """The images/ + masks/ most single-object sets come as (0 background, 255
  the object), under a name that is no benchmark's: --layout auto reads each
  mask as one object, a grey PNG and an RGB one alike, and a JPEG mask (grey
  edges) found by its name when there is no PNG; two masks of one name are
  a dead letter naming both."""
  root = tmp_path / "horses"
  objects = {}
  for i, (name, mode) in enumerate((("a", "L"), ("b", "L"), ("c", "RGB"), ("d", "JPEG"))):
    m = np.zeros((S, S), np.uint8)
    m[4 + 3 * i : 24, 5 : 20 + i] = 255
    objects[name] = m == 255
    _image(root / "images" / f"{name}.jpg", i)
    suffix = ".jpg" if mode == "JPEG" else ".png"
    _mask(
      root / "masks" / f"{name}{suffix}", np.repeat(m[..., None], 3, -1) if mode == "RGB" else m
    )
  _image(root / "images" / "e.jpg", 9)
  for suffix in (".jpg", ".bmp"):
    _mask(root / "masks" / f"e{suffix}", np.full((S, S), 255, np.uint8))
  layout, c, masks = _run(root, tmp_path / "out")
  assert layout == "folders"
  assert c["errors_by_reason"] == {"ambiguous_mask": 1}
  (dead,) = dead_letters(str(tmp_path / "out"))
  assert "e.bmp" in dead["detail"] and "e.jpg" in dead["detail"], dead
  assert set(masks) == {(name, 1) for name in objects}
  for name, obj in objects.items():
    np.testing.assert_array_equal(masks[name, 1], obj.astype(np.uint8))


def test_davis_masks_are_object_wherever_non_zero(tmp_path):
  root = tmp_path / "DAVIS"
  grey = np.zeros((S, S), np.uint8)
  grey[4:20, 6:28] = 255
  grey[20:24, 6:10] = 1  # a faint value is still the object
  palette = np.zeros((S, S), np.uint8)
  palette[10:30, 2:12] = 1
  pal = Image.fromarray(palette, mode="P")
  pal.putpalette([0, 0, 0, 128, 0, 0] + [0] * 762)
  _image(root / "img" / "bear.jpg", 0)
  _mask(root / "gt" / "bear.png", grey)
  _image(root / "img" / "camel.jpg", 1)
  os.makedirs(root / "gt", exist_ok=True)
  pal.save(root / "gt" / "camel.png")
  _image(root / "img" / "junk.jpg", 2)
  (root / "gt" / "junk.png").write_bytes(b"not a png")
  layout, c, masks = _run(root, tmp_path / "out")
  assert layout == "davis"
  assert c["errors_by_reason"] == {"unreadable_mask": 1}
  assert set(masks) == {("bear", 1), ("camel", 1)}
  for name in ("bear", "camel"):
    assert not (masks[name, 1] == keys.IGNORE).any()
    np.testing.assert_array_equal(
      as_ritm(masks[name, 1]), ritm_nonzero(root / "gt" / f"{name}.png")
    )
  (letter,) = dead_letters(str(tmp_path / "out"))
  assert letter["detail"].startswith(str(root / "gt" / "junk.png"))


def test_coco_mval_shares_the_format_and_is_picked_by_its_folder_name(tmp_path):
  root = tmp_path / "COCO_MVal"
  for i in range(2):
    m = np.zeros((S, S), np.uint8)
    m[3 + 5 * i : 20, 4:25] = 255
    _image(root / "img" / f"{i:012d}.jpg", i)
    _mask(root / "gt" / f"{i:012d}.png", m)
  _image(root / "img" / "twice.jpg", 7)
  _mask(root / "gt" / "twice.png", np.full((S, S), 255, np.uint8))
  _mask(root / "gt" / "twice.bmp", np.full((S, S), 255, np.uint8))
  layout, c, masks = _run(root, tmp_path / "out")
  assert layout == "coco_mval"
  assert c["errors_by_reason"] == {"ambiguous_mask": 1}
  assert set(masks) == {(f"{i:012d}", 1) for i in range(2)}
  for image_id, _ in masks:
    np.testing.assert_array_equal(
      as_ritm(masks[image_id, 1]), ritm_nonzero(root / "gt" / f"{image_id}.png")
    )
  (letter,) = dead_letters(str(tmp_path / "out"))
  assert "twice.bmp" in letter["detail"] and "twice.png" in letter["detail"]
  other = tmp_path / "frames"
  os.rename(root, other)
  assert resolve_layout(str(other), "auto", "instances").name == "davis"


# ---- SBD -----------------------------------------------------------------------


def _instances():
  """Three objects; object 3 is two far apart blobs (6% of its box): RITM's
  training loader drops it, its evaluation set keeps it."""
  inst = np.zeros((SBD_SIZE, SBD_SIZE), np.uint8)
  inst[1:20, 40:60] = 1
  inst[44:62, 2:22] = 2
  inst[1:12, 1:12] = 3
  inst[52:63, 52:63] = 3
  return inst


def _write_mat(path, seg, **fields):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  # As SBD's files: GTinst is a 1x1 struct whose first field is Segmentation.
  gt = {
    "Segmentation": seg,
    "Boundaries": np.zeros((1, 1), object),
    "Categories": np.array([[15]], np.uint8),
    **fields,
  }
  sio.savemat(path, {"GTinst": gt})


def _sbd(data):
  inst = _instances()
  for i, name in enumerate(("2008_000002", "2008_000003", "2008_000004", "2008_000009")):
    _image(data / "img" / f"{name}.jpg", i, SBD_SIZE)
    _write_mat(data / "inst" / f"{name}.mat", inst)
  (data / "train.txt").write_text("2008_000002\n2008_000003\n2008_000005\n")
  (data / "val.txt").write_text("2008_000004\n")
  _image(data / "img" / "2008_000005.jpg", 5, SBD_SIZE)  # listed, but its .mat holds no GTinst
  sio.savemat(data / "inst" / "2008_000005.mat", {"GTcls": {"Segmentation": inst}})
  return inst


def test_sbd_mat_files_are_read_as_ritm_reads_them(tmp_path):
  inst = _instances()
  path = tmp_path / "x.mat"
  _write_mat(path, inst)
  np.testing.assert_array_equal(sio.loadmat(str(path))["GTinst"][0][0][0], inst)  # RITM's way
  np.testing.assert_array_equal(sbd.segmentation(path.read_bytes(), str(path)), inst)


def test_sbd_lists_fix_the_split_and_bad_files_are_dead_letters(tmp_path):
  root = tmp_path / "benchmark_RELEASE"  # the download: --input may hold dataset/
  inst = _sbd(root / "dataset")
  layout, c, _ = _run(root, tmp_path / "out", SBD_SIZE)
  assert layout == "sbd"
  assert c["errors_by_reason"] == {"missing_gtinst": 1, "not_in_split_list": 1, "sparse_object": 2}
  train, val = (_masks(tmp_path / "out", split, SBD_SIZE) for split in ("train", "eval"))
  assert set(train) == {(n, i) for n in ("2008_000002", "2008_000003") for i in (1, 2)}
  assert set(val) == {("2008_000004", i) for i in (1, 2, 3)}
  for split, got in (("train", train), ("eval", val)):
    want = ritm_sbd_objects(inst, "train" if split == "train" else "val")
    for (_, object_id), mask in got.items():
      np.testing.assert_array_equal((mask == 1).astype(np.int32), want[object_id])
  # Train: the dropped object's pixels are ignore, not background.
  np.testing.assert_array_equal(train["2008_000002", 1] == keys.IGNORE, inst == 3)
  assert not (val["2008_000004", 3] == keys.IGNORE).any()
  by_reason = {}
  for d in dead_letters(str(tmp_path / "out")):
    by_reason.setdefault(d["reason"], []).append(d)
  assert by_reason["not_in_split_list"][0]["source"].endswith("2008_000009.jpg")
  assert (
    "2008_000005.mat: no GTinst struct (variables: GTcls)"
    in (by_reason["missing_gtinst"][0]["detail"])
  )
  assert {d["object_id"] for d in by_reason["sparse_object"]} == {3}
  # The folder holding img/ and inst/ is the layout too.
  assert resolve_layout(str(root / "dataset"), "auto", "instances").name == "sbd"


# ---- codings against RITM on random masks --------------------------------------


def test_trimap_coding_equals_ritms_on_a_random_mask(tmp_path):
  rng = np.random.default_rng(22)
  grey = rng.choice([0, 1, 2, 127, 128, 129, 200, 255], size=(40, 30)).astype(np.uint8)
  anywhere = rng.random((40, 30)) < 0.3
  grey[anywhere] = rng.integers(0, 256, anywhere.sum(), dtype=np.uint8)
  path = tmp_path / "m.bmp"
  _mask(path, grey)
  ours = paired.trimap(paired.read_mask_pixels(str(path)), str(path))
  np.testing.assert_array_equal(as_ritm(ours), ritm_trimap(path))


def test_nonzero_coding_equals_ritms_on_a_random_colour_mask(tmp_path):
  rng = np.random.default_rng(23)
  rgb = rng.integers(0, 3, (30, 40, 3)).astype(np.uint8) * rng.integers(
    0, 256, (30, 40, 3), dtype=np.uint8
  )
  rgb[rng.random((30, 40)) < 0.4] = 0
  path = tmp_path / "m.png"
  _mask(path, rgb)
  ours = paired.nonzero(paired.read_mask_pixels(str(path)), str(path))
  np.testing.assert_array_equal(as_ritm(ours), ritm_nonzero(path))


def test_sparse_objects_are_the_ones_ritms_training_loader_drops():
  rng = np.random.default_rng(24)
  inst = np.zeros((60, 60), np.uint8)
  for i in range(1, 30):  # boxes, lines and scattered pixels of random ids
    y, x = rng.integers(0, 50, 2)
    kind = i % 3
    if kind == 0:
      inst[y : y + rng.integers(2, 10), x : x + rng.integers(2, 10)] = i
    elif kind == 1:
      n = rng.integers(5, 10)
      inst[y + np.arange(n), x + np.arange(n)] = i
    else:
      inst[rng.integers(0, 60, 4), rng.integers(0, 60, 4)] = i
  dropped = {i for i, _ in sbd.sparse_objects(inst)}
  kept = set(ritm_sbd_objects(inst, "train"))
  assert dropped and kept
  assert dropped == set(ritm_sbd_objects(inst, "val")) - kept


@pytest.mark.parametrize(
  "seg, detail",
  [
    (np.full((4, 4), 300, np.int32), "holds 300"),
    (np.full((4, 4), -1, np.int32), "holds -1"),
    (np.full((4, 4), 1.5), "holds 1.5"),
    (np.zeros((2, 4, 4), np.uint8), "not a 2-D instance mask"),
  ],
)
def test_sbd_instance_ids_outside_0_254_are_refused(tmp_path, seg, detail):
  path = tmp_path / "bad.mat"
  _write_mat(path, seg)
  with pytest.raises(ExampleError, match=detail) as e:
    sbd.segmentation(path.read_bytes(), str(path))
  assert e.value.reason == "unexpected_mask_value" and str(path) in e.value.detail


# ---- detection ---------------------------------------------------------------


def test_an_unrecognised_input_lists_what_each_layout_expects(tmp_path):
  from beam_prep import layouts  # pylint: disable=g-import-not-at-top

  (tmp_path / "empty").mkdir()
  with pytest.raises(layouts.InputError) as e:
    resolve_layout(str(tmp_path / "empty"), "auto", "instances")
  for name in ("grabcut", "berkeley", "davis", "coco_mval", "sbd", "folders", "voc"):
    assert f"  {name}" in str(e.value) and layouts.get_layout(name).expects in str(e.value)


@pytest.fixture(name="auto_log")
def _auto_log(caplog, monkeypatch):
  """The INFO lines of the `beam_prep` logger (which `beam-prep` keeps to itself)."""
  import logging  # pylint: disable=g-import-not-at-top

  monkeypatch.setattr(logging.getLogger("beam_prep"), "propagate", True)
  caplog.set_level(logging.INFO, logger="beam_prep")
  return lambda: [r.getMessage() for r in caplog.records if r.name == "beam_prep"]


@pytest.mark.parametrize(
  "name,folders,chosen,other",
  [
    ("horses", ("images", "masks"), "folders", "berkeley"),
    ("Berkeley", ("images", "masks"), "berkeley", "folders"),
    ("frames", ("img", "gt"), "davis", "coco_mval"),
    ("COCO_MVal", ("img", "gt"), "coco_mval", "davis"),
  ],
)
def test_auto_says_which_layout_it_chose_and_the_flag_of_the_other(
  tmp_path, auto_log, name, folders, chosen, other
):
  from beam_prep import layouts  # pylint: disable=g-import-not-at-top

  root = tmp_path / name
  for folder in folders:
    (root / folder).mkdir(parents=True)
  assert resolve_layout(str(root), "auto", "instances").name == chosen
  (line,) = auto_log()
  assert line.startswith(f"--layout auto: {root} read as {chosen} (")
  assert f"could also be read as {other}: give --layout {other} for that" in line
  assert layouts.get_layout(chosen).expects in line and layouts.get_layout(other).expects in line
  # A layout named, or an input only one layout reads, says nothing.
  resolve_layout(str(root), chosen, "instances")
  grabcut = tmp_path / "GrabCut"
  for folder in ("data_GT", "boundary_GT"):
    (grabcut / folder).mkdir(parents=True)
  assert resolve_layout(str(grabcut), "auto", "instances").name == "grabcut"
  assert auto_log() == [line]


def test_sbd_val_list_alone_is_an_evaluation_only_output(tmp_path):
  """val.txt alone is the data set (RITM's evaluation reads its names only):
  the other images are not inputs, every input is eval, nothing is analysed,
  the output is complete and beam-train evaluate reads it at source size."""
  data = tmp_path / "SBD"
  _sbd(data)
  (data / "train.txt").unlink()
  out = tmp_path / "out"
  assert (
    run_cli(
      [
        "segmentation",
        "--input",
        str(data),
        "--output",
        str(out),
        "--image-size",
        str(SBD_SIZE),
        "--variants",
        "1",
        "--progress-seconds",
        "0",
        "--crop",
        "none",
      ]
    )
    == 0
  )
  m = manifest(str(out))
  assert m["complete"] and m["eval_only"] and m["config"]["eval_percent"] == 100
  c = m["counts"]
  assert (c["inputs_read"], c["source_records"], c["errors_total"]) == (1, 1, 0)
  assert c["examples_written"] == {"train": 0, "eval": 3}
  assert not (out / "transform").exists()
  from train import cli  # pylint: disable=g-import-not-at-top

  with pytest.raises(SystemExit) as e:
    cli.main(
      ["evaluate", "--data", str(out), "--output", str(tmp_path / "noc"), "--max-clicks", "3"]
    )
  assert e.value.code == 0
  import json  # pylint: disable=g-import-not-at-top

  report = json.load(open(tmp_path / "noc" / "noc.json"))
  assert sorted(r["object_id"] for r in report["objects"]) == [1, 2, 3]
