"""Requests meant to bring `beam-train serve` down, sent over HTTP: each
should be refused with a 4xx `{"error": ...}` naming the limit (or what is
wrong), fast, leaving the server's memory as it was.

  serve.bad_requests         requests of the suite sent (every case, 3 rounds)
  serve.bad_5xx              answers of 500 or more among them, or no answer (0: none)
  serve.bad_max_ms           the slowest answer
  serve.bad_rss_after_vs_before  the server's RSS after the rounds / before

`SUITE_CONFIG` is the server the suite expects (small limits keep the
over-limit bodies cheap to send); `tests/train/test_serve_limits.py` runs the
same suite and checks each answer's status and words.
"""

import http.client
import json
import select
import socket
import time
from typing import Any, Callable, Dict, Iterable, List, Tuple

import numpy as np

from benchmarks.common import serving

# The limits of the server the suite is sent to (`beam-train serve` flags).
SUITE_CONFIG = {"max_request_mb": 2, "max_pixels": 10_000, "threads": 2}
ROUNDS = 3
CLICKS = 100_000
DEEP = 100_000

Answer = Tuple[int, Any, float]  # status, the JSON answer (or raw bytes), seconds
Case = Tuple[Callable[[], Answer], int, List[str]]  # request, status, words of the error


def rss_mb(pid: str = "self") -> float:
  """A process's resident memory (Linux /proc), MB."""
  with open(f"/proc/{pid}/status") as f:
    return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def _json_or_bytes(data: bytes):
  try:
    return json.loads(data)
  except ValueError:
    return data


def ask(port: int, method: str, path: str, body: bytes = b"", headers=None) -> Answer:
  """One request through http.client."""
  conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
  t = time.perf_counter()
  try:
    conn.request(method, path, body=body, headers=headers or {})
    r = conn.getresponse()
    data = r.read()
  finally:
    conn.close()
  return r.status, _json_or_bytes(data), time.perf_counter() - t


def _read_all(s: socket.socket) -> bytes:
  data = b""
  while True:
    try:
      chunk = s.recv(65536)
    except ConnectionResetError:
      return data
    if not chunk:
      return data
    data += chunk


def raw(port: int, head: bytes, body_parts: Iterable[bytes] = ()) -> Answer:
  """A request written by hand: `head` (request line and headers, with
  `Connection: close`), then body parts sent until the server answers."""
  t = time.perf_counter()
  with socket.create_connection(("127.0.0.1", port), timeout=120) as s:
    s.sendall(head)
    for part in body_parts:
      if select.select([s], [], [], 0)[0]:
        break  # The server answered, and stopped reading.
      try:
        s.sendall(part)
      except OSError:
        break
    data = _read_all(s)
  head_text, _, body = data.partition(b"\r\n\r\n")
  status = int(head_text.split()[1]) if head_text.startswith(b"HTTP/") else 0
  return status, _json_or_bytes(body), time.perf_counter() - t


def _chunked(total_bytes: int, chunk: int = 65536) -> Iterable[bytes]:
  """A chunked body of about `total_bytes`."""
  part = b"%x\r\n" % chunk + b"1" * chunk + b"\r\n"
  for _ in range(total_bytes // chunk + 1):
    yield part
  yield b"0\r\n\r\n"


def _predict_body(clicks, h: int = 20, w: int = 20) -> bytes:
  image = np.random.default_rng(0).integers(0, 256, (h, w, 3)).tolist()
  return json.dumps(
    {"inputs": {"image": image, "positive_clicks": clicks, "negative_clicks": []}}
  ).encode()


def upload(port: int) -> str:
  """A small image opened on the page -> its id."""
  import io  # pylint: disable=g-import-not-at-top
  from PIL import Image  # pylint: disable=g-import-not-at-top

  buf = io.BytesIO()
  Image.fromarray(np.zeros((24, 32, 3), np.uint8)).save(buf, format="PNG")
  body = (
    b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.png"\r\n'
    b"Content-Type: image/png\r\n\r\n" + buf.getvalue() + b"\r\n--b--\r\n"
  )
  status, answer, _ = ask(
    port, "POST", "/page/upload", body, {"Content-Type": "multipart/form-data; boundary=b"}
  )
  if status != 200:
    raise RuntimeError(f"upload: {status} {answer}")
  return answer["id"]


def _json_cases(port: int, predict: str, image_id: str) -> Dict[str, Case]:
  """Bodies that parse (or nearly): too many clicks, too deep, not JSON."""
  from train.serve.json_arrays import MAX_DEPTH  # pylint: disable=g-import-not-at-top

  deep = b"[" * DEEP + b"]" * DEEP
  many = [[1, 1]] * CLICKS

  def post(path, body):
    return lambda: ask(port, "POST", path, body, {"Content-Type": "application/json"})

  return {
    "100,000 clicks": (post(predict, _predict_body(many)), 400, [str(CLICKS), "--max-clicks"]),
    "100,000 clicks on the page": (
      post("/page/segment", json.dumps({"id": image_id, "positive": many}).encode()),
      400,
      ["--max-clicks"],
    ),
    "100,000 clicks in a row": (
      post(
        predict,
        json.dumps(
          {"instances": [{"image": [[[1, 2, 3]]], "positive_clicks": many, "negative_clicks": []}]}
        ).encode(),
      ),
      400,
      ["--max-clicks"],
    ),
    "100,000 clicks in a saved object": (
      post("/page/save", json.dumps({"id": image_id, "objects": [{"positive": many}]}).encode()),
      400,
      ["objects[0]", "--max-clicks"],
    ),
    "nested 100,000 deep": (post(predict, deep), 400, [str(MAX_DEPTH), "deep"]),
    "nested 100,000 deep, on the page": (post("/page/segment", deep), 400, ["deep"]),
    "closed before opened": (post(predict, b"]" * DEEP + b"[" * DEEP), 400, ["not JSON"]),
    "a run of brackets left open": (post(predict, b"[" * 30 + b"1," * 500_000), 400, ["not JSON"]),
    "many short arrays": (post(predict, b"[" + b"[1]," * 300_000 + b"[1]]"), 400, ["JSON object"]),
    "an image over --max-pixels": (
      post(predict, _predict_body([[1, 1]], 120, 120)),
      400,
      ["--max-pixels"],
    ),
    "not JSON": (post(predict, b"{nope"), 400, ["not JSON"]),
    "not UTF-8, on the page": (post("/page/segment", b"\xff\xfe{}"), 400, ["not JSON"]),
    "a list for the page": (post("/page/segment", b"[1, 2]"), 400, ["JSON object"]),
  }


def _http_cases(port: int, predict: str, limit: int) -> Dict[str, Case]:
  """Bodies over the limit however they are sent, and broken HTTP."""
  chunked = (
    f"POST {predict} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
    "Content-Type: application/json\r\nConnection: close\r\n\r\n"
  ).encode()
  said = (
    f"POST /page/segment HTTP/1.1\r\nHost: x\r\nContent-Length: {100 * 2**20}\r\n"
    "Connection: close\r\n\r\n"
  ).encode()
  form = (
    b"".join(
      b'--b\r\nContent-Disposition: form-data; name="f%d"\r\n\r\nx\r\n' % i for i in range(2000)
    )
    + b"--b--\r\n"
  )
  return {
    "over the limit, chunked": (
      lambda: raw(port, chunked, _chunked(limit + 100_000)),
      413,
      ["--max-request-mb"],
    ),
    # Refused on the headers: no body is sent (none would be read).
    "over the limit, by Content-Length": (lambda: raw(port, said), 413, ["--max-request-mb"]),
    # Just over: read whole (within the framing allowance), refused by the app.
    "one byte over the limit": (
      lambda: ask(port, "POST", predict, b"1" * (limit + 1)),
      413,
      ["--max-request-mb"],
    ),
    "a form of 2,000 parts": (
      lambda: ask(
        port, "POST", "/page/upload", form, {"Content-Type": "multipart/form-data; boundary=b"}
      ),
      413,
      ["parts"],
    ),
    "broken chunks": (lambda: raw(port, chunked + b"zz\r\n{}\r\n0\r\n\r\n"), 400, []),
    "no request line": (lambda: raw(port, b"GARBAGE\r\n\r\n"), 400, []),
    "a method the route has not": (lambda: ask(port, "PUT", predict, b"{}"), 405, []),
  }


def suite(port: int, model_name: str) -> Dict[str, Case]:
  """{case: (request, the status it must get, words its error must hold)}
  against a server of SUITE_CONFIG's limits (an image is uploaded for the page)."""
  predict = f"/v1/models/{model_name}:predict"
  limit = int(SUITE_CONFIG["max_request_mb"] * 1024 * 1024)
  return {**_json_cases(port, predict, upload(port)), **_http_cases(port, predict, limit)}


def run(
  cases: Dict[str, Case], rss: Callable[[], float], rounds: int = ROUNDS
) -> Tuple[Dict[str, float], List[Tuple[str, Answer]]]:
  """Each case once (warm), then `rounds` rounds with the server's `rss`
  read before and after -> (figures, every (case, answer) of the rounds)."""
  for request, _, _ in cases.values():
    request()
  before = rss()
  answers = [(case, request()) for _ in range(rounds) for case, (request, _, _) in cases.items()]
  after = rss()
  return {
    "serve.bad_requests": len(answers),
    "serve.bad_5xx": sum(a[0] >= 500 or a[0] == 0 for _, a in answers),
    "serve.bad_max_ms": 1000 * max(a[2] for _, a in answers),
    "serve.bad_rss_after_vs_before": after / before,
  }, answers


def bench_bad_requests(model_dir: str) -> Dict[str, float]:
  """The suite against `beam-train serve` on a local port (this process)."""
  with serving(model_dir, **SUITE_CONFIG) as (server, versions):
    name = versions.current.name
    ask(server.port, "POST", f"/v1/models/{name}:predict", _predict_body([[1, 1]]))
    figures, _ = run(suite(server.port, name), rss_mb)
  return figures
