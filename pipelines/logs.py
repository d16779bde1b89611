"""Quiet, readable console output for `beam-prep`: one line per stage.

TensorFlow, absl and Beam print pages of start-up and progress noise; the
silencing itself is shared with `beam-train` (`train.logs`).
"""

import logging

from train import logs as _logs


def quiet(verbose: bool = False) -> None:
  """Silences library noise unless `verbose`; sets up the `beam_prep` logger."""
  _logs.quiet(verbose, name="beam_prep")


def get() -> logging.Logger:
  return logging.getLogger("beam_prep")
