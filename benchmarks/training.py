"""Measures the training step on in-memory tensors against the step fed by our reader.

  train.synthetic_steps_s    the training step on in-memory tensors
  train.real_steps_s         the same step fed by our reader
  train.input_wait_fraction  share of the real run's step time waiting for input

Also trains the model that the serving and NoC figures measure (`fit_model`).
Named `training`, not `train`: a module `train` here would shadow the
top-level `train` package wherever this folder is on sys.path (a file of it
run as a script), and every `from train import ...` of the benchmarks would break.
"""

import os
import shutil
import statistics
import time
from typing import Any, Dict

from benchmarks.common import log, median_rate


def _steps(step, batches, steps: int, waits: list):
  """A run of `steps` steps on `batches` (for `median_rate`); each run's share
  of time waiting for a batch goes to `waits`."""

  def go():
    wait = busy = 0.0
    for _ in range(steps):
      t0 = time.perf_counter()
      b = next(batches)
      t1 = time.perf_counter()
      float(step(b))
      wait += t1 - t0
      busy += time.perf_counter() - t0
    waits.append(wait / busy)
    return steps

  return go


def bench_train(
  prep_dir: str, batch: int, steps: int, repeats: int, width: int, depth: int
) -> Dict[str, float]:
  """The training step on in-memory tensors vs fed by the reader."""
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from beam_prep import keys  # pylint: disable=g-import-not-at-top
  from train import models  # pylint: disable=g-import-not-at-top
  from train.fit.data import InputReader  # pylint: disable=g-import-not-at-top
  from beam_prep.prep_output import PrepOutput  # pylint: disable=g-import-not-at-top
  from train.tasks import make_task  # pylint: disable=g-import-not-at-top

  prep = PrepOutput(prep_dir)
  table = prep.table
  task = make_task(table, prep.tft_output)
  reader = InputReader(prep, task, batch)
  model = models.build_model(
    "segmentation_fcn", table.input_channels, builtin={"width": width, "depth": depth}
  )
  opt = keras.optimizers.Adam(1e-3)
  opt.build(model.trainable_variables)

  @tf.function
  def step(raw):
    inputs, labels = reader.parser(raw, training=True)  # on the device, as the trainer does
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(task.loss(labels, model(inputs, training=True)))
    opt.apply_gradients(
      zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    )
    return loss

  real = iter(reader.dataset(keys.TRAIN_SPLIT, training=True))
  first = next(real)
  synthetic = iter(tf.data.Dataset.from_tensors(first).repeat())
  for it in (synthetic, real):
    for _ in range(2):
      float(step(next(it)))
  waits = []
  out = {
    "train.synthetic_steps_s": median_rate(_steps(step, synthetic, steps, []), repeats),
    "train.real_steps_s": median_rate(_steps(step, real, steps, waits), repeats),
  }
  out["train.input_wait_fraction"] = statistics.median(waits)
  log(
    f"train: synthetic {out['train.synthetic_steps_s']:.2f} steps/s, real "
    f"{out['train.real_steps_s']:.2f} steps/s"
  )
  return out


def fit_model(workdir: str, prep_dir: str, s: Dict[str, Any]) -> str:
  """Trains `fit_steps` steps on the records in `prep_dir`; returns the model dir."""
  from train.config import TrainConfig  # pylint: disable=g-import-not-at-top
  from train.fit import loop  # pylint: disable=g-import-not-at-top

  model_dir = os.path.join(workdir, "model")
  shutil.rmtree(model_dir, ignore_errors=True)
  loop.fit(
    TrainConfig(
      data=prep_dir,
      model_dir=model_dir,
      steps=s["fit_steps"],
      batch_size=s["batch"],
      width=s["width"],
      depth=s["depth"],
      histogram_every=0,
      log_every=max(s["fit_steps"], 1),
    )
  )
  return model_dir
