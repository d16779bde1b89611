"""`Rounds`: `beam-train serve --engine-every N` runs a data engine round
(`beam-train engine`) after every N labels saved.

A round runs in a process of its own at a lower priority (nice 10), one at
a time, so a click never waits for it: the server only counts saves, starts
the round and reads its exit. The new export is served when it appears
(`train.serve.versions`). Labels saved during a round count toward the
next one. The round's output goes to LABELS/engine/rounds.log; its start
and end are said on the server's log.
"""

import logging
import os
import signal
import subprocess
import sys
import threading
from typing import List, Optional

from train.engine import ENGINE_DIR

LOG_FILE = "rounds.log"
NICE = 10


class Rounds:
  """Counts saves; starts a round every `every` of them.

  Args:
    every: labels saved per round.
    labels: the label store's folder (--save-dir).
    model: the served model dir (rounds start from it and publish under it).
    engine_args: more `beam-train engine` flags (--steps, --max-minutes).
    log: the server's log.
  """

  def __init__(
    self,
    every: int,
    labels: str,
    model: str,
    engine_args: List[str],
    log: Optional[logging.Logger] = None,
  ):
    self.every, self.labels, self.model = every, labels, model
    self.engine_args = list(engine_args)
    self.log = log or logging.getLogger("beam_train")
    self.started = self.finished = self.failed = 0
    self._saves = 0
    self._process: Optional[subprocess.Popen] = None
    self._lock = threading.Lock()
    self._idle = threading.Event()
    self._idle.set()
    self._stopped = False

  @property
  def running(self) -> bool:
    return self._process is not None

  @property
  def pid(self) -> Optional[int]:
    """The running round's process id (None: no round runs)."""
    process = self._process
    return None if process is None else process.pid

  def saved(self) -> None:
    """One label saved: a round starts when `every` are waiting and none runs."""
    with self._lock:
      self._saves += 1
      if self._saves >= self.every and self._process is None and not self._stopped:
        self._start()

  def start(self) -> bool:
    """Starts a round now, unless one runs; whether it started."""
    with self._lock:
      if self._process is not None or self._stopped:
        return False
      self._start()
      return True

  def _start(self) -> None:
    folder = os.path.join(self.labels, ENGINE_DIR)
    os.makedirs(folder, exist_ok=True)
    cmd = [
      sys.executable,
      "-m",
      "train",
      "engine",
      "--labels",
      self.labels,
      "--model",
      self.model,
      *self.engine_args,
    ]
    out = open(os.path.join(folder, LOG_FILE), "a", encoding="utf-8")  # pylint: disable=consider-using-with
    # A process group of its own: `stop` ends the round and the commands it runs.
    self._process = subprocess.Popen(  # pylint: disable=consider-using-with
      cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
    )
    out.close()
    # After the start (a preexec_fn is unsafe in a process with threads):
    # the round's imports run at the lower priority already.
    os.setpriority(os.PRIO_PROCESS, self._process.pid, NICE)
    self.started += 1
    self._idle.clear()
    self.log.info(
      "serve: %d labels saved since the last: data engine round started (process %d; its log: %s)",
      self._saves,
      self._process.pid,
      os.path.join(folder, LOG_FILE),
    )
    self._saves = 0
    threading.Thread(
      target=self._wait, args=(self._process,), daemon=True, name="engine-round"
    ).start()

  def _wait(self, process: subprocess.Popen) -> None:
    code = process.wait()
    with self._lock:
      self._process = None
      if code == 0:
        self.finished += 1
        self.log.info(
          "serve: data engine round ended; a version it published is served as it appears"
        )
      elif not self._stopped:
        self.failed += 1
        self.log.error(
          "serve: data engine round failed (exit %d): see %s",
          code,
          os.path.join(self.labels, ENGINE_DIR, LOG_FILE),
        )
      if self._saves >= self.every and not self._stopped:
        self._start()
      else:
        self._idle.set()

  def wait(self, timeout: Optional[float] = None) -> bool:
    """Waits until no round runs (tests, the benchmark); False on a timeout."""
    return self._idle.wait(timeout)

  def stop(self) -> None:
    """Stops the round running (the server is stopping), with the commands
    it runs (its records' job, its training): its work is lost, the labels
    are not (the next round trains on them)."""
    with self._lock:
      self._stopped = True
      process = self._process
    if process is not None:
      _signal_group(process.pid, signal.SIGTERM)
      try:
        process.wait(30)
      except subprocess.TimeoutExpired:
        _signal_group(process.pid, signal.SIGKILL)


def _signal_group(pid: int, sig: int) -> None:
  """`sig` to the process group `pid` leads (gone already: nothing to do)."""
  try:
    os.killpg(pid, sig)
  except ProcessLookupError:
    pass
