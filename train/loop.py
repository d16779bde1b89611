"""The training loop: a step traced once, checkpoints, throughput, evaluation.

`fit(config)` trains the model of `config` on a beam_prep output directory
and returns the metrics it writes to `MODEL_DIR/metrics.json`.
"""

import json
import os
import time
from typing import Any, Dict, Optional

import numpy as np
import tensorflow as tf
import tensorflow_transform as tft
import keras

from beam_prep import keys
from train import logs, models
from train.config import TrainConfig
from train.data import InputReader


class RetraceError(RuntimeError):
  """The finalized training step would be traced again."""


class FinalizedFunction:
  """A tf.function that may be traced once: TF2's form of graph.finalize().

  A second trace (a changed input shape or dtype, a new Python argument)
  would silently add a new graph inside the training loop; instead it raises
  `RetraceError` naming what changed.
  """

  def __init__(self, fn, name: str):
    self._name = name
    self._first_spec = None
    self._error = None
    self.traces = 0

    def traced(*args):
      self.traces += 1
      spec = tf.nest.map_structure(_spec_of, args)
      if self._first_spec is None:
        self._first_spec = spec
      else:
        self._error = RetraceError(
            f"{self._name} would be traced again (trace {self.traces}): the step is "
            f"finalized after its first trace. First inputs: {self._first_spec}; "
            f"now: {spec}")
        raise self._error
      return fn(*args)

    self._function = tf.function(traced, reduce_retracing=False)

  def __call__(self, *args):
    try:
      return self._function(*args)
    except Exception:  # Autograph wraps errors raised while tracing.
      if self._error is not None:
        raise self._error from None
      raise


def _spec_of(x):
  if isinstance(x, (tf.Tensor, tf.Variable)):
    return f"{x.dtype.name}{list(x.shape)}"
  if hasattr(x, "values") and hasattr(x, "_values"):  # PerReplica
    return [_spec_of(v) for v in x.values]
  return repr(x)


def choose_strategy() -> tf.distribute.Strategy:
  """MirroredStrategy over several GPUs, else the default strategy."""
  gpus = tf.config.list_logical_devices("GPU")
  if len(gpus) > 1:
    return tf.distribute.MirroredStrategy()
  return tf.distribute.get_strategy()


def weighted_bce(labels: Dict[str, tf.Tensor], logits: tf.Tensor) -> tf.Tensor:
  """Per-example mean sigmoid cross-entropy over non-ignored pixels: [B]."""
  per_pixel = tf.nn.sigmoid_cross_entropy_with_logits(labels=labels[keys.LABEL], logits=logits)
  w = labels[keys.LABEL_WEIGHT]
  return tf.reduce_sum(per_pixel * w, axis=[1, 2, 3]) / tf.maximum(
      tf.reduce_sum(w, axis=[1, 2, 3]), 1.0)


def segmentation_counts(labels, logits) -> tf.Tensor:
  """Per-example [B, 4]: intersection, union, correct pixels, counted pixels."""
  pred = tf.cast(logits > 0, tf.float32)
  y, w = labels[keys.LABEL], labels[keys.LABEL_WEIGHT]
  inter = tf.reduce_sum(pred * y * w, axis=[1, 2, 3])
  union = tf.reduce_sum(tf.maximum(pred, y) * w, axis=[1, 2, 3])
  correct = tf.reduce_sum(tf.cast(tf.equal(pred, y), tf.float32) * w, axis=[1, 2, 3])
  return tf.stack([inter, union, correct, tf.reduce_sum(w, axis=[1, 2, 3])], axis=1)


def _read_json(path: str) -> Optional[Dict[str, Any]]:
  if not tf.io.gfile.exists(path):
    return None
  with tf.io.gfile.GFile(path) as f:
    return json.load(f)


def fit(config: TrainConfig) -> Dict[str, Any]:
  """Trains, evaluates, exports; writes config.json and metrics.json."""
  log = logs.get()
  tf.io.gfile.makedirs(config.model_dir)
  with tf.io.gfile.GFile(os.path.join(config.model_dir, "config.json"), "w") as f:
    f.write(config.to_json())
  keras.utils.set_random_seed(config.seed)

  tft_output = tft.TFTransformOutput(os.path.join(config.data, keys.TRANSFORM_DIR))
  strategy = choose_strategy()
  replicas = strategy.num_replicas_in_sync
  global_batch = config.batch_size * replicas
  lr = config.learning_rate * (replicas if config.scale_learning_rate else 1)
  reader = InputReader(config.data, tft_output, config.batch_size, config.shuffle_buffer,
                       config.seed)

  with strategy.scope():
    model = models.build_model(config.model, width=config.width, depth=config.depth)
    optimizer = keras.optimizers.Adam(lr)
    # Created now, not in the first step: variables created while tracing
    # make tf.function trace twice, which the finalized step forbids.
    optimizer.build(model.trainable_variables)
    global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
  checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=global_step)
  manager = tf.train.CheckpointManager(
      checkpoint, os.path.join(config.model_dir, "checkpoints"), max_to_keep=3)
  if manager.latest_checkpoint:
    checkpoint.restore(manager.latest_checkpoint).expect_partial()
    log.info("train: resumed from %s at step %d", manager.latest_checkpoint,
             int(global_step.numpy()))

  def step_fn(inputs, labels):
    with tf.GradientTape() as tape:
      logits = model(inputs, training=True)
      loss = tf.nn.compute_average_loss(weighted_bce(labels, logits),
                                        global_batch_size=global_batch)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss

  def train_step(batch):
    per_replica = strategy.run(step_fn, args=batch)
    global_step.assign_add(1)
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

  step = FinalizedFunction(train_step, "train_step")
  dataset = strategy.distribute_datasets_from_function(
      lambda ctx: reader.dataset(keys.TRAIN_SPLIT, training=True, input_context=ctx))
  iterator = iter(dataset)
  writer = tf.summary.create_file_writer(os.path.join(config.model_dir, "tensorboard", "train"))

  start_step = int(global_step.numpy())
  remaining = config.steps - start_step
  if remaining <= 0:
    log.info("train: model dir already at step %d >= --steps %d; nothing to train",
             start_step, config.steps)
  wait_s = busy_s = 0.0
  timed_steps = 0
  window_t, window_steps = time.perf_counter(), 0
  loss_value = float("nan")
  for i in range(max(remaining, 0)):
    t0 = time.perf_counter()
    batch = next(iterator)
    t1 = time.perf_counter()
    loss_value = float(step(batch))
    t2 = time.perf_counter()
    if i > 0:  # The first step includes tracing; keep it out of throughput.
      wait_s += t1 - t0
      busy_s += t2 - t0
      timed_steps += 1
    window_steps += 1
    current = int(global_step.numpy())
    if not np.isfinite(loss_value):
      raise FloatingPointError(
          f"loss is {loss_value} at step {current}; the last good checkpoint is "
          f"{manager.latest_checkpoint}")
    if current % config.log_every == 0 or current == config.steps:
      now = time.perf_counter()
      rate = window_steps * global_batch / (now - window_t)
      log.info("train: step %d/%d  loss %.4f  %.1f examples/s", current, config.steps,
               loss_value, rate)
      with writer.as_default(step=current):
        tf.summary.scalar("loss", loss_value)
        tf.summary.scalar("examples_per_second", rate)
      window_t, window_steps = now, 0
    if current % config.checkpoint_every == 0:
      manager.save(checkpoint_number=current)
  final_step = int(global_step.numpy())
  if manager.latest_checkpoint is None or not manager.latest_checkpoint.endswith(f"-{final_step}"):
    manager.save(checkpoint_number=final_step)

  eval_metrics = evaluate(model, reader, strategy, config.eval_batches)
  metrics = {
      "final_step": final_step,
      "steps_this_run": max(remaining, 0),
      "final_loss": loss_value,
      "replicas": replicas,
      "global_batch_size": global_batch,
      "learning_rate": lr,
      "step_traces": step.traces,
      "examples_per_second": (timed_steps * global_batch / busy_s) if busy_s else None,
      "input_wait_fraction": (wait_s / busy_s) if busy_s else None,
      "eval": eval_metrics,
  }
  if config.export:
    from train import export  # pylint: disable=g-import-not-at-top
    metrics["export_dir"] = export.export_segmentation(
        model, tft_output, config.model_dir, image_size=_image_size(config.data, tft_output))
  with tf.io.gfile.GFile(os.path.join(config.model_dir, "metrics.json"), "w") as f:
    json.dump(metrics, f, indent=2, sort_keys=True)
  return metrics


def evaluate(model: keras.Model, reader: InputReader, strategy: tf.distribute.Strategy,
             max_batches: int = 0) -> Dict[str, Any]:
  """Mean IoU (per example, object vs. rest) and pixel accuracy on the eval split."""
  try:
    ds = reader.dataset(keys.EVAL_SPLIT, training=False)
  except FileNotFoundError:
    return {"examples": 0}
  if max_batches:
    ds = ds.take(max_batches)

  @tf.function
  def counts(inputs, labels):
    return segmentation_counts(labels, model(inputs, training=False))

  rows = [counts(x, y).numpy() for x, y in ds]
  if not rows:
    return {"examples": 0}
  c = np.concatenate(rows)
  iou = np.where(c[:, 1] > 0, c[:, 0] / np.maximum(c[:, 1], 1), 1.0)
  return {"examples": int(c.shape[0]), "mean_iou": float(iou.mean()),
          "pixel_accuracy": float(c[:, 2].sum() / max(c[:, 3].sum(), 1))}


def _image_size(data_dir: str, tft_output: tft.TFTransformOutput) -> int:
  spec = tft_output.transformed_feature_spec()[keys.IMAGE]
  return int(spec.shape[0])
