"""Served versions: a newer export under the model dir is served without a
restart (TF Serving's latest-version policy), every version is listed, a
version that fails to load is listed with its error while the one serving
goes on, and each saved label records the version that made its mask."""

import io
import os
import shutil
import time

import numpy as np
import pytest

from tests.helpers import png
from train import model_layout
from train.export.saved_model import latest_export
from train.serve import app as serve_app
from train.serve.config import ServeConfig

NAME = "cat"


@pytest.fixture
def model_dir(trained, tmp_path):
  """A model dir holding one export, the trained model's, as version 100."""
  root = tmp_path / "model"
  shutil.copytree(latest_export(trained), root / model_layout.EXPORT_DIR / "100")
  return root


def _new_version(model_dir, version: int, source: int = 100):
  """A new version appears as an export does: written beside, then renamed in."""
  export = model_dir / model_layout.EXPORT_DIR
  shutil.copytree(export / str(source), export / f".tmp-{version}")
  os.rename(export / f".tmp-{version}", export / str(version))


def _states(client):
  status = client.get(f"/v1/models/{NAME}").get_json()["model_version_status"]
  return [(int(s["version"]), s["state"]) for s in status]


def _upload(client):
  image = np.random.default_rng(0).integers(0, 255, (40, 56, 3), dtype=np.uint8)
  r = client.post(
    "/page/upload",
    data={"file": (io.BytesIO(png(image)), "x.png")},
    content_type="multipart/form-data",
  )
  return r.get_json()["id"]


def test_a_newer_export_is_served_without_a_restart_and_labels_name_their_version(
  model_dir, tmp_path
):
  config = ServeConfig(
    model=str(model_dir),
    model_name=NAME,
    port=0,
    poll_seconds=0.2,
    save_dir=str(tmp_path / "labels"),
  )
  with serve_app.running(config) as (server, versions):
    client = server.app.test_client()
    key = _upload(client)
    first = client.post("/page/segment", json={"id": key, "positive": [[20, 20]]}).get_json()
    assert first["version"] == 100 and _states(client) == [(100, "AVAILABLE")]
    _new_version(model_dir, 200)
    deadline = time.time() + 120
    while versions.current.version != 200 and time.time() < deadline:
      time.sleep(0.1)
    assert _states(client) == [(200, "AVAILABLE"), (100, "END")]
    assert (
      client.get(f"/v1/models/{NAME}/versions/100").get_json()["model_version_status"][0]["state"]
      == "END"
    )
    r = client.post(f"/v1/models/{NAME}/versions/100:predict", json={"instances": []})
    assert r.status_code == 404 and "version 200" in r.get_json()["error"]
    assert client.get(f"/v1/models/{NAME}/versions/200/metadata").status_code == 200
    second = client.post("/page/segment", json={"id": key, "positive": [[30, 20]]}).get_json()
    assert second["version"] == 200
    assert client.get("/page/sources").get_json()["versions"] == [200, 100]
    objects = [
      {
        "probabilities": first["probabilities"],
        "positive": [[20, 20]],
        "version": first["version"],
      },
      {"probabilities": second["probabilities"], "positive": [[30, 20]]},
    ]
    assert client.post("/page/save", json={"id": key, "objects": objects}).status_code == 200
    bad = dict(objects[0], version="new")
    r = client.post("/page/save", json={"id": key, "objects": [bad]})
    assert r.status_code == 400 and r.get_json()["error"].startswith("objects[0].version")
    got = client.post("/page/open", json={"saved": "images/x.png"}).get_json()["objects"]
    assert [o["version"] for o in got] == [100, 200]


def test_a_version_that_fails_to_load_is_listed_and_the_one_serving_goes_on(model_dir):
  from train.serve.versions import Versions  # pylint: disable=g-import-not-at-top

  versions = Versions(str(model_dir), NAME)
  broken = model_dir / model_layout.EXPORT_DIR / "300"
  broken.mkdir()
  (broken / "saved_model.pb").write_bytes(b"not a SavedModel")
  assert not versions.poll() and versions.current.version == 100
  assert not versions.poll()  # Not tried again.
  status = versions.status(NAME)["model_version_status"]
  assert [(s["version"], s["state"]) for s in status] == [("300", "END"), ("100", "AVAILABLE")]
  assert status[0]["status"]["error_code"] != "OK" and status[0]["status"]["error_message"]
  _new_version(model_dir, 400)
  assert versions.poll() and versions.current.version == 400


def test_one_export_folder_is_served_as_it_is(model_dir):
  from train.serve.versions import Versions  # pylint: disable=g-import-not-at-top

  versions = Versions(str(model_dir / model_layout.EXPORT_DIR / "100"), NAME)
  _new_version(model_dir, 500)
  assert not versions.watched and not versions.poll() and versions.current.version == 100
