"""The whole path for real: Beam pipeline, training, export, prediction.

The exported model must keep predicting after the pipeline's output
directory (records and tf.Transform output) is deleted.
"""

import json
import os
import shutil

import numpy as np
import pytest
from PIL import Image


def test_pipeline_train_export_predict_without_prep_dir(prep_dir, sample_dir, tmp_path):
  from train import cli as train_cli  # pylint: disable=g-import-not-at-top

  data = str(tmp_path / "prep")
  shutil.copytree(prep_dir, data)
  model_dir = str(tmp_path / "model")
  with pytest.raises(SystemExit) as e:
    train_cli.main(
      [
        "fit",
        "--data",
        data,
        "--model-dir",
        model_dir,
        "--steps",
        "12",
        "--batch-size",
        "4",
        "--width",
        "8",
        "--depth",
        "2",
        "--log-every",
        "6",
        "--checkpoint-every",
        "6",
        # NoC after fit: tests/train/test_noc.py.
        "--noc-clicks",
        "0",
      ]
    )
  assert e.value.code == 0
  metrics = json.load(open(os.path.join(model_dir, "metrics.json")))
  assert metrics["final_step"] == 12 and metrics["step_traces"] == 1
  assert metrics["eval"]["examples"] > 0 and 0 <= metrics["eval"]["mean_iou"] <= 1
  assert json.load(open(os.path.join(model_dir, "config.json")))["steps"] == 12
  export_dir = metrics["export_dir"]
  assert os.path.exists(os.path.join(export_dir, "saved_model.pb"))

  shutil.rmtree(data)

  image_path = os.path.join(
    sample_dir, "images", sorted(os.listdir(os.path.join(sample_dir, "images")))[0]
  )
  w, h = Image.open(image_path).size
  out = str(tmp_path / "pred" / "mask.png")
  with pytest.raises(SystemExit) as e:
    train_cli.main(
      [
        "predict",
        "--model",
        model_dir,
        "--image",
        image_path,
        "--positive",
        f"{w // 2},{h // 2}",
        "--negative",
        "2,2",
        "--output",
        out,
      ]
    )
  assert e.value.code == 0
  mask = np.asarray(Image.open(out))
  assert mask.shape == (h, w) and set(np.unique(mask)) <= {0, 255}
  overlay = Image.open(str(tmp_path / "pred" / "mask_overlay.png")).convert("RGB")
  k = overlay.size[0] // w
  assert overlay.size == (w * k, h * k) and max(overlay.size) >= 512  # enlarged, sharp
  px = np.asarray(overlay)
  cy, cx = int((h // 2 + 0.5) * k), int((w // 2 + 0.5) * k)
  assert tuple(px[cy, cx]) == (0, 230, 0)  # the positive click, where it was given
  assert tuple(px[int(2.5 * k), int(2.5 * k)]) == (240, 0, 0)


def test_resumed_run_reaches_the_same_step(prep_dir, tmp_path):
  from train import cli as train_cli  # pylint: disable=g-import-not-at-top

  model_dir = str(tmp_path / "model")
  common = [
    "fit",
    "--data",
    prep_dir,
    "--model-dir",
    model_dir,
    "--batch-size",
    "4",
    "--width",
    "4",
    "--depth",
    "1",
    "--checkpoint-every",
    "5",
    "--no-export",
    "--noc-clicks",
    "0",
  ]
  for steps in ("5", "9"):
    with pytest.raises(SystemExit) as e:
      train_cli.main(common + ["--steps", steps])
    assert e.value.code == 0
  metrics = json.load(open(os.path.join(model_dir, "metrics.json")))
  assert metrics["final_step"] == 9 and metrics["steps_this_run"] == 4
