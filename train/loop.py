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
import re
import signal
import sys
import threading
import time
from typing import Any, Dict

import keras
import numpy as np
import tensorflow as tf

from beam_prep import keys
from beam_prep.features import FEATURES_FILE
from beam_prep.prep_output import PrepOutput, RecordsError
from train import augment, devices, export, graphs, logs, model_layout, models
from train.config import TrainConfig
from train.data import InputReader
from train.serving_inputs import serving_plan
from train.tasks import make_task

# Above this share of step time spent waiting for the next batch, training
# is input-bound and the trainer says so.
INPUT_BOUND_FRACTION = 0.10


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
          f"now: {spec}"
        )
        raise self._error
      return fn(*args)

    self._traced = traced
    self._function = graphs.function(traced, reduce_retracing=False)

  def take(self, *element_spec) -> None:
    """Traces for inputs of these specs (e.g. a dataset's `element_spec`,
    whose variable-length features vary from batch to batch), not for the
    first call's shapes. Before the first call only."""
    self._function = graphs.function(
      self._traced, input_signature=element_spec, reduce_retracing=False
    )

  def __call__(self, *args):
    try:
      with graphs.explained(self._name):
        return self._function(*args)
    except Exception:  # Errors raised while tracing come back wrapped.
      if self._error is not None:
        raise self._error from None
      raise


def _spec_of(x):
  if isinstance(x, (tf.Tensor, tf.Variable)):
    return f"{x.dtype.name}{list(x.shape)}"
  if isinstance(x, tf.SparseTensor):
    return f"sparse {x.dtype.name}{list(x.shape)}"
  if isinstance(x, tf.distribute.DistributedValues):  # PerReplica
    return [_spec_of(v) for v in x.values]
  return repr(x)


class _StopRequest:
  """Ctrl-C (SIGINT) or SIGTERM ask the loop to stop after the current step.

  Stopping between steps, not inside one, lets the checkpoint be saved
  cleanly (an exception raised in the middle of a TensorFlow call can take
  the process down). A second Ctrl-C stops at once.
  """

  def __init__(self):
    self.requested = False
    self._previous = {}
    if threading.current_thread() is threading.main_thread():
      for sig in (signal.SIGINT, signal.SIGTERM):
        self._previous[sig] = signal.signal(sig, self._handle)

  def _handle(self, signum, frame):
    del frame
    if self.requested and signum == signal.SIGINT:
      raise KeyboardInterrupt
    self.requested = True
    logs.get().info(
      "\ntrain: %s: stopping after this step (Ctrl-C again to stop now)",
      signal.Signals(signum).name,
    )

  def restore(self) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous = {}


class Progress:
  """A progress bar on a terminal; a line every `every` steps otherwise."""

  def __init__(self, total: int, every: int):
    self._total, self._every = total, every
    self._tty = sys.stdout.isatty()

  def update(self, step: int, text: str, force: bool = False) -> None:
    if self._tty:
      done = int(30 * step / max(self._total, 1))
      sys.stdout.write(f"\rtrain: [{'#' * done}{'.' * (30 - done)}] {step}/{self._total} {text}")
      sys.stdout.flush()
      if step >= self._total:
        sys.stdout.write("\n")
    elif force or step % self._every == 0 or step == self._total:
      logs.get().info("train: step %d/%d  %s", step, self._total, text)


def _init_from(model: keras.Model, path: str) -> str:
  """Restores model weights from a checkpoint prefix or a model dir."""
  ckpt = path
  if tf.io.gfile.isdir(path):
    ckpt = tf.train.latest_checkpoint(
      os.path.join(path, model_layout.CHECKPOINTS_DIR)
    ) or tf.train.latest_checkpoint(path)
  if not ckpt:
    raise FileNotFoundError(f"--init-from {path}: no checkpoint found")
  tf.train.Checkpoint(model=model).restore(ckpt).expect_partial()
  return ckpt


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
  step: "FinalizedFunction"
  lr: float
  lr_schedule: Any  # The learning rate, or a schedule of the step.
  global_batch: int
  records: "_Records"


@dataclasses.dataclass
class _Records:
  """What the shard check found before training."""

  skipped: Any  # With --skip-corrupt-records: what is skipped (else None).
  has_eval: bool  # Whether any eval shard holds a record.


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
  _write_run_files(config, prep, model_dir)
  keras.utils.set_random_seed(config.seed)

  replicas = strategy.num_replicas_in_sync
  global_batch = config.batch_size * replicas
  lr = config.learning_rate * (replicas if config.scale_learning_rate else 1)
  reader = InputReader(
    prep,
    task,
    config.batch_size,
    config.shuffle_buffer,
    config.seed,
    config.skip_corrupt_records,
    augment.parse(config.augment),
  )
  records = _check_records(config, prep)

  module_files = models.import_model_modules(config.model_module)
  spec = task.model_spec(config)
  with strategy.scope():
    model, optimizer, global_step, schedule = _build_model(config, task, spec, lr)
  if chief:  # What `models.rebuild` needs to build this model again.
    models.write_model_file(
      model_dir,
      dict(spec, task=task.name, model_module=config.model_module, module_files=module_files),
    )
  manager = _restore(config, model_dir, model, optimizer, global_step)
  step = _make_step(config, strategy, reader, task, model, optimizer, global_step, global_batch)
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


def _write_run_files(config: TrainConfig, prep: PrepOutput, model_dir: str) -> None:
  """config.json (the data path absolute: `evaluate` may run from another
  folder) and the records' features.json."""
  tf.io.gfile.makedirs(model_dir)
  with tf.io.gfile.GFile(os.path.join(model_dir, keys.MODEL_CONFIG_FILE), "w") as f:
    f.write(dataclasses.replace(config, data=prep.path).to_json())
  with tf.io.gfile.GFile(os.path.join(model_dir, FEATURES_FILE), "w") as f:
    f.write(prep.table.to_json())


def _build_model(config: TrainConfig, task, spec: Dict[str, Any], lr: float):
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
  optimizer = keras.optimizers.Adam(schedule)
  if config.mixed_precision == "mixed_float16":
    optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
  # Created now, not in the first step: variables created while tracing
  # make tf.function trace twice, which the finalized step forbids.
  optimizer.build(model.trainable_variables)
  return model, optimizer, global_step, schedule


def _restore(config: TrainConfig, model_dir: str, model, optimizer, global_step):
  """The checkpoint manager; resumes from its latest checkpoint, else --init-from."""
  log = logs.get()
  checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=global_step)
  manager = tf.train.CheckpointManager(
    checkpoint, os.path.join(model_dir, model_layout.CHECKPOINTS_DIR), max_to_keep=3
  )
  if manager.latest_checkpoint:
    checkpoint.restore(manager.latest_checkpoint).expect_partial()
    log.info(
      "train: resumed from %s at step %d", manager.latest_checkpoint, int(global_step.numpy())
    )
  elif config.init_from:
    log.info("train: weights from %s", _init_from(model, config.init_from))
  return manager


def _make_step(
  config, strategy, reader, task, model, optimizer, global_step, global_batch
) -> "FinalizedFunction":
  """The finalized, distributed training step."""
  parser = reader.parser
  gradient = _gradient_fn(task, model, optimizer, global_batch, config.xla)

  def step_fn(*batch):
    if reader.transform_in_step:
      # The exported transform graph, on the device: raw bytes in, floats out.
      inputs, labels = parser(batch[0], training=True)
    else:
      inputs, labels = batch
    loss, grads = gradient(inputs, labels)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss

  def train_step(batch):
    args = (batch,) if reader.transform_in_step else batch
    per_replica = strategy.run(step_fn, args=args)
    global_step.assign_add(1)
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

  return FinalizedFunction(train_step, "train_step")


def _gradient_fn(task, model, optimizer, global_batch: int, xla: bool):
  """(inputs, labels) -> (loss, gradients): the task's rounds without gradient
  (`task.iterate`), then the gradient of the loss. With --xla compiled; outside it
  stay what XLA cannot hold or sync: the parse of the stored bytes and the
  exported transform (strings), labels the loss does not read (strings,
  ragged clicks), and the optimizer's step (its all-reduce across replicas
  is a sync point, which a compiled function inside `strategy.run` cannot hold)."""

  def gradient(inputs, labels):
    inputs = task.iterate(model, inputs, labels)
    with tf.GradientTape() as tape:
      logits = model(inputs, training=True)
      loss = tf.nn.compute_average_loss(task.loss(labels, logits), global_batch_size=global_batch)
      scaled = optimizer.scale_loss(loss) if hasattr(optimizer, "scale_loss") else loss
    return loss, tape.gradient(scaled, model.trainable_variables)

  if not xla:
    return gradient
  compiled = graphs.function(gradient, jit_compile=True, reduce_retracing=False)

  def gradient_xla(inputs, labels):
    if isinstance(labels, dict):
      labels = {
        k: v for k, v in labels.items() if isinstance(v, tf.Tensor) and v.dtype != tf.string
      }
    return compiled(inputs, labels)

  return gradient_xla


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
  periodic = _Periodic(run, config, tf.summary.create_file_writer(os.path.join(tb_dir, "train")))
  profiler = _Profiler(config.profile_steps if run.chief else (), tb_dir)
  stop = _StopRequest()
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
    raise _name_corrupt_shards(run.reader, e) from None
  t1 = time.perf_counter()
  state.loss = float(run.step(batch))
  t2 = time.perf_counter()
  if timed:
    state.wait_s += t1 - t0
    state.busy_s += t2 - t0
    state.timed_steps += 1
  return batch


class _Profiler:
  """A profiler trace of global steps A..B (--profile-steps; empty: none)."""

  def __init__(self, steps, log_dir: str):
    self._steps, self._dir, self._active = tuple(steps), log_dir, False

  def before(self, current: int) -> None:
    if self._steps and current == self._steps[0]:
      tf.profiler.experimental.start(self._dir)
      self._active = True

  def after(self, current: int) -> None:
    if self._active and current == self._steps[1]:
      self.close()
      logs.get().info(
        "train: profiled steps %d-%d -> %s (TensorBoard, Profile tab)", *self._steps, self._dir
      )

  def close(self) -> None:
    if self._active:
      tf.profiler.experimental.stop()
      self._active = False


class _Periodic:
  """What runs after a step, every so many steps: the progress window,
  histograms (on the chief) and checkpoints."""

  def __init__(self, run: _Run, config: TrainConfig, writer):
    self._run, self._config, self._writer = run, config, writer
    self._window = _Window(run, config, writer)

    @graphs.function
    def gradients(inputs, labels):
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean(run.task.loss(labels, run.model(inputs, training=False)))
      return tape.gradient(loss, run.model.trainable_variables)

    self._gradients = gradients

  def after(self, current: int, state: _LoopState, batch) -> None:
    run, config = self._run, self._config
    self._window.step(current, state)
    if config.histogram_every and current % config.histogram_every == 0 and run.chief:
      _histograms(self._writer, current, run, batch, self._gradients)
    if current % config.checkpoint_every == 0:
      run.manager.save(checkpoint_number=current)


class _Window:
  """Throughput, input wait and loss every --log-every steps: progress line
  and TensorBoard scalars."""

  def __init__(self, run: _Run, config: TrainConfig, writer):
    self._run, self._config, self._writer = run, config, writer
    self._progress = Progress(config.steps, config.log_every)
    self._steps, self._t = 0, time.perf_counter()

  def step(self, current: int, state: _LoopState) -> None:
    self._steps += 1
    if current % self._config.log_every and current != self._config.steps:
      if sys.stdout.isatty():
        self._progress.update(current, f"loss {state.loss:.4f}")
      return
    now = time.perf_counter()
    rate = self._steps * self._run.global_batch / (now - self._t)
    wait = state.wait_s / state.busy_s if state.busy_s else 0.0
    with self._writer.as_default(step=current):
      tf.summary.scalar("loss", state.loss)
      tf.summary.scalar("examples_per_second", rate)
      tf.summary.scalar("input_wait_fraction", wait)
      lr = self._run.lr_schedule
      tf.summary.scalar("learning_rate", float(lr(current - 1)) if callable(lr) else lr)
    self._t, self._steps = now, 0
    self._progress.update(
      current,
      f"loss {state.loss:.4f}  {rate:.1f} examples/s  input wait {100 * wait:.0f}%",
      force=True,
    )


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
      metrics["export_dir"] = export.export_model(
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
      f"{_ran_with_eval_percent(run.prep)})"
    )
    log.info("eval: skipped %s: %s", " and ".join(["evaluation", *more.values()]), why)
    return dict({"eval": {"examples": 0, "skipped": why}}, **{f"{m}_skipped": why for m in more})
  out = {"eval": evaluate(run.model, run.reader, run.task, config.eval_batches)}
  if more and out["eval"].get("examples"):
    out.update(run.task.evaluate_end(run.model, run.prep, config.model_dir, run.model_dir, step))
  return out


def _ran_with_eval_percent(prep: PrepOutput) -> str:
  percent = prep.manifest.get("config", {}).get("eval_percent")
  return "" if percent is None else f"; this output was made with --eval-percent {percent}"


def _check_records(config: TrainConfig, prep: PrepOutput) -> _Records:
  """Checks the shards before training; with --skip-corrupt-records, scans them.

  Raises:
    RecordsError: no train record, or a shard is unreadable or from another run.
  """
  files, eval_files = prep.files(keys.TRAIN_SPLIT), prep.files(keys.EVAL_SPLIT)
  if config.skip_corrupt_records:
    skipped, readable = _scan_records(prep, files, eval_files)
    has_train = skipped["train_records_readable"] > 0
    if not has_train and skipped["corrupt_shards"]:
      raise RecordsError(
        f"no train record of {prep.path} is readable; corrupt: "
        + ", ".join(skipped["corrupt_shards"])
      )
  else:
    skipped, readable = None, set(prep.check_shards(files + eval_files))
    has_train = any(p in readable for p in files)
  if not has_train:
    raise RecordsError(
      f"{prep.no_records(keys.TRAIN_SPLIT)}: nothing to train on. "
      f"{prep.join(keys.MANIFEST_FILE)} counts what the job read and wrote, and "
      f"{prep.join(keys.ERRORS_DIR)}/ lists each input that failed and why"
    )
  return _Records(skipped, any(p in readable for p in eval_files))


def _scan_records(prep: PrepOutput, files, eval_files):
  """With --skip-corrupt-records: (what is skipped, the shards worth reading).

  What is skipped: corrupt shards, their errors, records readable, and
  records lost (from the manifest's counts). A corrupt shard is worth
  reading: its readable part is trained on.
  """
  scan = prep.scan_shards(files + eval_files)
  corrupt = {p: v["error"] for p, v in scan.items() if v["error"]}
  prep.check_shards([p for p in files + eval_files if scan[p]["records"] > 0])
  report: Dict[str, Any] = {"corrupt_shards": sorted(corrupt), "errors": corrupt}
  expected = prep.manifest.get("counts", {}).get("records_written")
  for split, split_files in ((keys.TRAIN_SPLIT, files), (keys.EVAL_SPLIT, eval_files)):
    readable = sum(scan[p]["records"] for p in split_files)
    report[f"{split}_records_readable"] = readable
    if expected is not None:
      report[f"{split}_records_skipped"] = max(expected.get(split, 0) - readable, 0)
  if corrupt:
    logs.get().info(
      "train: skipping the unreadable part of %d shard(s): %s; %s train records lost",
      len(corrupt),
      ", ".join(sorted(corrupt)),
      report.get("train_records_skipped", "an unknown number of"),
    )
  return report, {p for p, v in scan.items() if v["records"] or v["error"]}


def _name_corrupt_shards(reader: InputReader, error: Exception) -> Exception:
  """Turns a read error in the middle of training into one naming the shard."""
  scan = reader.prep.scan_shards(reader.files(keys.TRAIN_SPLIT))
  bad = {p: v["error"] for p, v in scan.items() if v["error"]}
  if not bad:
    return error
  return RecordsError(
    "corrupt records in "
    + "; ".join(f"shard {p}: {e}" for p, e in sorted(bad.items()))
    + " (pass --skip-corrupt-records to train on the readable records)"
  )


def _histograms(writer, current, run: _Run, batch, gradients) -> None:
  """Weight and gradient histograms, and the task's pictures (predicted masks)."""
  local = tf.nest.map_structure(lambda t: run.strategy.experimental_local_results(t)[0], batch)
  if run.reader.transform_in_step:
    inputs, labels = run.reader.parser(local, training=False)
  else:
    inputs, labels = local
  grads = gradients(inputs, labels)
  with writer.as_default(step=current):
    for var, grad in zip(run.model.trainable_variables, grads):
      name = var.path if hasattr(var, "path") else var.name
      tf.summary.histogram(f"weights/{name}", var)
      if grad is not None:
        tf.summary.histogram(f"gradients/{name}", grad)
    logits = run.model(inputs[:3], training=False)
    if len(logits.shape) == 4:  # Per-pixel predictions: show them beside the truth.
      tf.summary.image("predicted_masks", tf.sigmoid(tf.cast(logits, tf.float32)), max_outputs=3)
      tf.summary.image("true_masks", labels[keys.LABEL][:3], max_outputs=3)


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
