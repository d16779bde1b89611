"""The coco layout: polygons, RLE and crowd regions drawn by pycocotools, bad rows
dead-lettered, the JSON file streamed, and a real job on the DirectRunner."""

import io
import json
import os
import re

import numpy as np
import pytest
from PIL import Image
from pycocotools import mask as mask_utils

from beam_prep import keys, readers
from beam_prep.features import FeatureTable
from beam_prep.layouts import coco
from beam_prep.ops.image import resize_nearest
from beam_prep.record_codec import RecordCodec
from tests.helpers import dead_letters, manifest, records, run_cli

W, H = 128, 96  # Not square: a transposed RLE or polygon would show.
_DISK = (np.mgrid[:H, :W][0] - 40) ** 2 + (np.mgrid[:H, :W][1] - 60) ** 2 < 400
# A whole image's compressed RLE (COCO's string) of a disk.
_COMPRESSED = mask_utils.encode(np.asfortranarray(_DISK.astype(np.uint8)))["counts"].decode()


def _box(x0, y0, x1, y1):
  return [float(v) for v in (x0, y0, x1, y0, x1, y1, x0, y1)]


def _rle_of(region: np.ndarray, compressed: bool):
  rle = mask_utils.encode(np.asfortranarray(region.astype(np.uint8)))
  if compressed:
    return {"size": [H, W], "counts": rle["counts"].decode("ascii")}
  flat = region.astype(np.uint8).flatten(order="F")  # Column-major, from 0s.
  counts, current, run = [], 0, 0
  for v in flat:
    if v != current:
      counts.append(run)
      current, run = v, 0
    run += 1
  counts.append(run)
  return {"size": [H, W], "counts": counts}


def _region(x0, y0, x1, y1):
  r = np.zeros((H, W), bool)
  r[y0:y1, x0:x1] = True
  return r


def _dataset(root):
  """A COCO file with every kind of row; returns its path."""
  (root / "images" / "sub").mkdir(parents=True)
  rng = np.random.default_rng(0)
  for name in ("a.png", "sub/b.png", "c.png"):
    Image.fromarray(rng.integers(0, 255, (H, W, 3), dtype=np.uint8)).save(root / "images" / name)
  images = [
    {"id": 1, "file_name": "a.png", "height": H, "width": W},
    {"id": 2, "file_name": "sub/b.png", "height": H, "width": W},
    {"id": 3, "file_name": "missing.png", "height": H, "width": W},
    {"id": 4, "height": H, "width": W},  # No file_name.
    {"id": 5, "file_name": "c.png", "height": H, "width": W},  # No annotation.
  ]
  annotations = [
    {"id": 10, "image_id": 1, "iscrowd": 0, "segmentation": [_box(8, 8, 70, 70)]},
    {
      "id": 11,
      "image_id": 1,
      "iscrowd": 0,
      "segmentation": _rle_of(_region(40, 40, 64, 64), compressed=True),
    },
    {
      "id": 12,
      "image_id": 1,
      "iscrowd": 1,
      "segmentation": _rle_of(_region(80, 60, 120, 88), compressed=False),
    },
    {
      "id": 20,
      "image_id": 2,
      "iscrowd": 0,
      "segmentation": [_box(4, 4, 30, 30), _box(60, 40, 90, 80)],
    },
    {"id": 21, "image_id": 2, "iscrowd": 0, "segmentation": []},
    {  # CVAT's export of an object drawn as a mask: a crowd RLE with its shape's attributes.
      "id": 23,
      "image_id": 2,
      "iscrowd": 1,
      "segmentation": _rle_of(_region(35, 5, 55, 25), compressed=False),
      "attributes": {"occluded": False},
    },
    {"id": 22, "image_id": 2, "iscrowd": 0, "segmentation": [_box(100, 20, 400, 40)]},
    {"id": 30, "image_id": 3, "iscrowd": 0, "segmentation": [_box(1, 1, 9, 9)]},
    {"id": 40, "image_id": 999, "iscrowd": 0, "segmentation": [_box(1, 1, 9, 9)]},
  ]
  path = root / "annotations" / "instances.json"
  path.parent.mkdir()
  path.write_text(
    json.dumps(
      {
        "info": {"description": "tést"},
        "images": images,
        "annotations": annotations,
        "categories": [{"id": 1, "name": "thing"}],
      },
      indent=1,
    )
  )
  return str(path), images, annotations


def _image(coco_json, annotations, image_id):
  anns = [
    dict(a, where=f"x:annotations[{i}]")
    for i, a in enumerate(annotations)
    if a["image_id"] == image_id
  ]
  return {"id": str(image_id), "height": H, "width": W, "annotations": anns}


def test_instance_mask_matches_pycocotools_with_crowd_and_overlap(tmp_path):
  path, _, annotations = _dataset(tmp_path)
  mask, errors = coco.instance_mask(_image(path, annotations, 1), "a")
  assert errors == []
  polygon = mask_utils.decode(mask_utils.frPyObjects([_box(8, 8, 70, 70)], H, W))[..., 0] > 0
  small, crowd = _region(40, 40, 64, 64), _region(80, 60, 120, 88)
  # The smaller object is painted over the larger one; the crowd is ignore.
  np.testing.assert_array_equal(mask == 2, small)
  np.testing.assert_array_equal(mask == 1, polygon & ~small)
  np.testing.assert_array_equal(mask == keys.IGNORE, crowd)
  assert set(np.unique(mask)) == {0, 1, 2, keys.IGNORE}


def test_bad_annotations_are_errors_and_their_pixels_ignored(tmp_path):
  path, _, annotations = _dataset(tmp_path)
  mask, errors = coco.instance_mask(_image(path, annotations, 2), "sub/b")
  assert [(e["annotation_id"], e["reason"], e["stage"]) for e in errors] == [
    (21, "empty_segmentation", "annotation"),
    (22, "polygon_outside_image", "annotation"),
  ]
  assert all(e["source"].startswith("x:annotations[") and e["image_id"] == "sub/b" for e in errors)
  # The part of the outside polygon that lies in the image is not background.
  assert (mask[22:38, 102:126] == keys.IGNORE).all()
  assert set(np.unique(mask)) == {0, 1, 2, keys.IGNORE}  # 2: the CVAT mask (id 23).


def test_a_polygon_far_outside_is_refused_without_rasterizing_its_whole_edge():
  image = {
    "id": "7",
    "height": H,
    "width": W,
    "annotations": [
      {"id": 1, "segmentation": [[10, 10, 1e12, 10, 10, 20]], "where": "f:annotations[0]"}
    ],
  }  # pycocotools alone takes memory by the edge's length: 1e12 px would take it all.
  mask, errors = coco.instance_mask(image, "x")
  assert [e["reason"] for e in errors] == ["polygon_outside_image"]
  assert mask[12, 11] == keys.IGNORE and mask[30, 5] == 0


@pytest.mark.parametrize(
  "segmentation, reason",
  [
    ({"size": [H + 1, W], "counts": "abc"}, "rle_size_mismatch"),
    ({"size": [H, W], "counts": [5, 3]}, "bad_rle"),
    ({"size": [H, W], "counts": "!!!!"}, "bad_rle"),
    ({"size": [H, W], "counts": _COMPRESSED[: len(_COMPRESSED) // 2]}, "bad_rle"),  # Cut short.
    ({"size": [f"{H}px", W], "counts": "abc"}, "bad_rle"),
    ({"size": [None, None], "counts": "abc"}, "bad_rle"),
    ([[1, 2, float("nan"), 4, 5, 6]], "bad_segmentation"),
    ({"counts": [H * W]}, "bad_rle"),
    ("a string", "bad_segmentation"),
    ([[1, 2, 3]], "bad_segmentation"),
    ([[1, 2, 3, 4]], "empty_segmentation"),
    ({"size": [H, W], "counts": [H * W]}, "empty_segmentation"),
  ],
)
def test_each_unusable_segmentation_has_its_reason(segmentation, reason):
  image = {
    "id": "7",
    "height": H,
    "width": W,
    "annotations": [{"id": 1, "segmentation": segmentation, "where": "f:annotations[0]"}],
  }
  mask, errors = coco.instance_mask(image, "x")
  assert [e["reason"] for e in errors] == [reason]
  assert (mask != keys.IGNORE).all() and not mask.any()


def test_more_objects_than_ids_and_hidden_objects():
  def cell(i):  # 2x2 squares on a grid of 16 x 16.
    return _box((i % 16) * 4, (i // 16) * 3, (i % 16) * 4 + 2, (i // 16) * 3 + 2)

  anns = [{"id": i, "segmentation": [cell(i)], "where": f"f:{i}"} for i in range(256)]
  mask, errors = coco.instance_mask({"id": "1", "height": H, "width": W, "annotations": anns}, "x")
  reasons = {e["annotation_id"]: e["reason"] for e in errors}
  assert reasons == {254: "too_many_objects", 255: "too_many_objects"}
  assert set(np.unique(mask)) == set(range(coco.MAX_OBJECTS + 1)) | {keys.IGNORE}
  assert (mask[45:47, 56:58] == keys.IGNORE).all() and (mask[45:47, 60:62] == keys.IGNORE).all()
  anns = [
    {"id": 1, "segmentation": [_box(0, 0, 10, 10)], "where": "f:1"},
    {"id": 2, "segmentation": [_box(0, 0, 4, 4)], "where": "f:2"},
    {"id": 3, "segmentation": [_box(4, 0, 10, 10)], "where": "f:3"},
    {"id": 4, "segmentation": [_box(0, 4, 4, 10)], "where": "f:4"},
  ]
  _, errors = coco.instance_mask({"id": "1", "height": H, "width": W, "annotations": anns}, "x")
  assert [(e["annotation_id"], e["reason"]) for e in errors] == [(1, "hidden_object")]


class _CountingFile(io.BytesIO):
  def __init__(self, data):
    super().__init__(data)
    self.largest_read = 0

  def read(self, size=-1):
    self.largest_read = max(self.largest_read, size)
    return super().read(size)


def test_the_json_file_is_streamed_in_chunks_with_the_same_values():
  annotations = [
    {"id": i, "image_id": i % 7, "segmentation": [[1.5e0, 2, 3, 4, 5, 6]], "name": "é" * (i % 5)}
    for i in range(3000)
  ]
  doc = {
    "info": {"year": 2017, "v": [1, 2.5, None, True]},
    "licenses": [],
    "images": [{"id": i, "file_name": f"{i}.jpg"} for i in range(7)],
    "annotations": annotations,
    "categories": [{"id": 1}],
    "tail": 12345,
  }
  data = json.dumps(doc, indent=2, ensure_ascii=False).encode("utf-8")
  f = _CountingFile(data)
  entries = coco.iter_entries(f, chunk=4096)
  first = next(entries)
  assert first == ("info", doc["info"])
  assert f.tell() < len(data)  # Values come before the file is read.
  rest = list(entries)
  assert f.largest_read <= 2 * 4096  # Entries are small: never the whole file.
  got = {"images": [], "annotations": []}
  for key, value in rest:
    if key in got:
      got[key].append(value)
    else:
      assert doc[key] == value
  assert got["images"] == doc["images"] and got["annotations"] == annotations


def test_small_chunks_give_the_same_entries():
  doc = {
    "images": [{"id": 12345678, "file_name": "x y.jpg", "h": 1.25e-3}],
    "annotations": [],
    "n": 1234567890,
  }
  data = json.dumps(doc).encode()
  for chunk in (1, 2, 3, 7):
    got = list(coco.iter_entries(io.BytesIO(data), chunk=chunk))
    assert got == [("images", doc["images"][0]), ("n", 1234567890)]


def test_auto_layout_tells_coco_from_a_json_lines_manifest(tmp_path):
  path, _, _ = _dataset(tmp_path)
  assert readers.resolve_layout(path, "auto").name == "coco"
  jsonl = tmp_path / "rows.json"
  jsonl.write_text('{"image": "a.png", "mask": "a_mask.png"}\n')
  assert readers.resolve_layout(str(jsonl), "auto").name == "manifest"
  own = tmp_path / "own.json"  # A tool's own key first.
  own.write_text(json.dumps({"version": "1.2", **json.loads(open(path).read())}))
  assert readers.resolve_layout(str(own), "auto").name == "coco"
  bom = tmp_path / "bom.json"  # As Windows tools write UTF-8 (PowerShell's Out-File, Notepad).
  bom.write_bytes(b"\xef\xbb\xbf" + open(path, "rb").read())
  assert readers.resolve_layout(str(bom), "auto").name == "coco"
  with open(bom, "rb") as f, open(path, "rb") as g:
    assert list(coco.iter_entries(f)) == list(coco.iter_entries(g))


def test_broken_json_names_the_file_and_the_place(tmp_path, capsys, caplog):
  bad = tmp_path / "instances.json"
  bad.write_text('{"images": [{"id": 1, "file_name": "a.png"}, {"id": 2,, }]}')
  out = str(tmp_path / "out")
  assert run_cli(["segmentation", "--input", str(bad), "--layout", "coco", "--output", out]) == 1
  (line,) = [ln for ln in capsys.readouterr().out.splitlines() if "not a COCO JSON file" in ln]
  assert re.fullmatch(
    rf"beam-prep segmentation: {re.escape(str(bad))} is not a COCO JSON file: .* at character \d+",
    line,
  )  # One line: the file and the place, without Beam's step name.
  assert not [r for r in caplog.records if "Traceback" in (r.exc_text or r.getMessage())]
  assert not os.path.exists(os.path.join(out, "_SUCCESS"))


def test_coco_job_accounts_for_every_image_and_annotation(tmp_path):
  path, images, annotations = _dataset(tmp_path)
  out = str(tmp_path / "out")
  assert (
    run_cli(
      [
        "segmentation",
        "--input",
        path,
        "--image-root",
        str(tmp_path / "images"),
        "--output",
        out,
        "--image-size",
        "64",
        "--variants",
        "1",
        "--crop",
        "none",
        "--eval-percent",
        "0",
        "--max-error-fraction",
        "1",
      ]
    )
    == 0
  )
  m = manifest(out)
  assert m["config"]["layout"] == "coco"
  c = m["counts"]
  assert c["errors_by_reason"] == {
    "bad_image_entry": 1,
    "missing_image": 1,
    "mask_has_no_object": 1,
    "empty_segmentation": 1,
    "polygon_outside_image": 1,
    "unknown_image_id": 1,
  }
  assert (c["inputs_read"], c["images_used"], c["images_failed"]) == (len(images), 2, 3)
  # Objects: 2 in a, 2 used + 2 failed in b, 1 of an unknown image, 1 of the missing image.
  assert (c["objects_found"], c["objects_used"], c["objects_failed"]) == (8, 4, 4)
  assert c["objects_of_failed_images"] == 1
  assert c["examples_written"] == {"train": 4, "eval": 0} and c["accounted"]
  letters = dead_letters(out)
  assert len(letters) == c["errors_total"] == 6
  by_reason = {d["reason"]: d for d in letters}
  assert by_reason["unknown_image_id"]["annotation_id"] == 40
  assert by_reason["unknown_image_id"]["source"].endswith("instances.json:annotations[8]")
  assert by_reason["bad_image_entry"]["source"].endswith("instances.json:images[3]")
  assert by_reason["missing_image"]["source"].endswith(os.path.join("images", "missing.png"))
  # Every record's mask is its object in the drawn instance mask, resized
  # with its aspect ratio kept: 128 x 96 fills 64 x 48, the rows below are
  # padding, ignored.
  recs = records(out, "train")
  got = set()
  for r in recs:
    f = r.features.feature
    image_id = f[keys.IMAGE_ID].bytes_list.value[0].decode()
    object_id = f[keys.OBJECT_ID].int64_list.value[0]
    got.add((image_id, object_id))
    numeric = {"a": 1, "sub/b": 2}[image_id]
    inst, _ = coco.instance_mask(_image(path, annotations, numeric), image_id)
    small = np.full((64, 64), keys.IGNORE, np.uint8)
    small[:48] = resize_nearest(inst, 48, 64)
    want = np.where(small == keys.IGNORE, keys.IGNORE, small == object_id).astype(np.uint8)
    stored = RecordCodec(FeatureTable.load(out)).decode_numpy(r.SerializeToString())[keys.MASK]
    np.testing.assert_array_equal(stored[..., 0], want)
  assert got == {("a", 1), ("a", 2), ("sub/b", 1), ("sub/b", 2)}


def test_image_root_is_refused_for_other_layouts(tmp_path):
  from beam_prep.config import PrepConfig  # pylint: disable=g-import-not-at-top

  with pytest.raises(ValueError, match="--image-root is for layouts"):
    PrepConfig(
      input=str(tmp_path), output=str(tmp_path / "o"), layout="folders", image_root=str(tmp_path)
    )


def test_a_box_only_row_is_ignore_in_the_mask_and_no_failure():
  anns = [
    {"id": 1, "segmentation": [_box(60, 10, 100, 50)], "where": "f:1"},
    {"id": 2, "segmentation": [], "bbox": [10.5, 20, 30, 40.2], "where": "f:2"},
    {"id": 3, "bbox": [70, 30, 50, 60], "where": "f:3"},  # Over object 1, and no key.
    {"id": 4, "segmentation": [], "bbox": [0, 0, 0, 5], "where": "f:4"},
  ]  # No area.
  mask, errors = coco.instance_mask({"id": "1", "height": H, "width": W, "annotations": anns}, "x")
  assert [(e["annotation_id"], e["reason"]) for e in errors] == [(4, "empty_segmentation")]
  assert [coco.box_only(a) for a in anns] == [False, True, True, False]
  # Every pixel a box touches is ignore, unless an object with a mask is there.
  assert (mask[20:61, 10:41] == keys.IGNORE).all()
  assert mask[19, 10:41].max() == 0 and mask[20:61, 41].max() == 0 and mask[61, 10:41].max() == 0
  polygon = mask_utils.decode(mask_utils.frPyObjects([_box(60, 10, 100, 50)], H, W))[..., 0] > 0
  np.testing.assert_array_equal(mask == 1, polygon)
  box3 = _region(70, 30, 120, 90)
  assert (mask[box3 & ~polygon] == keys.IGNORE).all()


def test_coco_job_counts_box_only_rows_apart(tmp_path):
  (tmp_path / "images").mkdir()
  Image.fromarray(np.full((H, W, 3), 90, np.uint8)).save(tmp_path / "images" / "a.png")
  images = [
    {"id": 1, "file_name": "a.png", "height": H, "width": W},
    {"id": 2, "file_name": "gone.png", "height": H, "width": W},
  ]
  annotations = [
    {
      "id": 1,
      "image_id": 1,
      "iscrowd": 0,
      "segmentation": [_box(8, 8, 60, 60)],
      "bbox": [8, 8, 52, 52],
    },
    {"id": 2, "image_id": 1, "iscrowd": 0, "segmentation": [], "bbox": [70, 10, 40, 30]},
    {"id": 3, "image_id": 1, "iscrowd": 0, "bbox": [70, 50, 40, 30]},
    {"id": 4, "image_id": 1, "iscrowd": 0, "segmentation": []},  # Nothing: a failure.
    {"id": 5, "image_id": 2, "iscrowd": 0, "segmentation": [_box(8, 8, 60, 60)]},
    {"id": 6, "image_id": 2, "iscrowd": 0, "segmentation": [], "bbox": [1, 1, 5, 5]},
  ]
  path = tmp_path / "instances.json"
  path.write_text(json.dumps({"images": images, "annotations": annotations}))
  out = str(tmp_path / "out")
  assert (
    run_cli(
      [
        "segmentation",
        "--input",
        str(path),
        "--image-root",
        str(tmp_path / "images"),
        "--output",
        out,
        "--image-size",
        "64",
        "--variants",
        "1",
        "--crop",
        "none",
        "--eval-percent",
        "0",
        "--max-error-fraction",
        "1",
      ]
    )
    == 0
  )
  c = manifest(out)["counts"]
  assert c["objects_box_only"] == 3
  assert (c["objects_found"], c["objects_used"], c["objects_failed"]) == (3, 1, 2)
  assert c["objects_of_failed_images"] == 1 and c["accounted"]
  assert c["errors_by_reason"] == {"empty_segmentation": 1, "missing_image": 1}
  [rec] = records(out)
  stored = RecordCodec(FeatureTable.load(out)).decode_numpy(rec.SerializeToString())[keys.MASK][
    ..., 0
  ]
  # 128 x 96 fills 64 x 48: the boxes at half size are ignore, not background.
  for rows in (slice(5, 20), slice(25, 40)):
    assert (stored[rows, 35:55] == keys.IGNORE).all()
  assert (stored[48:] == keys.IGNORE).all()
  assert (stored[21:24, 35:55] == 0).all() and (stored[:48, 55:] == 0).all()
  assert (stored[:48, :35] != keys.IGNORE).all() and stored[4:30, 4:30].all()


def test_summary_line_names_box_only_rows():
  from pipelines import report  # pylint: disable=g-import-not-at-top

  counts = {
    "inputs_read": 2,
    "images_used": 1,
    "images_failed": 1,
    "objects_found": 3,
    "objects_used": 1,
    "objects_failed": 2,
    "objects_box_only": 3,
    "examples_written": {"train": 1},
    "errors_total": 0,
    "errors_by_reason": {},
  }
  m = {
    "counts": counts,
    "splits_objects": True,
    "paths": {"records": "r", "transform": "t"},
    "timing": {"wall_seconds": 1.0, "examples_per_second": 1.0, "images_per_second": 2.0},
  }
  assert "3 box-only annotations" in report.summary_lines(m)[0]
  assert "box-only" not in report.summary_lines(dict(m, counts=dict(counts, objects_box_only=0)))[0]


def test_one_file_under_two_ids_is_one_image_with_both_ids_annotations(tmp_path):
  """Merged exports list a file once per source: one input, every object."""
  size = {"height": H, "width": W}
  doc = {
    "images": [
      {"id": 1, "file_name": "a.png", **size},
      {"id": 2, "file_name": "b.png", **size},
      {"id": 7, "file_name": "a.png", **size},  # a.png again, from another export.
      {"id": 8, "file_name": "b.png", "height": H + 1, "width": W},  # Another size: kept apart.
    ],
    "annotations": [
      {"id": n, "image_id": i, "segmentation": [_box(1, 1, 9, 9)]}
      for n, i in ((10, 1), (11, 7), (12, 2), (13, 8))
    ],
  }
  path = tmp_path / "instances.json"
  path.write_text(json.dumps(doc))
  out = list(coco._EntriesFn().process(str(path)))  # pylint: disable=protected-access
  images = [o.value for o in out if getattr(o, "tag", None) == "images"]
  assert [(i, e["file_name"]) for i, e in images] == [
    ("1", "a.png"),
    ("2", "b.png"),
    ("8", "b.png"),
  ]
  annotations = [(key, ann["id"]) for key, ann in (o for o in out if isinstance(o, tuple))]
  assert annotations == [("1", 10), ("1", 11), ("2", 12), ("8", 13)]
