"""The trainer's and the serving export's graph functions, declared once.

Each is a `tf.function` (or a tf.data map function) traced without AutoGraph: the code the step, the
evaluation and the serving signatures run (the twins, tf.Transform, the
model) is written with TensorFlow's own control flow, and converting it to
graph form took half of a small fit's time (a 6-step fit and its export,
48 s -> 31 s on 2 idle cores). Code of a user's (a model's `call`, an op's twin)
that branches or loops in Python on a tensor then fails while tracing;
`explained` names the fix.

This module imports nothing of `train`.
"""

import contextlib
from typing import Callable, Optional

import tensorflow as tf

ADVICE = (
  "a model, twin or task traced here uses a tensor as a Python bool or iterates over "
  "it (if/while/for on a tensor). Write that with tf.cond, tf.where or "
  "tf.while_loop, or decorate the function that does it with @tf.function (which "
  "converts its Python control flow with AutoGraph)"
)


def function(fn: Optional[Callable] = None, **kwargs):
  """`tf.function(fn, autograph=False, **kwargs)`; also a decorator, with or
  without arguments."""
  if fn is None:
    return lambda f: tf.function(f, autograph=False, **kwargs)
  return tf.function(fn, autograph=False, **kwargs)


def dataset_fn(fn: Callable) -> Callable:
  """`fn` for `tf.data.Dataset.map`, traced without AutoGraph (which tf.data
  applies by default: 10 s of a small fit's 35 s were its conversion of the
  reader's functions)."""
  return tf.autograph.experimental.do_not_convert(fn)


@contextlib.contextmanager
def explained(what: str):
  """Re-raises the error of Python control flow on a tensor while tracing
  `what` as a ValueError saying how to write it."""
  try:
    yield
  except tf.errors.OperatorNotAllowedInGraphError as e:
    raise ValueError(f"{what}: {ADVICE} ({e})") from None
