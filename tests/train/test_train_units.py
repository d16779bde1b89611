"""Trainer pieces on small in-memory data."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from train.fit.train_step import FinalizedFunction, RetraceError
from train.tasks.segmentation import (
  LOSSES,
  SegmentationFitOptions,
  SegmentationTask,
  _mask_counts,
  normalized_focal_loss,
)
from tests.helpers import ROOT


def test_finalized_step_raises_on_a_changed_shape():
  step = FinalizedFunction(lambda x: tf.reduce_sum(x), "step")
  assert float(step(tf.ones([2, 3]))) == 6.0
  assert float(step(tf.zeros([2, 3]))) == 0.0
  assert step.traces == 1
  with pytest.raises(RetraceError, match=r"float32\[2, 3\].*float32\[4, 3\]"):
    step(tf.ones([4, 3]))


def test_python_control_flow_on_a_tensor_is_refused_with_the_fix_and_tf_function_converts_it():
  """The step is traced without AutoGraph: an `if` on a tensor fails, naming
  the fix; a function the user decorates with @tf.function is converted."""

  def branchy(x):
    return x * 2 if tf.reduce_sum(x) > 0 else x

  with pytest.raises(ValueError, match=r"step: .*tf\.cond.*@tf\.function"):
    FinalizedFunction(branchy, "step")(tf.ones([2]))
  assert float(tf.reduce_sum(FinalizedFunction(tf.function(branchy), "step")(tf.ones([2])))) == 4


def test_loss_ignores_weighted_out_pixels_and_counts_iou():
  label = np.zeros((1, 4, 4, 1), np.float32)
  label[0, :2] = 1
  weight = np.ones_like(label)
  weight[0, 3] = 0
  logits = np.where(label > 0, 5.0, -5.0).astype(np.float32)
  logits[0, 3] = 5.0  # wrong, but ignored
  labels = {"label": tf.constant(label), "label_weight": tf.constant(weight)}
  for name in LOSSES:
    task = SegmentationTask.__new__(SegmentationTask)
    task.settings = SegmentationFitOptions(loss=name)
    loss = task.loss(labels, tf.constant(logits)).numpy()
    assert loss.shape == (1,) and loss[0] < 0.05, name
    logits_bad = np.where(label > 0, -5.0, 5.0).astype(np.float32)
    assert task.loss(labels, tf.constant(logits_bad)).numpy()[0] > 1.0, name
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

  steps = TrainConfig.__dataclass_fields__["steps"]
  shown = " ".join(capsys.readouterr().out.split())
  # The flag's help and default are the field's own declaration.
  assert f"{steps.metadata['help']} (default: {steps.default})" in shown
  assert "(0: the whole eval split)" in shown and "(0: the whole eval split) (default" not in shown


def test_one_overlay_for_masks_and_clicks_needs_neither_tensorflow_nor_matplotlib():
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  from beam_prep import drawing  # pylint: disable=g-import-not-at-top

  code = (
    "import sys, beam_prep.drawing\n"
    "bad = [m for m in ('tensorflow', 'keras', 'matplotlib') if m in sys.modules]\n"
    "assert not bad, bad\n"
  )
  run = subprocess.run(
    [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
  )
  assert run.returncode == 0, run.stderr
  image = np.full((10, 20, 3), 100, np.uint8)
  mask = np.zeros((10, 20), bool)
  mask[2:5, 3:8] = True
  ignore = np.zeros((10, 20), bool)
  ignore[9] = True
  im = np.asarray(drawing.overlay(image, mask, [(15, 7)], [(1, 1)], scale=30, ignore=ignore))
  assert im.shape == (300, 600, 3)  # enlarged by a whole factor, nearest neighbour
  at = lambda x, y: tuple(im[int((y + 0.5) * 30), int((x + 0.5) * 30)])  # pixel (x, y)'s centre
  assert at(15, 7) == drawing.POSITIVE and at(1, 1) == drawing.NEGATIVE
  assert at(5, 3) == tuple(int(0.5 * 100 + 0.5 * c) for c in drawing.MASK_TINT)
  assert at(10, 8) == (100, 100, 100) and at(10, 9) == (50, 50, 50)


def test_noc_options_are_the_segmentation_tasks_own():
  """TrainConfig names no NoC setting: `--noc-clicks`/`--noc-objects` come from the
  segmentation training side's options, and land in `task_options`, checked there."""
  import dataclasses
  from train import cli
  from train.config import TrainConfig
  from train.tasks.segmentation import SegmentationFitOptions

  assert not {f.name for f in dataclasses.fields(TrainConfig)} & {
    f.name for f in dataclasses.fields(SegmentationFitOptions)
  }
  args = cli.fit_parser().parse_args(
    ["--data", "d", "--model-dir", "m", "--preset", "demo", "--noc-clicks", "5"]
  )
  config = cli.build_config(args)
  assert config.task_options == {"noc_clicks": 5, "noc_objects": 24}  # flag; preset
  task = SegmentationTask.__new__(SegmentationTask)
  task.settings = SegmentationFitOptions(**config.task_options)
  assert task.end_evaluations() == {"noc": "NoC"}
  assert TrainConfig.from_dict(dataclasses.asdict(config)) == config  # config.json read back
  with pytest.raises(ValueError, match="--noc-clicks must be >= 0, got -1"):
    TrainConfig.from_dict({"data": "d", "model_dir": "m", "noc_clicks": -1})
  for rate in (0.0, -1.0, float("nan"), float("inf")):  # NaN trained until its loss was NaN.
    with pytest.raises(ValueError, match="--learning-rate must be a positive number"):
      TrainConfig(data="d", model_dir="m", learning_rate=rate)


def test_a_presets_on_setting_is_turned_off_by_its_no_flag():
  """`--preset real` turns the previous mask and corrective clicks on; `--no-X`
  after it turns them off again (what the benchmark's arms do)."""
  from pipelines import cli as prep_cli
  from train import cli

  base = ["--data", "d", "--model-dir", "m", "--preset", "real"]
  on = cli.build_config(cli.fit_parser().parse_args(base))
  off = cli.build_config(cli.fit_parser().parse_args(base + ["--no-corrective-clicks"]))
  assert on.task_options["corrective_clicks"] is True
  assert off.task_options["corrective_clicks"] is False
  parser = prep_cli.prep_parser("segmentation")
  for flags, want in (
    ([], True),
    (["--no-previous-mask"], False),
    (["--no-previous-mask", "--previous-mask"], True),
  ):
    args = parser.parse_args(["--input", "i", "--output", "o", "--preset", "real"] + flags)
    assert prep_cli.build_config(args).options.previous_mask is want, flags


def test_normalized_focal_loss_is_ritms():
  """Against the formula of RITM's NormalizedFocalLossSigmoid (alpha 0.5, gamma 2),
  written out in numpy: focal weights renormalized to sum to the counted pixels."""
  rng = np.random.default_rng(3)
  y = (rng.random((2, 6, 5, 1)) > 0.6).astype(np.float32)
  w = (rng.random((2, 6, 5, 1)) > 0.2).astype(np.float32)
  logits = rng.normal(size=(2, 6, 5, 1)).astype(np.float32)
  p = 1 / (1 + np.exp(-logits))
  pt = np.where(w > 0, np.where(y > 0.5, p, 1 - p), 1.0)
  beta = (1 - pt) ** 2
  beta = beta * w.sum(axis=(1, 2, 3), keepdims=True) / beta.sum(axis=(1, 2, 3), keepdims=True)
  alpha = np.where(y > 0.5, 0.5, 0.5) * w
  want = (-alpha * beta * np.log(pt) * w).sum(axis=(1, 2, 3)) / w.sum(axis=(1, 2, 3))
  got = normalized_focal_loss(tf.constant(y), tf.constant(w), tf.constant(logits)).numpy()
  np.testing.assert_allclose(got, want, rtol=1e-5)


def test_evaluate_refuses_settings_it_cannot_run_with():
  from train.config import EvalConfig  # pylint: disable=g-import-not-at-top

  for bad, flag in (
    ({"batch_size": 0}, "--batch-size"),  # It failed deep in, at --resolution records.
    ({"max_objects": -1}, "--max-objects"),
    ({"max_clicks": 0}, "--max-clicks"),
    ({"iou": "0.85,x"}, "--iou"),
    ({"pred_thr": 1.0}, "--pred-thr"),
  ):
    with pytest.raises(ValueError, match=flag):
      EvalConfig(model="m", **bad)


def test_a_run_going_on_with_other_data_says_so(prep_dir, tmp_path, capsys):
  from beam_prep.prep_output import PrepOutput  # pylint: disable=g-import-not-at-top
  from train import logs  # pylint: disable=g-import-not-at-top
  from train.config import TrainConfig  # pylint: disable=g-import-not-at-top
  from train.fit import model_setup  # pylint: disable=g-import-not-at-top

  logs.quiet()
  model_dir, prep = str(tmp_path / "m"), PrepOutput(prep_dir)
  config = TrainConfig(data=prep_dir, model_dir=model_dir)
  model_setup.write_run_files(config, prep, model_dir)  # A first run: nothing to say.
  assert "trained on" not in capsys.readouterr().out
  with open(os.path.join(model_dir, "config.json")) as f:
    assert json.load(f)["data"] == prep.path
  recorded = json.loads(open(os.path.join(model_dir, "config.json")).read())
  with open(os.path.join(model_dir, "config.json"), "w") as f:
    json.dump(dict(recorded, data="/elsewhere/prep"), f)
  model_setup.write_run_files(config, prep, model_dir)
  assert f"{model_dir} was trained on /elsewhere/prep; this run goes on with" in (
    capsys.readouterr().out
  )
