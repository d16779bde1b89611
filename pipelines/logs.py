"""Quiet, readable console output for the command-line tools.

TensorFlow, absl and Beam print pages of start-up and progress noise; a
person running a pipeline wants one line per stage. `quiet()` must run before
TensorFlow is imported to silence its C++ start-up logging.
"""

import logging
import os
import sys
import warnings


def quiet(verbose: bool = False) -> None:
  """Silences library noise unless `verbose`; sets up our own logger."""
  if not verbose:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    os.environ.setdefault("ABSL_MIN_LOG_LEVEL", "3")
    warnings.filterwarnings("ignore")
    logging.getLogger().setLevel(logging.ERROR)
    for name in ("apache_beam", "tensorflow", "absl", "tensorflow_transform", "tfx_bsl",
                 "root", "h5py", "matplotlib"):
      logging.getLogger(name).setLevel(logging.ERROR)
    try:
      import absl.logging  # pylint: disable=g-import-not-at-top
      absl.logging.set_verbosity(absl.logging.ERROR)
    except ImportError:
      pass
    _import_tensorflow_silently()
  log = logging.getLogger("beam_prep")
  if not log.handlers:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)
  log.setLevel(logging.DEBUG if verbose else logging.INFO)
  log.propagate = False


def _import_tensorflow_silently() -> None:
  # TensorFlow's C++ side logs through absl before any setting can reach it
  # (oneDNN, CUDA probing, cuInit); TF_CPP_MIN_LOG_LEVEL no longer covers
  # these. Import it and probe devices once with stderr pointed at /dev/null;
  # a Python exception still surfaces after stderr is restored.
  if "tensorflow" in sys.modules:
    return
  sys.stderr.flush()
  saved = os.dup(2)
  devnull = os.open(os.devnull, os.O_WRONLY)
  try:
    os.dup2(devnull, 2)
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tf.config.list_physical_devices()
  finally:
    os.dup2(saved, 2)
    os.close(devnull)
    os.close(saved)


def get() -> logging.Logger:
  return logging.getLogger("beam_prep")
