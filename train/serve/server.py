"""The HTTP server of `beam-train serve`: waitress, a fixed pool of threads.

waitress (pure Python, any platform) reads each request whole before the
app sees it: headers, then the body, into memory up to 512 kB and into a
temporary file beyond. Requests run on `threads` threads; more wait in its
queue, so a burst costs the memory of `threads` requests at once, not one
thread and one request's memory each. Connections are capped too (100).

The body limit (--max-request-mb) is waitress's as well as the app's: a
Content-Length over it is refused before a byte of the body is read, and a
chunked body once it passes it (its framing, the chunk sizes, counted with
an allowance of 1/64), so no body is ever read much beyond the limit.
waitress's own refusals (that 413, a malformed request line or chunk) are
answered `{"error": ...}` like the app's.
"""

import os
import select
import socket
import threading
from typing import Callable, Optional

from flask import Flask
from waitress import wasyncore
from waitress.channel import HTTPChannel
from waitress.server import create_server
from waitress.task import ErrorTask

from train.serve.rest import error_body


def too_large(max_request_mb: float) -> str:
  """The message of a body over the limit (413)."""
  return f"the request is over the server's limit of {max_request_mb:g} MB (--max-request-mb)"


def _json_channel(max_request_mb: float):
  """waitress's connection class, its own refusals answered as JSON."""

  class JsonErrorTask(ErrorTask):
    """A request waitress refuses before the app: {"error": ...}."""

    def execute(self):
      e = self.request.error
      message = too_large(max_request_mb) if e.code == 413 else f"{e.reason}: {e.body}"
      body = error_body(message)
      self.status = f"{e.code} {e.reason}"
      self.response_headers.append(("Content-Type", "application/json"))
      self.set_close_on_finish()
      self.content_length = len(body)
      self.write(body)

  class JsonChannel(HTTPChannel):
    error_task_class = JsonErrorTask

  return JsonChannel


def _listen(host: str, port: int) -> socket.socket:
  """A socket bound to (host, port), or an OSError naming --host and --port."""
  try:
    family, kind, proto, _, address = socket.getaddrinfo(
      host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
  except OSError as e:
    raise OSError(f"--host {host}: {e.strerror or e}") from None
  try:
    if os.name == "posix":  # A restart binds while the old connections close.
      sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(address)
  except OSError as e:
    sock.close()
    raise OSError(f"--host {host} --port {port}: {e.strerror or e}") from None
  return sock


class Server:
  """One bound server of `app`: `serve_forever()` until `shutdown()`.

  Args:
    app: the Flask app (also `self.app`, for its test client).
    host, port: where to listen (port 0: a free port, then `self.port`).
    threads: requests served at once.
    max_request_mb: the body limit (the app refuses the same, `too_large`).
    on_stop: called once when serving stops (the label store's close).

  Raises:
    OSError: the address cannot be bound (the message names the flags).
  """

  def __init__(
    self,
    app: Flask,
    host: str,
    port: int,
    threads: int,
    max_request_mb: float,
    on_stop: Optional[Callable[[], None]] = None,
  ):
    self.app, self._on_stop = app, on_stop
    sock = _listen(host, port)
    self.port = sock.getsockname()[1]
    limit = int(max_request_mb * 1024 * 1024)
    self._map = {}
    self._waitress = create_server(
      app,
      map=self._map,
      sockets=[sock],
      threads=threads,
      # waitress refuses a Content-Length >= this, or a chunked body's bytes reaching it.
      max_request_body_size=limit + limit // 64 + 1,
      asyncore_use_poll=hasattr(select, "poll"),
    )  # select() stops at 1024 descriptors
    self._waitress.channel_class = _json_channel(max_request_mb)
    self._serving, self._stopped = threading.Event(), threading.Event()

  @property
  def stopped(self) -> bool:
    """Whether `serve_forever` has returned (after `shutdown()`)."""
    return self._stopped.is_set()

  def serve_forever(self) -> None:
    """Serves until `shutdown()` (or KeyboardInterrupt, which it raises)."""
    self._serving.set()
    try:
      wasyncore.loop(
        timeout=self._waitress.adj.asyncore_loop_timeout,
        map=self._map,
        use_poll=self._waitress.adj.asyncore_use_poll,
      )
    finally:
      self._waitress.task_dispatcher.shutdown()
      self._stop()
      self._stopped.set()

  def _stop(self) -> None:
    on_stop, self._on_stop = self._on_stop, None
    if on_stop is not None:
      on_stop()

  def shutdown(self) -> None:
    """Stops serving (from any thread): the socket closed, running requests
    given a few seconds, queued ones dropped."""
    if self._serving.is_set() and not self._stopped.is_set():
      # Closed by the serving thread, between two polls.
      try:
        self._waitress.trigger.pull_trigger(lambda: wasyncore.close_all(self._map))
      except OSError:  # Its trigger is closed already: the loop is closing; make sure.
        wasyncore.close_all(self._map)
      self._stopped.wait(30)
    else:
      wasyncore.close_all(self._map)
      self._waitress.task_dispatcher.shutdown()
      self._stop()
