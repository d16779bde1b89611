"""The training step: traced once and finalized (`FinalizedFunction`: a second
trace raises `RetraceError` naming what changed), distributed over the
strategy's replicas, with the task's rounds and, with --xla, compiled.
"""

import tensorflow as tf

from train import graphs


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


def make_step(
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
