"""`Versions`: the served versions of one model, as TF Serving's
latest-version policy serves them.

Given a model dir (or a folder of numbered exports), the server serves its
newest `export/<version>/` and looks for a newer one every --poll-seconds.
A newer version is loaded beside the one serving, tried on one click, and
then takes the next requests; requests already running finish on the one
they started with, so no click waits for a load. A version that fails to
load is logged, listed with its error, and not tried again; the one serving
goes on. Given one export folder, that export is served and nothing is
watched.

`/v1/models/NAME` lists every version the server has known, as TF
Serving's GetModelStatus does: the one serving AVAILABLE, one being loaded
LOADING, the ones it replaced (or that failed) END. Predict and metadata
answer for the version serving; another version number is a 404.
"""

import logging
import threading
from typing import Any, Dict, List, Optional

import numpy as np

from train.export.saved_model import latest_export
from train.serve.model import RestModel, version_of
from train.serve.rest import RequestError

AVAILABLE, LOADING, END = "AVAILABLE", "LOADING", "END"


class Versions:
  """The versions of one model; `current` is the one serving.

  Args:
    model: a model dir (its newest export, watched) or one export folder.
    name: the model's name in URLs.
    max_clicks: the most clicks a call may hold (0: any).
    log: where loads and failures are said (default: the "beam_train" logger).

  Raises:
    FileNotFoundError, ValueError: as `RestModel`, for the first version.
  """

  def __init__(
    self, model: str, name: str, max_clicks: int = 0, log: Optional[logging.Logger] = None
  ):
    self.source, self.name, self.max_clicks = model, name, max_clicks
    self.log = log or logging.getLogger("beam_train")
    self._current = RestModel(model, name, max_clicks)
    self.watched = self._current.path.rstrip("/") != model.rstrip("/")
    self._states: Dict[int, Dict[str, str]] = {self._current.version: {"state": AVAILABLE}}
    self._lock = threading.Lock()
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None

  @property
  def current(self) -> RestModel:
    return self._current

  def check(self, name: str, version: Optional[int] = None) -> RestModel:
    """The model serving `name` (at `version`), or a 404 RequestError."""
    model = self._current
    if name != self.name or (version is not None and version != model.version):
      name = name if len(name) <= 100 else name[:100] + "..."  # Not the whole of a long URL.
      want = f"Latest({name})" if version is None else f"Specific({name}, {version})"
      raise RequestError(
        f"Servable not found for request: {want} (this server serves "
        f"{self.name!r} version {model.version})",
        status=404,
      )
    return model

  def status(self, name: str, version: Optional[int] = None) -> Dict[str, Any]:
    """TF Serving's GetModelStatusResponse JSON: every version known (or `version`)."""
    if name != self.name or (version is not None and version not in self._states):
      self.check(name, version)  # Raises the 404.
    with self._lock:
      known = sorted(self._states.items(), reverse=True)
    return {
      "model_version_status": [
        {
          "version": str(v),
          "state": s["state"],
          "status": {
            "error_code": s.get("error_code", "OK"),
            "error_message": s.get("error_message", ""),
          },
        }
        for v, s in known
        if version is None or v == version
      ]
    }

  def versions(self) -> List[int]:
    """The version numbers known, newest first."""
    with self._lock:
      return sorted(self._states, reverse=True)

  def poll(self) -> bool:
    """Serves the newest export of a watched model dir when it is newer
    than the one serving and was not tried before; True when it now serves."""
    if not self.watched:
      return False
    try:
      path = latest_export(self.source)
    except FileNotFoundError:
      return False  # The exports were moved away: keep serving the one loaded.
    version = version_of(path)
    with self._lock:
      if version <= self._current.version or version in self._states:
        return False
      self._states[version] = {"state": LOADING}
    return self._load(path, version)

  def _load(self, path: str, version: int) -> bool:
    self.log.info("serve: loading version %d from %s", version, path)
    try:
      model = RestModel(path, self.name, self.max_clicks)
      if model.segments:  # Traced before it takes a person's click.
        model.segment(np.zeros((32, 32, 3), np.uint8), [[16, 16]], [])
    except Exception as e:  # pylint: disable=broad-except
      with self._lock:
        self._states[version] = {
          "state": END,
          "error_code": "UNKNOWN",
          "error_message": f"{type(e).__name__}: {e}",
        }
      self.log.error(
        "serve: version %d at %s failed to load (%s: %s); still serving version %d",
        version,
        path,
        type(e).__name__,
        e,
        self._current.version,
      )
      return False
    with self._lock:
      old = self._current.version
      self._current = model
      self._states[old] = {"state": END}
      self._states[version] = {"state": AVAILABLE}
    self.log.info("serve: now serving version %d (was %d)", version, old)
    return True

  def watch(self, seconds: float) -> None:
    """Polls every `seconds` on a thread of its own until `stop()` (nothing
    when the model is one export folder, or `seconds` is 0)."""
    if not self.watched or seconds <= 0 or self._thread is not None:
      return

    def loop():
      while not self._stop.wait(seconds):
        try:
          self.poll()
        except Exception:  # pylint: disable=broad-except
          self.log.exception("serve: looking for a new version failed")

    self._thread = threading.Thread(target=loop, daemon=True, name="model-versions")
    self._thread.start()

  def stop(self) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join(timeout=60)
