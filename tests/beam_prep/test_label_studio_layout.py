"""Label Studio's JSON export as an input layout: its regions drawn as
instance masks, the annotation and the image file each task's is read
from, and a job over an export."""

import json
import os

import numpy as np
from PIL import Image

from beam_prep import brush, readers
from beam_prep.layouts import coco
from beam_prep.layouts import label_studio as ls
from tests.helpers import dead_letters, manifest, records, run_cli

H, W = 40, 80


def _region(kind, value, rid, **extra):
  body = {"original_width": W, "original_height": H, "image_rotation": 0, "value": value}
  body.update(id=rid, type=kind, from_name="tag", to_name="image", **extra)
  return body


def _brush(mask, rid="b"):
  return _region("brushlabels", {"format": "rle", "rle": brush.encode(mask)}, rid)


def _percent(x, y):
  return [100 * x / W, 100 * y / H]


def _polygon(points, rid="p"):
  return _region("polygonlabels", {"points": [_percent(x, y) for x, y in points]}, rid)


def _rectangle(x0, y0, x1, y1, rid="r"):
  x, y = _percent(x0, y0)
  width, height = _percent(x1 - x0, y1 - y0)
  return _region("rectanglelabels", {"x": x, "y": y, "width": width, "height": height}, rid)


def _drawn(results):
  """An annotation's instance mask and its rows' errors, as the job draws them."""
  size, rows = ls.annotation_rows(results, "export.json:task[0]")
  return coco.instance_mask({"id": "1", **size, "annotations": rows}, "a")


def test_regions_become_objects_rectangles_ignore_and_one_id_one_object():
  blob = np.zeros((H, W), bool)
  blob[5:15, 50:70] = True
  ellipse = {"x": 25.0, "y": 75.0, "radiusX": 7.5, "radiusY": 10.0, "rotation": 0}
  results = [
    _brush(blob),
    _polygon([(2, 2), (12, 2), (12, 10), (2, 10)]),
    _region("ellipselabels", ellipse, "e"),
    _rectangle(30, 2, 40, 12),
    _region("keypointlabels", {"x": 50.0, "y": 50.0, "width": 1}, "k"),
    _region("choices", {"choices": ["a"]}, "p"),  # A per-region attribute of the polygon.
    _polygon([(70, 30), (76, 30), (76, 36), (70, 36)], rid="g"),
    _polygon([(60, 30), (64, 30), (64, 36), (60, 36)], rid="g"),
  ]
  mask, errors = _drawn(results)
  assert errors == []
  np.testing.assert_array_equal(mask == 1, blob)
  assert (mask == 2).sum() == 10 * 8 and (mask[2:10, 2:12] == 2).all()
  assert 60 < (mask == 3).sum() < 90 and mask[30, 20] == 3  # pi * 6 * 4 = 75
  assert (mask[2:12, 30:40] == 255).all()  # The rectangle: ignore.
  grouped = mask == 4  # Two polygons of one region id: one object.
  assert grouped[30:36, 70:76].all() and grouped[30:36, 60:64].all() and grouped.sum() == 60
  assert set(np.unique(mask).tolist()) == {0, 1, 2, 3, 4, 255}


def test_shape_tags_beside_a_labels_tag_are_read_as_the_labelled_kinds():
  """<Polygon>, <Brush>, <Ellipse>, <Rectangle> with a separate <Labels>: each
  region is its shape's result plus a "labels" result of the same id."""
  labelled = [
    _brush(np.eye(H, W, dtype=bool), rid="b"),
    _polygon([(2, 2), (12, 2), (12, 10), (2, 10)]),
    _region("ellipselabels", {"x": 25.0, "y": 75.0, "radiusX": 7.5, "radiusY": 10.0}, "e"),
    _rectangle(30, 2, 40, 12),
  ]
  plain = []
  for r in labelled:
    plain.append(dict(r, type=r["type"][: -len("labels")]))
    plain.append(_region("labels", {"labels": ["Object"]}, r["id"]))
  (mask, errors), (want, _) = _drawn(plain), _drawn(labelled)
  assert errors == [] and set(np.unique(mask).tolist()) == {0, 1, 2, 3, 255}
  np.testing.assert_array_equal(mask, want)


def test_a_turned_rectangle_ignores_the_box_of_its_corners():
  (x0, y0), (x1, y1) = _percent(40, 10), _percent(10, 10)
  value = {"x": x0, "y": y0, "width": x1, "height": y1, "rotation": 90}
  corners = ls.rectangle_corners(value, W, H)
  np.testing.assert_allclose(corners, [(40, 10), (40, 20), (30, 20), (30, 10)], atol=1e-9)


def test_an_unreadable_region_is_a_dead_letter_naming_it():
  bad_rle = _brush(np.ones((H, W), bool))
  bad_rle["value"]["rle"] = bad_rle["value"]["rle"][:-3]
  other_size = _polygon([(1, 1), (9, 1), (9, 9)], rid="q")
  other_size["original_width"] = W * 2
  results = [bad_rle, _polygon([(1, 1), (5, 1)]), other_size]
  _, errors = _drawn(results)
  assert [e["reason"] for e in errors] == ["bad_shape"] * 3
  assert errors[1]["source"] == "export.json:task[0].result[1]"
  assert "2 points: a polygon needs 3 or more" in errors[1]["detail"]
  assert f"drawn on a {2 * W}x{H} image, not {W}x{H}" in errors[2]["detail"]


def test_the_ground_truth_else_the_last_updated_annotation_not_cancelled_is_read():
  a = {"id": 1, "updated_at": "2026-01-02T00:00:00Z", "result": []}
  b = {"id": 2, "updated_at": "2026-01-03T00:00:00Z", "result": []}
  cancelled = {"id": 3, "updated_at": "2026-01-04T00:00:00Z", "was_cancelled": True}
  assert ls.chosen_annotation({"annotations": [a, b, cancelled]})["id"] == 2
  assert (
    ls.chosen_annotation(
      {"annotations": [a, dict(b, ground_truth=False), dict(a, id=4, ground_truth=True)]}
    )["id"]
    == 4
  )
  assert ls.chosen_annotation({"annotations": [cancelled]}) is None
  assert ls.chosen_annotation({"annotations": []}) is None


def test_where_a_tasks_image_is_looked_for(tmp_path):
  assert ls.candidates("/data/upload/3/1a2b3c4d-horse%201.png") == [
    "3/1a2b3c4d-horse 1.png",
    "1a2b3c4d-horse 1.png",
    "horse 1.png",
  ]
  assert ls.candidates("/data/local-files/?d=photos/sub/a.jpg") == ["photos/sub/a.jpg", "a.jpg"]
  assert ls.candidates("https://example.com/img/a.jpg?x=1") == ["a.jpg"]
  assert ls.candidates("gs://bucket/img/a.jpg") == ["gs://bucket/img/a.jpg"]
  assert ls.candidates("img/a.jpg") == ["img/a.jpg"]
  assert ls.image_reference({"data": {"photo": "/data/upload/1/x.png"}}) == "/data/upload/1/x.png"
  export = tmp_path / "export.json"
  export.write_text(json.dumps([_task(1, "gs://bucket/img/a.jpg", [{"id": 1, "result": []}])]))
  (inside,) = ls.task_pointers(str(export), "gs://bucket", False)
  assert inside["source"] == "gs://bucket/img/a.jpg"  # Read where it is.
  (outside,) = ls.task_pointers(str(export), str(tmp_path), False)  # Not under the image root.
  assert outside.value["reason"] == "path_outside_root"


def _task(tid, image, annotations):
  return {"id": tid, "data": {"image": image}, "annotations": annotations, "predictions": []}


def _export(root):
  """An export and its images: uploads found by their original name, one in
  a folder of local files, one missing, one task unlabelled, one not a task,
  one outside the image root, one image listed twice."""
  os.makedirs(root / "images" / "sub")
  for name in ("horse.png", "sub/cow.jpg"):
    Image.new("RGB", (W, H), (90, 120, 40)).save(root / "images" / name)
  blob = np.zeros((H, W), bool)
  blob[5:30, 10:40] = True
  square = _polygon([(45, 5), (75, 5), (75, 35), (45, 35)])
  tasks = [
    _task(1, "/data/upload/2/1a2b3c4d-horse.png", [{"id": 10, "result": [_brush(blob), square]}]),
    _task(
      2,
      "/data/local-files/?d=sub/cow.jpg",
      [{"id": 11, "result": [square, _rectangle(2, 2, 8, 8)]}],
    ),
    _task(3, "/data/upload/2/0a0b0c0d-gone.png", [{"id": 12, "result": [square]}]),
    _task(4, "/data/upload/2/5e6f7a8b-horse.png", []),
    ["not", "a", "task"],
    _task(5, "/data/local-files/?d=../../secret.png", [{"id": 13, "result": [square]}]),
    _task(6, "/data/local-files/?d=sub/cow.jpg", [{"id": 14, "result": [square]}]),
  ]
  (root / "export.json").write_text(json.dumps(tasks))


def test_a_job_over_an_export_accounts_for_every_task(tmp_path, capsys):
  _export(tmp_path)
  path = str(tmp_path / "export.json")
  assert readers.resolve_layout(path, "auto").name == "label_studio"
  out = str(tmp_path / "out")
  argv = ["segmentation", "--input", path, "--image-root", str(tmp_path / "images")]
  argv += ["--output", out, "--image-size", "32", "--variants", "1", "--eval-percent", "0"]
  assert run_cli(argv + ["--progress-seconds", "0", "--max-error-fraction", "1"]) == 0
  c = manifest(out)["counts"]
  reasons = {"missing_image": 1, "no_annotation": 1, "bad_task": 1, "path_outside_root": 1}
  reasons["duplicate_image_id"] = 1  # Task 6's image is task 2's.
  assert c["images_used"] == 2 and c["errors_by_reason"] == reasons, c
  assert c["objects_used"] == 3 and c["objects_box_only"] == 1, c
  ids = {r.features.feature["image_id"].bytes_list.value[0].decode() for r in records(out, "train")}
  assert ids == {"horse", "sub/cow"}
  missing = next(d for d in dead_letters(out) if d["reason"] == "missing_image")
  assert missing["source"].endswith(os.path.join("images", "2", "0a0b0c0d-gone.png"))
  (tmp_path / "broken.json").write_text('[{"id": 1, "data": {"image": "a.png"}, "annotations": [')
  argv = ["segmentation", "--input", str(tmp_path / "broken.json"), "--layout", "label_studio"]
  assert run_cli(argv + ["--output", str(tmp_path / "broken")]) == 1
  said = capsys.readouterr().out
  assert "inputs/s" not in said  # --progress-seconds 0: no progress line.
  assert "broken.json is not a Label Studio JSON export (a list of tasks): Expecting" in said
  # JSON-MIN and CSV: regions without their types, refused before any work
  # (--layout auto would read them as manifests).
  row = {"image": "/data/upload/2/1a2b3c4d-horse.png", "id": 1, "tag": [], "annotator": 1}
  (tmp_path / "min.json").write_text(json.dumps([dict(row, annotation_id=3, lead_time=2.5)]))
  (tmp_path / "min.csv").write_text(
    "image,id,tag,annotator,annotation_id,created_at,updated_at,lead_time\n"
    '/data/upload/2/1a2b3c4d-horse.png,1,"[]",1,3,x,x,2.5\n'
  )
  for name in ("min.json", "min.csv"):
    argv = ["segmentation", "--input", str(tmp_path / name), "--output", str(tmp_path / "o")]
    assert run_cli(argv) == 2, name
    said = capsys.readouterr().out
    assert (
      "is Label Studio's JSON-MIN or CSV export" in said and "export the project as JSON" in said
    )
