"""The data engine: labels saved through the server train the next model in
a background round (`serve --engine-every`), with the served model's own
transform, and the server serves the published export without a restart;
a round without new labels does not run."""

import base64
import io
import json
import os
import shutil
import threading
import time

import numpy as np
import pytest
from PIL import Image

from beam_prep import keys
from beam_prep.layouts import folders
from train import engine
from train.export.saved_model import latest_export
from train.serve import app as serve_app
from train.serve.config import ServeConfig


def _levels_url(mask: np.ndarray) -> str:
  """A mask as the page sends an object: its probability levels (99 inside)."""
  buf = io.BytesIO()
  Image.fromarray(np.where(mask, 99, 0).astype(np.uint8), "L").save(buf, format="PNG")
  return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _label(client, sample_dir: str, name: str) -> None:
  """Uploads a sample image and saves its true objects as a person's labels."""
  image_path = os.path.join(sample_dir, folders.IMAGES_DIR, name)
  with open(image_path, "rb") as f:
    data = f.read()
  r = client.post(
    "/page/upload", data={"file": (io.BytesIO(data), name)}, content_type="multipart/form-data"
  )
  key = r.get_json()["id"]
  stem = os.path.splitext(name)[0]
  truth = np.asarray(
    Image.open(os.path.join(sample_dir, folders.MASKS_DIR, stem + folders.MASK_SUFFIX))
  )
  objects = [
    {"probabilities": _levels_url(truth == i), "positive": [[0, 0]]}
    for i in sorted(set(np.unique(truth).tolist()) - {0, keys.IGNORE})
  ]
  r = client.post("/page/save", json={"id": key, "objects": objects})
  assert r.status_code == 200, r.get_json()


def test_saved_labels_train_the_next_version_in_the_background(trained, sample_dir, tmp_path):
  model = tmp_path / "model"
  shutil.copytree(trained, model)
  base_version = int(os.path.basename(latest_export(str(model))))
  labels = tmp_path / "labels"
  config = ServeConfig(
    model=str(model),
    model_name="cat",
    port=0,
    save_dir=str(labels),
    poll_seconds=0.5,
    engine_every=3,
    engine_steps=3,
    engine_minutes=0,
    engine_lr_scale=0.5,
  )
  server, versions = serve_app.start(config)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  client, rounds = server.app.test_client(), server.app.extensions[serve_app.ROUNDS]
  try:
    names = sorted(os.listdir(os.path.join(sample_dir, folders.IMAGES_DIR)))[:3]
    for name in names[:2]:
      _label(client, sample_dir, name)
    assert not rounds.running  # Two of three.
    _label(client, sample_dir, names[2])
    assert rounds.running
    assert rounds.wait(600) and rounds.finished == 1, open(
      labels / engine.ENGINE_DIR / "rounds.log"
    ).read()[-3000:]
    deadline = time.time() + 120
    while versions.current.version == base_version and time.time() < deadline:
      time.sleep(0.2)
    (done,) = engine.rounds(str(labels / engine.ENGINE_DIR))
    assert versions.current.version == done["version"] > base_version
    assert done["images"] == done["new_images"] == 3 and done["from"] == str(model)
    # The round's records were read with the served model's transform, not a new one.
    with open(os.path.join(done["model_dir"], keys.MODEL_CONFIG_FILE)) as f:
      round_config = json.load(f)
    round_data = round_config["data"]
    with open(os.path.join(str(model), keys.MODEL_CONFIG_FILE)) as f:  # --engine-lr-scale 0.5
      assert round_config["learning_rate"] == json.load(f)["learning_rate"] * 0.5
    with open(os.path.join(round_data, keys.CONFIG_FILE)) as f:
      assert json.load(f)["transform_from"] == str(model)
    status = client.get("/v1/models/cat").get_json()["model_version_status"]
    assert [s["state"] for s in status] == ["AVAILABLE", "END"]
  finally:
    server.shutdown()
  # Nothing labelled since: no round.
  log = _Log()
  assert (
    engine.run_round(engine.EngineConfig(labels=str(labels), model=str(model), steps=3), log)
    is None
  )
  assert "no round" in log.lines[-1]


class _Log:
  def __init__(self):
    self.lines = []

  def info(self, fmt, *args):
    self.lines.append(fmt % args)


def test_a_rounds_records_take_in_the_base_models_own_at_the_share_asked(
  prep_dir, trained, tmp_path
):
  """`--base-share`: the base's train shards join a round's records as a shard
  set of their own, the labels' repeated to make up the rest; records of other
  features are refused."""
  from beam_prep.prep_output import PrepOutput  # pylint: disable=g-import-not-at-top

  assert engine.label_copies(670, 60, 0.5) == 11 and engine.label_copies(670, 60, 0.0) == 1
  assert engine.label_copies(10, 100, 0.5) == 1  # The labels are read at least once.
  own = str(tmp_path / "round")
  shutil.copytree(prep_dir, own)
  config = engine.EngineConfig(labels=str(tmp_path), model=trained, base_share=0.2)
  base = PrepOutput.of_model(trained)
  mix = engine.mix_base(config, own)
  n = base.manifest["shards"][keys.TRAIN_SPLIT]["records"]
  assert mix == {
    "base_records": n,
    "label_records": n,
    "label_copies": engine.label_copies(n, n, 0.2),
  }
  files = PrepOutput(own).files(keys.TRAIN_SPLIT)
  base_files = base.files(keys.TRAIN_SPLIT)
  assert len(files) == len(base_files) * (1 + mix["label_copies"])
  assert len([f for f in files if "-base-" in f]) == len(base_files)
  read = sum(1 for _ in PrepOutput(own).dataset(keys.TRAIN_SPLIT))
  assert read == n * (1 + mix["label_copies"])
  other = str(tmp_path / "other")
  shutil.copytree(prep_dir, other)
  features = json.load(open(os.path.join(other, "features.json")))
  features["image_size"] = [int(v) + 2 for v in features["image_size"]]
  json.dump(features, open(os.path.join(other, "features.json"), "w"))
  with pytest.raises(RuntimeError, match="hold other features than the round's"):
    engine.mix_base(config, other)
  with pytest.raises(ValueError, match="--base-share must be in"):
    engine.EngineConfig(labels="l", model="m", base_share=1.0)
  with pytest.raises(ValueError, match="--lr-scale must be above 0"):
    engine.EngineConfig(labels="l", model="m", lr_scale=0)
  # serve refuses a background round's bad setting when it starts, not in the round.
  with pytest.raises(ValueError, match=r"\(--engine-\*\): --base-share must be in"):
    ServeConfig(model="m", save_dir="l", engine_every=3, engine_base_share=1.5)


def _ids(labels: str):
  return {os.path.splitext(n)[0] for n in os.listdir(os.path.join(labels, folders.IMAGES_DIR))}


def test_a_round_adds_what_was_labelled_since_and_reads_all_after_a_relabel(
  sample_dir, prep_dir, trained, tmp_path
):
  """From the second round on, the last round's records are linked in and only
  the images labelled since are added; an image drawn again, or one no longer
  labelled, makes the round read every label anew. The last round's folder
  is never changed."""
  from tests.pipelines.test_add import _input  # pylint: disable=g-import-not-at-top

  labels = _input(tmp_path, sample_dir, new=2, relabel=False)
  config = engine.EngineConfig(labels=labels, model=trained)
  last = str(tmp_path / "last")
  shutil.copytree(prep_dir, last)  # As if the last round had read the sample.
  before = open(os.path.join(last, keys.MANIFEST_FILE)).read()
  log_path = str(tmp_path / "round.log")
  second = str(tmp_path / "second")
  _, how = engine._prep(config, trained, second, log_path, last, _ids(labels))  # pylint: disable=protected-access
  assert how == {"mode": "add", "images_added": 2, "images_held": 10}, open(log_path).read()
  assert open(os.path.join(last, keys.MANIFEST_FILE)).read() == before
  assert os.path.exists(os.path.join(second, keys.SUCCESS_FILE))
  # One of the images drawn again: its old records must not stay.
  masks = sorted(os.listdir(os.path.join(labels, folders.MASKS_DIR)))
  mask = os.path.join(labels, folders.MASKS_DIR, masks[0])
  Image.fromarray(np.zeros_like(np.asarray(Image.open(mask)))).save(mask)
  third = str(tmp_path / "third")
  _, how = engine._prep(config, trained, third, log_path, second, _ids(labels))  # pylint: disable=protected-access
  assert how["mode"] == "all" and "1 image(s) labelled again" in how["why"], how
  with open(os.path.join(third, keys.MANIFEST_FILE)) as f:
    m = json.load(f)
  assert "sets" not in m and m["counts"]["inputs_read"] == 12
  with open(os.path.join(second, keys.MANIFEST_FILE)) as f:
    assert [s["name"] for s in json.load(f)["sets"]] == ["", "add0001"]
  # An image no longer labelled: its records must not stay either.
  assert engine._why_all(third, _ids(labels)) == ""  # pylint: disable=protected-access
  gone = _ids(labels) - {os.path.splitext(masks[1])[0]}
  assert engine._why_all(third, gone) == "1 image(s) no longer labelled"  # pylint: disable=protected-access
  assert engine._why_all(None, gone) == "the first round"  # pylint: disable=protected-access
