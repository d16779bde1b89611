"""A real Label Studio (1.23, installed by `make label-studio`: see
tests/label_studio_env.py) uses `beam-train serve` as its interactive ML
backend: a project, an uploaded image, the backend connected, keypoint and
rectangle calls through Label Studio's own interactive-annotating route,
and an annotation whose webhook reaches the label store (and whose deletion
removes it)."""

import json
import os
import time

import numpy as np
import pytest

from tests import label_studio_env as lse
from tests.helpers import png
from train.serve import app as serve_app
from beam_prep import brush, keys
from beam_prep.layouts import coco
from beam_prep.layouts import label_studio as ls_layout
from train.serve.config import ServeConfig
from train.serve.store import Labels

H, W = 72, 96


@pytest.fixture(scope="module")
def label_studio(tmp_path_factory):
  """Label Studio's URL, running on a copy of the migrated data folder."""
  why = lse.unavailable()
  if why:
    pytest.skip(f"Label Studio {lse.VERSION} cannot be used here: {why} (make label-studio)")
  with lse.running(str(tmp_path_factory.mktemp("ls"))) as url:
    yield url


def _disk():
  yy, xx = np.mgrid[:H, :W]
  return (xx - 30) ** 2 + (yy - 36) ** 2 <= 18**2


def _scene():
  image = np.full((H, W, 3), 90, np.uint8)
  image[_disk()] = (220, 40, 30)
  return image


def _until(predicate, what, timeout=30):
  deadline = time.time() + timeout
  while not predicate():
    assert time.time() < deadline, f"Label Studio's webhook never arrived: {what}"
    time.sleep(0.2)


def _interactive(url, ml, task, regions):
  """The brush region the backend answered through Label Studio, and its mask."""
  body = {"task": task, "context": {"result": regions}}
  answer = lse.api(url, "POST", f"/api/ml/{ml}/interactive-annotating", body)
  assert "data" in answer, answer
  (region,) = answer["data"]["result"]
  return region, brush.decode(region["value"]["rle"], H, W)


def test_label_studio_calls_the_server_and_its_annotations_reach_the_label_store(
  label_studio, trained, trained_served, tmp_path
):
  save = str(tmp_path / "labels")
  with serve_app.running(ServeConfig(model=trained, port=0, save_dir=save)) as (server, _):
    backend = f"http://127.0.0.1:{server.port}"
    project, task, ml = lse.connect(label_studio, backend, "scene.png", png(_scene()))
    point = lse.keypoint(30, 36, W, H)
    region, mask = _interactive(label_studio, ml, task, [point])
    want = trained_served.segment(_scene(), [[30, 36]], [])["mask"] > 0
    np.testing.assert_array_equal(mask, want)  # The page's mask for the same click.
    box = {
      "type": "rectanglelabels",
      "from_name": "rect",
      "to_name": "image",
      "original_width": W,
      "original_height": H,
      "value": {"x": 10.0, "y": 20.0, "width": 50.0, "height": 60.0, "rectanglelabels": ["Object"]},
    }
    _, cut = _interactive(label_studio, ml, task, [box])
    corners = (int(0.1 * W), int(0.2 * H), int(0.6 * W), int(0.8 * H))
    boxed = trained_served.segment(_scene(), [], [], box=corners)["mask"] > 0
    np.testing.assert_array_equal(cut, boxed)  # serve_box's mask for the rectangle.
    labels = Labels(save)
    try:
      # The backend's region, corrected to the disk by the annotator (the
      # suggestion of the suite's briefly trained model may be empty).
      drawn = dict(region["value"], rle=brush.encode(_disk()))
      result = [dict(region, id="r1", value=drawn)]
      made = lse.api(label_studio, "POST", f"/api/tasks/{task}/annotations/", {"result": result})
      _until(lambda: labels.count() == 1, "ANNOTATION_CREATED")
      (entry,) = labels.entries()
      assert entry["origin"]["annotation"] == made["id"] and entry["origin"]["task"] == task
      assert os.path.isfile(os.path.join(save, entry["file_name"]))
      _check_the_export(label_studio, project, _disk(), tmp_path)
      lse.api(label_studio, "DELETE", f"/api/annotations/{made['id']}/")
      _until(lambda: labels.count() == 0, "ANNOTATIONS_DELETED")
    finally:
      labels.close()


def _check_the_export(url, project, mask, tmp_path):
  """The project's JSON export, read by the label_studio layout with the
  images' own copy as its image root: the annotation's brush, drawn."""
  export = tmp_path / "export.json"
  export.write_text(
    json.dumps(lse.api(url, "GET", f"/api/projects/{project}/export?exportType=JSON"))
  )
  (tmp_path / "images").mkdir()
  (tmp_path / "images" / "scene.png").write_bytes(png(_scene()))
  (pointer,) = ls_layout.task_pointers(str(export), str(tmp_path / "images"), False)
  drawn = coco.materialize(pointer)
  assert drawn["object_errors"] == [] and pointer["objects_listed"] == 1
  np.testing.assert_array_equal(drawn[keys.INSTANCE_MASK] == 1, mask)
