"""The training loop: a step traced once, checkpoints, throughput, evaluation.

`fit(config)` trains on a beam_prep output directory and returns the metrics
it writes to `MODEL_DIR/metrics.json`:

  final_step, steps_this_run, final_loss, replicas, global_batch_size,
  learning_rate, step_traces, examples_per_second, input_wait_fraction,
  input_bound, interrupted, eval {...}, noc {...}, export_dir

With no eval record, `eval` is `{"examples": 0, "skipped": why}` and, when
NoC was asked for, `noc_skipped` says why too (as it does when the clicks'
model inputs cannot be recomputed).
"""

import dataclasses
import json
import os
import time
from typing import Any, Dict

import keras
import numpy as np
import tensorflow as tf

from beam_prep import keys
from beam_prep.prep_output import PrepOutput
from train.fit import augment, devices
from train.export import saved_model
from train import graphs, logs, model_layout, models
from train.fit import model_setup, record_checks, step_hooks, train_step
from train.config import TrainConfig
from train.fit.data import InputReader
from train.export.serving_inputs import serving_plan
from train.tasks import make_task

# Above this share of step time spent waiting for the next batch, training
# is input-bound and the trainer says so.
INPUT_BOUND_FRACTION = 0.10


@dataclasses.dataclass
class _Run:
  """Everything a training run holds between setup, the loop and the end."""

  prep: PrepOutput
  task: Any
  strategy: Any
  chief: bool
  model_dir: str
  reader: InputReader
  model: Any
  optimizer: Any
  global_step: Any
  manager: Any
  step: "train_step.FinalizedFunction"
  lr: float
  lr_schedule: Any  # The learning rate, or a schedule of the step.
  global_batch: int
  records: "record_checks.Records"


@dataclasses.dataclass
class _LoopState:
  """What the loop measured."""

  start_step: int
  remaining: int
  loss: float = float("nan")
  interrupted: bool = False
  wait_s: float = 0.0
  busy_s: float = 0.0
  timed_steps: int = 0


def fit(config: TrainConfig) -> Dict[str, Any]:
  """Trains, evaluates, exports; writes config.json, features.json and metrics.json.

  Raises:
    FileNotFoundError: no features.json, or no checkpoint for --init-from.
    RecordsError: not a complete beam-prep output, no train records, or a
      shard unreadable or from another run.
    ServingPlanError: the model is to be exported and an op of the chain
      changes a model input without a TensorFlow twin (before training).
    RetraceError: the step would be traced twice.
    FloatingPointError: the loss became NaN or infinite (the last good
      checkpoint is kept).
    KeyboardInterrupt: after saving a checkpoint and metrics.
  """
  run = _setup(config)
  state = _loop(run, config)
  return _finish(run, state, config)


def _setup(config: TrainConfig) -> _Run:
  """Devices, data, task, strategy, input, model, optimizer, checkpoints."""
  devices.configure(config)
  prep = _open_data(config)
  task = make_task(prep.table, prep.tft_output, config.task_options)
  strategy = devices.choose_strategy(config)
  chief = devices.is_chief(strategy)
  model_dir = (
    config.model_dir
    if chief
    else os.path.join(config.model_dir, f"workertemp_{strategy.cluster_resolver.task_id}")
  )
  keras.utils.set_random_seed(config.seed)

  replicas = strategy.num_replicas_in_sync
  global_batch = config.batch_size * replicas
  lr = config.learning_rate * (replicas if config.scale_learning_rate else 1)
  # The model first: a mistake in the user's model is said before the records are read.
  module_files = models.import_model_modules(config.model_module)
  spec = task.model_spec(config)
  with strategy.scope():
    model, optimizer, global_step, schedule = model_setup.build_model(config, task, spec, lr)
  reader = InputReader(
    prep,
    task,
    config.batch_size,
    config.shuffle_buffer,
    config.seed,
    config.skip_corrupt_records,
    augment.parse(config.augment),
  )
  records = record_checks.check_records(config, prep)
  manager = model_setup.restore(config, model_dir, model, optimizer, global_step)
  # Written once the checkpoints were read: a refused resume leaves the dir as it was.
  model_setup.write_run_files(config, prep, model_dir)
  if chief:  # What `models.rebuild` needs to build this model again.
    models.write_model_file(
      model_dir,
      dict(spec, task=task.name, model_module=config.model_module, module_files=module_files),
    )
  step = train_step.make_step(
    config, strategy, reader, task, model, optimizer, global_step, global_batch
  )
  return _Run(
    prep,
    task,
    strategy,
    chief,
    model_dir,
    reader,
    model,
    optimizer,
    global_step,
    manager,
    step,
    lr,
    schedule,
    global_batch,
    records,
  )


def _open_data(config: TrainConfig) -> PrepOutput:
  """The prep output, refused at once when it is incomplete or cannot be served."""
  prep = PrepOutput(config.data)
  prep.check_trainable()
  if config.export:
    serving_plan(prep.table)  # An op without a twin fails now, not after training.
  return prep


def _loop(run: _Run, config: TrainConfig) -> _LoopState:
  """Trains until --steps (or a stop request); logs, checkpoints, profiles."""
  log = logs.get()
  batches = iter(
    run.strategy.distribute_datasets_from_function(
      lambda ctx: run.reader.dataset(keys.TRAIN_SPLIT, training=True, input_context=ctx)
    )
  )
  run.step.take(batches.element_spec)  # Its clicks vary in number from batch to batch.
  tb_dir = os.path.join(run.model_dir, model_layout.TENSORBOARD_DIR)
  start_step = int(run.global_step.numpy())
  state = _LoopState(start_step, max(config.steps - start_step, 0))
  if not state.remaining:
    log.info(
      "train: model dir already at step %d >= --steps %d; nothing to train",
      start_step,
      config.steps,
    )
  periodic = step_hooks.Periodic(
    run, config, tf.summary.create_file_writer(os.path.join(tb_dir, "train"))
  )
  profiler = step_hooks.Profiler(config.profile_steps if run.chief else (), tb_dir)
  stop = step_hooks.StopRequest()
  deadline = time.monotonic() + 60 * config.max_minutes if config.max_minutes > 0 else None
  try:
    for i in range(state.remaining):
      if stop.requested:
        state.interrupted = True
        log.info(
          "train: stopping at step %d as asked; saving a checkpoint", int(run.global_step.numpy())
        )
        break
      if deadline is not None and time.monotonic() > deadline:
        log.info(
          "train: --max-minutes %g reached at step %d of %d",
          config.max_minutes,
          int(run.global_step.numpy()),
          config.steps,
        )
        break
      current = start_step + i + 1  # The step this iteration completes.
      profiler.before(current)
      # The first step includes tracing; keep it out of throughput.
      batch = _timed_step(run, batches, state, timed=i > 0)
      profiler.after(current)
      if not np.isfinite(state.loss):
        raise FloatingPointError(
          f"loss is {state.loss} at step {current}; stopped without saving. The last good "
          f"checkpoint is {run.manager.latest_checkpoint or 'none (no checkpoint yet)'}; "
          "lower --learning-rate or check the records"
        )
      periodic.after(current, state, batch)
  except KeyboardInterrupt:  # A second Ctrl-C, or one outside the loop.
    state.interrupted = True
    log.info("\ntrain: interrupted; saving a checkpoint at step %d", int(run.global_step.numpy()))
  finally:
    stop.restore()
    profiler.close()
  return state


def _timed_step(run: _Run, batches, state: _LoopState, timed: bool):
  """One training step on the next batch; its loss and, when `timed`, its
  input wait and step time go into `state`. Returns the batch."""
  t0 = time.perf_counter()
  try:
    batch = next(batches)
  except tf.errors.OpError as e:
    raise record_checks.name_corrupt_shards(run.reader, e) from None
  t1 = time.perf_counter()
  state.loss = float(run.step(batch))
  t2 = time.perf_counter()
  if timed:
    state.wait_s += t1 - t0
    state.busy_s += t2 - t0
    state.timed_steps += 1
  return batch


def _finish(run: _Run, state: _LoopState, config: TrainConfig) -> Dict[str, Any]:
  """Last checkpoint, metrics, evaluation and export."""
  log = logs.get()
  final_step = int(run.global_step.numpy())
  if np.isfinite(state.loss) or not state.remaining:
    latest = run.manager.latest_checkpoint
    if latest is None or not latest.endswith(f"-{final_step}"):
      run.manager.save(checkpoint_number=final_step)

  wait_fraction = (state.wait_s / state.busy_s) if state.busy_s else None
  metrics = {
    "task": run.task.name,
    "final_step": final_step,
    "steps_this_run": final_step - state.start_step,
    "final_loss": state.loss,
    "replicas": run.strategy.num_replicas_in_sync,
    "global_batch_size": run.global_batch,
    "learning_rate": run.lr,
    "input_channels": run.prep.table.input_channels,
    "step_traces": run.step.traces,
    "examples_per_second": (
      (state.timed_steps * run.global_batch / state.busy_s) if state.busy_s else None
    ),
    "input_wait_fraction": wait_fraction,
    "input_bound": bool(wait_fraction is not None and wait_fraction > INPUT_BOUND_FRACTION),
    "interrupted": state.interrupted,
  }
  if run.records.skipped is not None:
    metrics["skipped_records"] = run.records.skipped
  if metrics["input_bound"]:
    log.info(
      "train: input-bound: %.0f%% of step time waits for the next batch. Give the "
      "input more CPU (--intra-op-threads/--inter-op-threads, a machine with more "
      "cores), read from local disk, write more and larger shards "
      "(a smaller beam-prep --target-shard-mb), or precompute more per-example work in beam-prep.",
      100 * wait_fraction,
    )
  if not state.interrupted:
    metrics.update(_evaluation(run, config, final_step))
    if config.export and run.chief:
      metrics["export_dir"] = saved_model.export_model(
        run.model,
        run.prep.tft_output,
        run.prep.table,
        os.path.join(config.model_dir, model_layout.EXPORT_DIR),
      )
  with tf.io.gfile.GFile(os.path.join(run.model_dir, model_layout.METRICS_FILE), "w") as f:
    json.dump(metrics, f, indent=2, sort_keys=True)
  if state.interrupted:
    raise KeyboardInterrupt
  return metrics


def _evaluation(run: _Run, config: TrainConfig, step: int) -> Dict[str, Any]:
  """{"eval": the task's metrics}, and those of the task's `end_evaluations` ({"noc": ...}).

  With no eval record, both are skipped, saying why on the log and in
  {"eval": {"examples": 0, "skipped": why}, "noc_skipped": why}.
  """
  log = logs.get()
  more = run.task.end_evaluations() if run.chief else {}
  if not run.records.has_eval:
    why = (
      f"{run.prep.no_records(keys.EVAL_SPLIT)}; evaluation needs images held out of "
      f"training: run beam-prep with --eval-percent N (N > 0, e.g. 20"
      f"{record_checks.ran_with_eval_percent(run.prep)})"
    )
    log.info("eval: skipped %s: %s", " and ".join(["evaluation", *more.values()]), why)
    return dict({"eval": {"examples": 0, "skipped": why}}, **{f"{m}_skipped": why for m in more})
  out = {"eval": evaluate(run.model, run.reader, run.task, config.eval_batches)}
  if more and out["eval"].get("examples"):
    out.update(run.task.evaluate_end(run.model, run.prep, config.model_dir, run.model_dir, step))
  return out


def evaluate(model: keras.Model, reader: InputReader, task, max_batches: int = 0) -> Dict[str, Any]:
  """The task's metrics on the whole eval split (or `max_batches` of it)."""
  try:
    ds = reader.model_batches(keys.EVAL_SPLIT, training=False)
  except FileNotFoundError:
    return {"examples": 0}
  if max_batches:
    ds = ds.take(max_batches)

  # Traced once for every batch: click counts (and the last batch's size) vary.
  @graphs.function(input_signature=ds.element_spec)
  def counts(inputs, labels):
    return task.counts(inputs, labels, model(inputs, training=False))

  rows = [counts(x, y).numpy() for x, y in ds]
  if not rows:
    return {"examples": 0}
  return task.summarize(np.concatenate(rows))
