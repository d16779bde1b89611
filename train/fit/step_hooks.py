"""What runs around the training step: stop requests (Ctrl-C, SIGTERM),
progress lines, the profiler, and every so many steps throughput and loss
scalars, histograms and checkpoints. The loop (`train.fit.loop`) owns the run
they read.
"""

import signal
import sys
import threading
import time

import tensorflow as tf

from beam_prep import keys
from train import graphs, logs


class StopRequest:
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


class Profiler:
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


class Periodic:
  """What runs after a step, every so many steps: the progress window,
  histograms (on the chief) and checkpoints."""

  def __init__(self, run, config, writer):
    self._run, self._config, self._writer = run, config, writer
    self._window = Window(run, config, writer)

    @graphs.function
    def gradients(inputs, labels):
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean(run.task.loss(labels, run.model(inputs, training=False)))
      return tape.gradient(loss, run.model.trainable_variables)

    self._gradients = gradients

  def after(self, current: int, state, batch) -> None:
    run, config = self._run, self._config
    self._window.step(current, state)
    if config.histogram_every and current % config.histogram_every == 0 and run.chief:
      histograms(self._writer, current, run, batch, self._gradients)
    if current % config.checkpoint_every == 0:
      run.manager.save(checkpoint_number=current)


class Window:
  """Throughput, input wait and loss every --log-every steps: progress line
  and TensorBoard scalars."""

  def __init__(self, run, config, writer):
    self._run, self._config, self._writer = run, config, writer
    self._progress = Progress(config.steps, config.log_every)
    self._steps, self._t = 0, time.perf_counter()

  def step(self, current: int, state) -> None:
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


def histograms(writer, current, run, batch, gradients) -> None:
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
