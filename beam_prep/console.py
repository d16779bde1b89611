"""What both command lines share: quiet logging, command dispatch, config
files, unknown options. `beam-prep` and `beam-train` import it; it imports
neither, and TensorFlow only when silencing it.
"""

import contextlib
import json
import logging
import os
import re
import sys
import warnings
from typing import Callable, Dict, List, Optional


class _StdoutHandler(logging.StreamHandler):
  """Writes to whatever sys.stdout is at the time of each message."""

  @property
  def stream(self):
    return sys.stdout

  @stream.setter
  def stream(self, _):
    pass


# TensorFlow's C++ log level when the user has set none: fatal errors only.
TF_QUIET_LEVEL = "3"


def quiet(verbose: bool, name: str) -> logging.Logger:
  """Silences TensorFlow/absl start-up noise unless `verbose`; returns logger `name`.

  Must run before TensorFlow is imported (each command calls it first): its
  C++ side logs through absl before it reads TF_CPP_MIN_LOG_LEVEL (CUDA
  probes, cpu_feature_guard), so it is imported here once with stderr
  pointed at /dev/null (a Python exception still surfaces). A
  TF_CPP_MIN_LOG_LEVEL the user set below 3 is theirs: TensorFlow then logs
  as it would (its start-up lines included). Child processes inherit the
  level, so the commands a command runs are quiet too.
  """
  if not verbose:
    level = os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", TF_QUIET_LEVEL)
    warnings.filterwarnings("ignore")
    logging.getLogger().setLevel(logging.ERROR)
    for lib in ("apache_beam", "tensorflow", "absl", "tensorflow_transform", "tfx_bsl"):
      logging.getLogger(lib).setLevel(logging.ERROR)
    # A step that raises is logged there with its traceback, then raised to
    # the command, which says it in one line (`run_command`; --verbose: the
    # traceback too).
    logging.getLogger("apache_beam.runners.common").setLevel(logging.CRITICAL)
    if "tensorflow" not in sys.modules and level == TF_QUIET_LEVEL:
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


class Logs:
  """One command's logger: `quiet(verbose)` once at start, `get()` anywhere after."""

  def __init__(self, name: str):
    self.name = name

  def quiet(self, verbose: bool = False) -> logging.Logger:
    """Silences library noise unless `verbose`; returns this command's logger."""
    return quiet(verbose, name=self.name)

  def get(self) -> logging.Logger:
    return logging.getLogger(self.name)


def dispatch(
  doc: str, commands: Dict[str, Callable[[List[str]], int]], argv: Optional[List[str]]
) -> None:
  """Runs `commands[argv[0]]` and exits with its code; usage on no or bad command."""
  argv = list(sys.argv[1:] if argv is None else argv)
  if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
    if argv and argv[0] not in ("-h", "--help"):
      print(f"unknown command {argv[0]!r}\n", file=sys.stderr)
    print(doc.strip())
    print("\ncommands: " + ", ".join(commands))
    sys.exit(0 if not argv or argv[0] in ("-h", "--help") else 2)
  sys.exit(commands[argv[0]](argv[1:]))


# Exit codes, the same for every command of both command lines.
EXIT_FAILED = 1  # The work ran and failed (a job over its error fraction, a fit that stopped).
EXIT_REFUSED = 2  # Refused before any work: options, a config, an input (argparse's own code).
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM (128 + SIGINT).

# The errors every command reports in one line (a command adds its own); any
# other exception is a bug and keeps its traceback.
EXPECTED_ERRORS = (ValueError, OSError, ImportError)


class Refused(Exception):
  """A problem found before any work: the command exits EXIT_REFUSED."""


class Failed(Exception):
  """The work ran and failed: the command exits EXIT_FAILED."""


class Interrupted(Exception):
  """Stopped by the user, the message saying what is left: the command exits
  EXIT_INTERRUPTED."""


@contextlib.contextmanager
def refusing(*errors: type):
  """Turns `errors` (default EXPECTED_ERRORS) raised inside into `Refused`."""
  try:
    yield
  except errors or EXPECTED_ERRORS as e:
    raise Refused(str(e)) from e


@contextlib.contextmanager
def failing(*errors: type):
  """Turns `errors` raised inside (a step's own, beyond EXPECTED_ERRORS) into `Failed`."""
  try:
    yield
  except errors as e:
    raise Failed(str(e)) from e


def run_command(command: str, log: logging.Logger, body: Callable[[], Optional[int]]) -> int:
  """`body()`'s exit code (0 when it returns None); what it raises, said in one
  line `command: reason` and mapped to an exit code here and nowhere else:
  `Refused` EXIT_REFUSED; `Failed`, EXPECTED_ERRORS and TensorFlow's
  errors EXIT_FAILED; Ctrl-C
  and `Interrupted` EXIT_INTERRUPTED. With --verbose (the log at DEBUG) the
  traceback follows the line."""
  try:
    code = body()
  except Refused as e:
    return _said(log, command, e, EXIT_REFUSED)
  except KeyboardInterrupt:
    return _said(log, command, "interrupted", EXIT_INTERRUPTED)
  except Interrupted as e:
    return _said(log, command, e, EXIT_INTERRUPTED)
  except (Failed,) + EXPECTED_ERRORS as e:
    return _said(log, command, e, EXIT_FAILED)
  except Exception as e:  # pylint: disable=broad-except
    if not _tensorflow_error(e):
      raise
    return _said(log, command, getattr(e, "message", str(e)).strip().splitlines()[0], EXIT_FAILED)
  return 0 if code is None else code


def _tensorflow_error(e: Exception) -> bool:
  """Whether `e` is TensorFlow's (`tf.errors.OpError`: a path that is a file
  or a folder, a corrupt record, ...), told without importing TensorFlow."""
  return any(
    c.__name__ == "OpError" and c.__module__.startswith("tensorflow") for c in type(e).__mro__
  )


def command(
  prog: str,
  quiet_logs: Callable[[bool], logging.Logger],
  body: Callable[[List[str], logging.Logger], Optional[int]],
) -> Callable[[List[str]], int]:
  """The command `prog` (e.g. "beam-train fit") for `dispatch`: its log made
  quiet first (`quiet_logs(verbose)`, before TensorFlow loads), then
  `body(argv, log)` under the one error-to-exit-code mapping (`run_command`)."""

  def run(argv: List[str]) -> int:
    log = quiet_logs("--verbose" in argv)
    return run_command(prog, log, lambda: body(argv, log))

  return run


# What Beam appends to an error raised in a step: the step's name, not the reason.
_BEAM_STEP = re.compile(r" \[while running '[^']*'\]")


def _said(log: logging.Logger, command: str, reason, code: int) -> int:
  log.error("%s: %s", command, _BEAM_STEP.sub("", str(reason)).strip())
  log.debug("%s: traceback", command, exc_info=True)
  return code


def load_config_file(path: str) -> dict:
  """Reads a config file: JSON only (never YAML tags, pickle or eval)."""
  try:
    with open(path) as f:
      data = json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f"config {path} is not JSON: {e}") from None
  if not isinstance(data, dict):
    raise ValueError(f"config {path} must hold a JSON object of settings")
  return data


class UnknownOptionError(ValueError):
  """An option nobody knows; the message names it and the closest known one."""


def check_unknown(args: List[str], known_flags, where: str, strict: bool = False) -> None:
  """Refuses `--flags` in `args` that are not in `known_flags`, suggesting the closest.

  With `strict`, any token left (a stray value too) is refused.

  Raises:
    UnknownOptionError: naming every unknown option.
  """
  import difflib  # pylint: disable=g-import-not-at-top

  known = sorted(set(known_flags))
  problems = []
  value_of_unknown = False
  for token in args:
    if not token.startswith("--"):
      if strict and not value_of_unknown:
        problems.append(repr(token))
      value_of_unknown = False
      continue
    flag = token.split("=", 1)[0]
    value_of_unknown = False
    if flag in known:
      continue
    value_of_unknown = "=" not in token
    close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
    problems.append(f"{flag}" + (f" (did you mean {close[0]}?)" if close else ""))
  if problems:
    raise UnknownOptionError(
      f"unknown option{'s' if len(problems) > 1 else ''} {', '.join(problems)}; see {where} --help"
    )


def option_flags(parser) -> List[str]:
  """Every --flag an argparse parser knows."""
  return [s for s in parser._option_string_actions if s.startswith("--")]  # pylint: disable=protected-access


def beam_option_flags() -> List[str]:
  """Every --flag Beam's PipelineOptions know (as Beam itself collects them)."""
  from apache_beam.options import pipeline_options as po  # pylint: disable=g-import-not-at-top

  parser = po._BeamArgumentParser(allow_abbrev=False)  # pylint: disable=protected-access
  subset = {}
  for cls in po.PipelineOptions.__subclasses__():
    subset.setdefault(str(cls), cls)
  for cls in subset.values():
    cls._add_argparse_args(parser)  # pylint: disable=protected-access
  return option_flags(parser)
