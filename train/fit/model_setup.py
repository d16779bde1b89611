"""The model a run trains: built from its spec and checked by the task,
frozen (--freeze), given its optimizer and learning-rate schedule, and
restored from the run's latest checkpoint, else warm-started (--init-from);
and the run's files beside it (config.json, features.json).
"""

import dataclasses
import json
import os
import re
from typing import Any, Dict

import keras
import tensorflow as tf

from beam_prep import keys
from beam_prep.features import FEATURES_FILE
from beam_prep.prep_output import PrepOutput
from train import logs, model_layout, models
from train.config import TrainConfig


def _init_from(model: keras.Model, path: str) -> str:
  """Restores model weights from a checkpoint prefix or a model dir."""
  ckpt = path
  if tf.io.gfile.isdir(path):
    ckpt = tf.train.latest_checkpoint(
      os.path.join(path, model_layout.CHECKPOINTS_DIR)
    ) or tf.train.latest_checkpoint(path)
  if not ckpt:
    raise FileNotFoundError(f"--init-from {path}: no checkpoint found")
  _read(
    tf.train.Checkpoint(model=model),
    ckpt,
    f"--init-from {path} holds the checkpoint of another model",
    f"give the model settings it was trained with (its {keys.MODEL_CONFIG_FILE})",
  )
  return ckpt


def _read(checkpoint: tf.train.Checkpoint, path: str, whose: str, hint: str) -> None:
  """Restores `checkpoint` from `path`; one of another model is a ValueError
  saying `whose` it is, TensorFlow's reason, and `hint`."""
  try:
    checkpoint.restore(path).expect_partial()
  except (ValueError, tf.errors.InvalidArgumentError) as e:
    raise ValueError(f"{whose} ({e}): {hint}") from None


def _freeze(model: keras.Model, pattern: str) -> int:
  rx = re.compile(pattern)
  frozen = 0
  for layer in model.layers:
    if rx.search(layer.name) and layer.weights:
      layer.trainable = False
      frozen += 1
  if not frozen:
    raise ValueError(
      f"--freeze {pattern!r} matches no layer with weights; layers: "
      + ", ".join(layer.name for layer in model.layers if layer.weights)
    )
  return frozen


class Warmup(keras.optimizers.schedules.LearningRateSchedule):
  """A learning rate (or schedule) times (step + 1) / `steps` over the first
  `steps` optimizer steps: the first step trains at 1 / `steps` of it."""

  def __init__(self, after, steps: int):
    self.after, self.steps = after, steps

  def __call__(self, step):
    after = self.after(step) if callable(self.after) else self.after
    ramp = tf.minimum(1.0, (tf.cast(step, tf.float32) + 1.0) / self.steps)
    return tf.cast(after, tf.float32) * ramp

  def get_config(self):
    after = self.after
    if isinstance(after, keras.optimizers.schedules.LearningRateSchedule):
      after = keras.optimizers.schedules.serialize(after)
    return {"after": after, "steps": self.steps}


def build_model(config: TrainConfig, task, spec: Dict[str, Any], lr: float):
  """(model, optimizer, global step, learning-rate schedule), in the strategy's scope."""
  model = models.build_model(**spec)
  task.check_model(model, spec["name"])
  global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
  if config.freeze:
    logs.get().info(
      "train: froze %d layers matching %r", _freeze(model, config.freeze), config.freeze
    )
  schedule = lr
  if config.lr_schedule == "cosine":
    schedule = keras.optimizers.schedules.CosineDecay(lr, decay_steps=config.steps, alpha=0.05)
  if config.warmup_steps:
    schedule = Warmup(schedule, config.warmup_steps)
  optimizer = keras.optimizers.Adam(schedule)
  if config.mixed_precision == "mixed_float16":
    optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
  # Created now, not in the first step: variables created while tracing
  # make tf.function trace twice, which the finalized step forbids.
  optimizer.build(model.trainable_variables)
  return model, optimizer, global_step, schedule


def restore(config: TrainConfig, model_dir: str, model, optimizer, global_step):
  """The checkpoint manager; resumes from its latest checkpoint, else --init-from."""
  log = logs.get()
  checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=global_step)
  manager = tf.train.CheckpointManager(
    checkpoint, os.path.join(model_dir, model_layout.CHECKPOINTS_DIR), max_to_keep=3
  )
  if manager.latest_checkpoint:
    _read(
      checkpoint,
      manager.latest_checkpoint,
      f"{model_dir} holds checkpoints of another model",
      f"resume it with the settings of its {keys.MODEL_CONFIG_FILE}, or give a new --model-dir",
    )
    log.info(
      "train: resumed from %s at step %d", manager.latest_checkpoint, int(global_step.numpy())
    )
  elif config.init_from:
    log.info("train: weights from %s", _init_from(model, config.init_from))
  return manager


def write_run_files(config: TrainConfig, prep: PrepOutput, model_dir: str) -> None:
  """config.json (the data path absolute: `evaluate` may run from another
  folder) and the records' features.json; a resumed run on other data than
  the one its config.json names is said."""
  path = os.path.join(model_dir, keys.MODEL_CONFIG_FILE)
  before = json.loads(tf.io.gfile.GFile(path).read()) if tf.io.gfile.exists(path) else {}
  if before.get("data") not in (None, prep.path):
    logs.get().warning(
      "train: %s was trained on %s; this run goes on with %s", model_dir, before["data"], prep.path
    )
  tf.io.gfile.makedirs(model_dir)
  with tf.io.gfile.GFile(path, "w") as f:
    f.write(dataclasses.replace(config, data=prep.path).to_json())
  with tf.io.gfile.GFile(os.path.join(model_dir, FEATURES_FILE), "w") as f:
    f.write(prep.table.to_json())
