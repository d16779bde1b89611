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

from tests.helpers import FIT_ARGS


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
        "4",
        "--batch-size",
        "4",
        "--width",
        "4",
        "--depth",
        "2",
        "--log-every",
        "2",
        "--checkpoint-every",
        "2",
        # NoC after fit: tests/train/test_noc.py.
        "--noc-clicks",
        "0",
      ]
    )
  assert e.value.code == 0
  metrics = json.load(open(os.path.join(model_dir, "metrics.json")))
  assert metrics["final_step"] == 4 and metrics["step_traces"] == 1
  assert metrics["eval"]["examples"] > 0 and 0 <= metrics["eval"]["mean_iou"] <= 1
  assert json.load(open(os.path.join(model_dir, "config.json")))["steps"] == 4
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


def test_a_finished_run_given_more_steps_resumes_from_its_checkpoint(
  prep_dir, trained, tmp_path, capsys
):
  """The session's model (6 steps, its last checkpoint at the end) trained on
  with the same flags and more steps: it resumes, not restarts."""
  from train import cli as train_cli  # pylint: disable=g-import-not-at-top

  model_dir = str(tmp_path / "model")
  shutil.copytree(trained, model_dir)
  done = json.load(open(os.path.join(model_dir, "metrics.json")))["final_step"]
  argv = ["fit", "--data", prep_dir, "--model-dir", model_dir, "--steps", str(done + 3)]
  with pytest.raises(SystemExit) as e:
    train_cli.main(argv + FIT_ARGS + ["--no-export"])
  assert e.value.code == 0
  assert f"at step {done}\n" in capsys.readouterr().out
  metrics = json.load(open(os.path.join(model_dir, "metrics.json")))
  assert metrics["final_step"] == done + 3 and metrics["steps_this_run"] == 3
