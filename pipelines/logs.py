"""Readable console output for `beam-prep`: one line per stage, no library noise."""

from beam_prep.console import Logs

NAME = "beam_prep"
_LOGS = Logs(NAME)
quiet, get = _LOGS.quiet, _LOGS.get
