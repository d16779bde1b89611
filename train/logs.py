"""Readable console output for `beam-train`: our lines, not library noise."""

import logging
import os
import sys
import warnings


class _StdoutHandler(logging.StreamHandler):
  """Writes to whatever sys.stdout is at the time of each message."""

  @property
  def stream(self):
    return sys.stdout

  @stream.setter
  def stream(self, _):
    pass


def quiet(verbose: bool = False, name: str = "beam_train") -> logging.Logger:
  """Silences TensorFlow/absl start-up noise unless `verbose`; returns logger `name`.

  Must run before TensorFlow is imported: its C++ side logs through absl
  before any Python setting reaches it, so it is imported here once with
  stderr pointed at /dev/null (a Python exception still surfaces).
  """
  if not verbose:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    warnings.filterwarnings("ignore")
    logging.getLogger().setLevel(logging.ERROR)
    for lib in ("apache_beam", "tensorflow", "absl", "tensorflow_transform", "tfx_bsl"):
      logging.getLogger(lib).setLevel(logging.ERROR)
    if "tensorflow" not in sys.modules:
      sys.stderr.flush()
      saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
      try:
        os.dup2(devnull, 2)
        import tensorflow as tf  # pylint: disable=g-import-not-at-top
        tf.config.list_physical_devices()
      finally:
        os.dup2(saved, 2)
        os.close(devnull)
        os.close(saved)
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tf.get_logger().setLevel(logging.ERROR)
  log = logging.getLogger(name)
  if not log.handlers:
    handler = _StdoutHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)
  log.setLevel(logging.DEBUG if verbose else logging.INFO)
  log.propagate = False
  return log


def get() -> logging.Logger:
  return logging.getLogger("beam_train")
