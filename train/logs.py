"""Readable console output for `beam-train`: our lines, not library noise."""

import logging

from beam_prep import console

NAME = "beam_train"


def quiet(verbose: bool = False) -> logging.Logger:
  """Silences library noise unless `verbose`; returns the `beam_train` logger."""
  return console.quiet(verbose, name=NAME)


def get() -> logging.Logger:
  return logging.getLogger(NAME)
