"""Readable console output for `beam-train`: our lines, not library noise."""

from beam_prep.console import Logs

NAME = "beam_train"
_LOGS = Logs(NAME)
quiet, get = _LOGS.quiet, _LOGS.get
