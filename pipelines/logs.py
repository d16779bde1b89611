"""Readable console output for `beam-prep`: one line per stage, no library noise."""

import logging

from beam_prep import console

NAME = "beam_prep"


def quiet(verbose: bool = False) -> logging.Logger:
  """Silences library noise unless `verbose`; returns the `beam_prep` logger."""
  return console.quiet(verbose, name=NAME)


def get() -> logging.Logger:
  return logging.getLogger(NAME)
