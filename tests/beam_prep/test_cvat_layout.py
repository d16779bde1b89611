"""CVAT's own export ("CVAT for images 1.1") as an input layout: its shapes
drawn as instance masks, and a job over an unzipped export."""

import os
import xml.etree.ElementTree as ET

import numpy as np
from PIL import Image

from beam_prep import readers
from beam_prep.layouts import coco, cvat
from tests.helpers import dead_letters, manifest, records, run_cli


def _runs(box: np.ndarray) -> str:
  """CVAT's run lengths of a bool box: 0s and 1s in turn, row by row, from 0s."""
  flat = box.ravel().astype(int)
  edges = np.flatnonzero(np.diff(flat)) + 1
  runs = np.diff(np.concatenate([[0], edges, [flat.size]])).tolist()
  return ", ".join(map(str, ([0] if flat[0] else []) + runs))


def _mask(drawn: np.ndarray, left: int, top: int, **extra) -> str:
  h, w = drawn.shape
  attrs = " ".join(f'{k}="{v}"' for k, v in extra.items())
  return (
    f'<mask label="a" rle="{_runs(drawn)}" left="{left}" top="{top}" width="{w}" '
    f'height="{h}" {attrs}/>'
  )


def _drawn(xml: str, height: int = 40, width: int = 60):
  """An <image> element's instance mask and its rows' errors, as the job draws them."""
  image = ET.fromstring(
    f'<image id="0" name="a.png" width="{width}" height="{height}">{xml}</image>'
  )
  rows = cvat.image_annotations(image, "annotations.xml:image[0]")
  entry = {"id": "0", "height": height, "width": width, "annotations": rows}
  return coco.instance_mask(entry, "a")


def test_shapes_become_objects_boxes_ignore_and_groups_one_object():
  blob = np.zeros((8, 10), bool)
  blob[1:7, 2:9], blob[0, 0] = True, True  # Starts with a 1: a first run of 0 zeros.
  xml = (
    _mask(blob, left=30, top=20)
    + '<polygon label="a" points="2,2;12,2;12,10;2,10"/>'
    + '<ellipse label="a" cx="45" cy="8" rx="6" ry="4"/>'
    + '<box label="a" xtl="20" ytl="30" xbr="26" ybr="36"/>'
    + '<polyline label="a" points="0,39;59,39"/><tag label="a"/>'
    + '<polygon label="a" group_id="7" points="0,20;4,20;4,24;0,24"/>'
    + '<polygon label="a" group_id="7" points="10,20;14,20;14,24;10,24"/>'
  )
  mask, errors = _drawn(xml)
  assert errors == []
  want = np.zeros((40, 60), bool)
  want[20:28, 30:40] = blob
  np.testing.assert_array_equal(mask == 1, want)  # The mask's box, at its place.
  assert (mask == 2).sum() == 10 * 8 and (mask[2:10, 2:12] == 2).all()
  assert 60 < (mask == 3).sum() < 90 and mask[8, 45] == 3  # pi * 6 * 4 = 75
  assert (mask[30:36, 20:26] == 255).all()  # The box: ignore.
  grouped = mask == 4  # Two polygons of one group: one object.
  assert grouped[20:24, 0:4].all() and grouped[20:24, 10:14].all() and grouped.sum() == 32
  assert set(np.unique(mask).tolist()) == {0, 1, 2, 3, 4, 255}


def test_the_higher_z_order_is_drawn_on_top():
  """A person (small) behind a car (large, drawn whole over it): CVAT's
  z_order says which is seen; without it, the smaller is on top."""
  car = '<polygon label="car" z_order="{}" points="10,10;50,10;50,30;10,30"/>'
  person = '<polygon label="person" z_order="{}" points="20,5;30,5;30,35;20,35"/>'
  behind, _ = _drawn(car.format(2) + person.format(1))
  assert (behind[10:30, 20:30] == 1).all() and (behind[5:10, 20:30] == 2).all()
  in_front, _ = _drawn(car.format(1) + person.format(2))
  assert (in_front[5:35, 20:30] == 2).all() and (in_front[10:30, 10:20] == 1).all()
  hidden = '<polygon label="a" z_order="0" points="15,15;25,15;25,25;15,25"/>'
  mask, errors = _drawn(car.format(1) + hidden)
  assert (mask[10:30, 10:50] == 1).all() and [e["reason"] for e in errors] == ["hidden_object"]


def test_an_unreadable_shape_is_a_dead_letter_naming_it():
  short = np.ones((2, 3), bool)
  xml = _mask(short, left=0, top=0).replace(
    'width="3"', 'width="4"'
  )  # 6 pixels of runs, 8 in its box.
  xml += '<polygon label="a" points="1,1;5,1"/>'
  _, errors = _drawn(xml)
  assert [e["reason"] for e in errors] == ["bad_shape", "bad_shape"]
  assert "its runs cover 6 pixels, its 4x2 box 8" in errors[0]["detail"]
  assert errors[1]["source"].endswith("image[0]/polygon[1]")


def _export(root):
  """An unzipped export: annotations.xml and images/, one image in a folder,
  one listed but missing, a video's frame (named without its extension) and
  a project's image (under images/SUBSET/)."""
  os.makedirs(root / "images" / "sub")
  os.makedirs(root / "images" / "Train")
  files = (("a.png", (40, 60)), ("sub/b.jpg", (30, 50)), ("frame_000003.PNG", (20, 20)))
  for name, size in files + (("Train/c.png", (20, 20)),):
    Image.new("RGB", size[::-1], (90, 120, 40)).save(root / "images" / name)
  blob = np.ones((10, 12), bool)
  (root / cvat.ANNOTATIONS_FILE).write_text(
    '<?xml version="1.0" encoding="utf-8"?>\n<annotations><version>1.1</version><meta/>'
    f'<image id="0" name="a.png" width="60" height="40">{_mask(blob, left=5, top=5)}'
    '<polygon label="a" points="30,10;50,10;50,30;30,30"/></image>'
    '<image id="1" name="sub/b.jpg" width="50" height="30">'
    '<polygon label="a" points="5,5;25,5;25,25;5,25"/>'
    '<box label="a" xtl="30" ytl="2" xbr="45" ybr="12"/></image>'
    '<image id="2" name="gone.png" width="10" height="10">'
    '<polygon label="a" points="1,1;8,1;8,8"/></image>'
    '<image id="3" name="frame_000003" width="20" height="20">'
    '<polygon label="a" points="2,2;15,2;15,15"/></image>'
    '<image id="4" name="c.png" subset="Train" width="20" height="20">'
    '<polygon label="a" points="2,2;15,2;15,15"/></image>'
    "</annotations>"
  )


def test_an_unzipped_export_is_found_and_every_image_accounted_for(tmp_path):
  _export(tmp_path / "export")
  root = str(tmp_path / "export")
  assert readers.resolve_layout(root, "auto").name == "cvat"
  assert readers.resolve_layout(os.path.join(root, cvat.ANNOTATIONS_FILE), "auto").name == "cvat"
  out = str(tmp_path / "out")
  argv = ["segmentation", "--input", root, "--output", out, "--image-size", "32"]
  assert run_cli(argv + ["--variants", "1", "--eval-percent", "0", "--progress-seconds", "0"]) == 0
  c = manifest(out)["counts"]
  assert c["images_used"] == 4 and c["errors_by_reason"] == {"missing_image": 1}, c
  assert c["objects_used"] == 5 and c["objects_box_only"] == 1, c
  ids = {r.features.feature["image_id"].bytes_list.value[0].decode() for r in records(out, "train")}
  assert ids == {"a", "sub/b", "frame_000003", "c"}
  assert dead_letters(out)[0]["source"].endswith(os.path.join("images", "gone.png"))
  (tmp_path / "video.xml").write_text('<annotations><track id="0" label="a"/></annotations>')
  assert (
    run_cli(["segmentation", "--input", str(tmp_path / "video.xml"), "--output", out + "2"]) == 1
  )
