"""One error-to-exit-code mapping for every command of both command lines
(`beam_prep.console.run_command`): refused before any work 2, failed 1,
interrupted 130, and a bug keeps its traceback."""

import logging

import pytest

from beam_prep import console
from pipelines import cli as prep_cli
from train import cli as train_cli


class _Lines(logging.Handler):
  def __init__(self):
    super().__init__(logging.DEBUG)
    self.records = []

  def emit(self, record):
    self.records.append(record)


def _log():
  log = logging.getLogger("test_exit_codes")
  log.handlers, log.propagate = [], False
  lines = _Lines()
  log.addHandler(lines)
  log.setLevel(logging.INFO)
  return log, lines


def _raise(error):
  def body():
    raise error

  return body


@pytest.mark.parametrize(
  "error,code",
  [
    (console.Refused("--steps must be > 0"), console.EXIT_REFUSED),
    (ValueError("model.keras: not a Keras file"), console.EXIT_FAILED),
    (FileNotFoundError("no such file: x.png"), console.EXIT_FAILED),
    (KeyboardInterrupt(), console.EXIT_INTERRUPTED),
    (console.Interrupted("the Dataflow job goes on"), console.EXIT_INTERRUPTED),
  ],
)
def test_each_error_is_one_line_and_its_code(error, code):
  log, lines = _log()
  assert console.run_command("beam-x run", log, _raise(error)) == code
  (record,) = lines.records
  assert record.levelno == logging.ERROR and record.getMessage().startswith("beam-x run: ")
  if str(error):
    assert record.getMessage() == f"beam-x run: {error}"


def test_tensorflows_errors_are_one_line_and_a_failure():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  log, lines = _log()
  error = tf.errors.FailedPreconditionError(None, None, "out/model is not a directory\n  more")
  assert console.run_command("beam-x run", log, _raise(error)) == console.EXIT_FAILED
  assert lines.records[-1].getMessage() == "beam-x run: out/model is not a directory"


def _failing(error):
  def body():
    with console.failing(RuntimeError):
      raise error

  return body


def test_a_commands_own_failures_the_body_code_and_a_bug():
  log, lines = _log()
  assert console.run_command("c", log, _failing(RuntimeError("stopped"))) == 1
  assert lines.records[-1].getMessage() == "c: stopped"
  with pytest.raises(RuntimeError):  # Outside `failing`, a RuntimeError is a bug.
    console.run_command("c", log, _raise(RuntimeError("stopped")))
  assert console.run_command("c", log, lambda: None) == 0
  assert console.run_command("c", log, lambda: 3) == 3
  with pytest.raises(TypeError):  # A bug: not said in one line, its traceback stays.
    console.run_command("c", log, _raise(TypeError("unsupported operand")))
  # --verbose (DEBUG): the traceback follows the line.
  log.setLevel(logging.DEBUG)
  lines.records.clear()
  assert console.run_command("c", log, _raise(ValueError("bad"))) == 1
  assert [r.levelno for r in lines.records] == [logging.ERROR, logging.DEBUG]
  assert lines.records[1].exc_info is not None


def test_refusing_turns_the_errors_named_into_refused():
  with pytest.raises(console.Refused, match="no such"):
    with console.refusing(FileNotFoundError):
      raise FileNotFoundError("no such file")
  with pytest.raises(KeyError):  # Not named: it passes through.
    with console.refusing(ValueError):
      raise KeyError("k")


@pytest.mark.parametrize(
  "main,argv",
  [
    (prep_cli.main, ["sample-data", "--count", "-1", "--output", "x"]),
    (prep_cli.main, ["preview", "--records", "/no/such/records", "--output", "p.png"]),
    (train_cli.main, ["evaluate", "--max-clicks", "x"]),
    (train_cli.main, ["predict", "--modle", "m"]),
    (train_cli.main, ["export", "--format", "gif", "--data", "d", "--model-dir", "m"]),
    (train_cli.main, ["engine", "--labels", "l"]),
  ],
)
def test_a_bad_command_line_is_refused_with_2_in_both_command_lines(main, argv, capsys):
  with pytest.raises(SystemExit) as e:
    main(argv)
  assert e.value.code == console.EXIT_REFUSED
  said = capsys.readouterr()  # argparse's own refusals go to stderr, after the usage.
  line = [ln for ln in (said.out + said.err).splitlines() if ln.strip()][-1]
  assert line.startswith(f"beam-{'prep' if main is prep_cli.main else 'train'} {argv[0]}: ")
