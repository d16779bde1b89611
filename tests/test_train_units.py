"""Trainer pieces on small in-memory data."""

import numpy as np
import pytest
import tensorflow as tf

from train.loop import FinalizedFunction, RetraceError
from train.tasks import SegmentationTask, _mask_counts


def test_finalized_step_raises_on_a_changed_shape():
  step = FinalizedFunction(lambda x: tf.reduce_sum(x), "step")
  assert float(step(tf.ones([2, 3]))) == 6.0
  assert float(step(tf.zeros([2, 3]))) == 0.0
  assert step.traces == 1
  with pytest.raises(RetraceError, match=r"float32\[2, 3\].*float32\[4, 3\]"):
    step(tf.ones([4, 3]))


def test_loss_ignores_weighted_out_pixels_and_counts_iou():
  label = np.zeros((1, 4, 4, 1), np.float32)
  label[0, :2] = 1
  weight = np.ones_like(label)
  weight[0, 3] = 0
  logits = np.where(label > 0, 5.0, -5.0).astype(np.float32)
  logits[0, 3] = 5.0  # wrong, but ignored
  labels = {"label": tf.constant(label), "label_weight": tf.constant(weight)}
  loss = SegmentationTask.loss(None, labels, tf.constant(logits)).numpy()
  assert loss.shape == (1,) and loss[0] < 0.05
  logits_bad = np.where(label > 0, -5.0, 5.0).astype(np.float32)
  assert SegmentationTask.loss(None, labels, tf.constant(logits_bad)).numpy()[0] > 1.0
  c = _mask_counts(labels, tf.constant(logits)).numpy()[0]
  assert c.tolist() == [1.0, 12.0, 12.0]  # IoU 8/8 over the counted pixels; 12 of 12 right


def test_sample_data_is_deterministic(tmp_path):
  from beam_prep.sample_data import make_scene, write_sample_data  # pylint: disable=g-import-not-at-top
  a, b = make_scene(5, 2), make_scene(5, 2)
  np.testing.assert_array_equal(a[0], b[0])
  np.testing.assert_array_equal(a[1], b[1])
  ids = set(np.unique(a[1]).tolist())
  assert 0 in ids and 255 in ids and len(ids - {0, 255}) >= 2
  write_sample_data(str(tmp_path / "x"), count=3, seed=1)
  write_sample_data(str(tmp_path / "y"), count=3, seed=1)
  for sub in ("images", "masks"):
    names = sorted((tmp_path / "x" / sub).iterdir())
    assert len(names) == 3
    for n in names:
      assert n.read_bytes() == (tmp_path / "y" / sub / n.name).read_bytes()


def test_fit_refuses_an_unknown_option_with_the_closest_known_one(capsys):
  import pytest  # pylint: disable=g-import-not-at-top
  from train import cli as train_cli  # pylint: disable=g-import-not-at-top
  with pytest.raises(SystemExit) as e:
    train_cli.main(["fit", "--data", "x", "--model-dir", "y", "--stpes", "3"])
  assert e.value.code == 2
  assert "unknown option --stpes (did you mean --steps?)" in capsys.readouterr().out
  with pytest.raises(SystemExit):
    train_cli.main(["fit", "--help"])
  from train.config import TrainConfig  # pylint: disable=g-import-not-at-top
  steps = TrainConfig.__dataclass_fields__["steps"].default
  assert f"total steps for the model directory (default: {steps})" in " ".join(
      capsys.readouterr().out.split())
