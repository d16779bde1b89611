"""`beam-train serve` under requests meant to bring it down (the suite of
`benchmarks.bad_requests`), over HTTP: each refused with a 4xx `{"error"}`
naming the limit and its flag, fast, and the server's memory after the load
as before it (100,000 clicks would cost the model 34 s and 9 GB)."""

import json
import os
import threading

import pytest

from benchmarks import bad_requests
from train.serve import app as serve_app
from train.serve.config import ServeConfig

NAME = "cat"
PREDICT = f"/v1/models/{NAME}:predict"
# How fast each refusal comes is measured by `benchmarks.bad_requests`
# (serve.bad_max_ms), not asserted here: a timed test fails on a busy machine.


@pytest.fixture(scope="module")
def server(trained):
  """The server on a free port, in a thread of this process, with the
  suite's limits: (port, server)."""
  config = ServeConfig(model=trained, model_name=NAME, port=0, **bad_requests.SUITE_CONFIG)
  with serve_app.running(config) as (srv, _):
    yield srv.port, srv
  assert srv.stopped, "the server is still serving"


def _predict_body(clicks):
  return json.dumps(
    {"inputs": {"image": [[[1, 2, 3]] * 20] * 20, "positive_clicks": clicks, "negative_clicks": []}}
  ).encode()


def test_bad_requests_are_refused_naming_the_limit_and_leave_no_memory(server):
  port, _ = server
  status, answer, _ = bad_requests.ask(port, "POST", PREDICT, _predict_body([[3, 4]]))
  assert status == 200, answer  # Warm: the model traced, the threads started.
  cases = bad_requests.suite(port, NAME)
  figures, answers = bad_requests.run(cases, bad_requests.rss_mb, rounds=1)
  for case, (code, answer, _) in answers:
    _, status, words = cases[case]
    assert code == status, (case, code, answer)
    assert isinstance(answer, dict) and set(answer) == {"error"}, (case, answer)
    assert all(w in answer["error"] for w in words), (case, words, answer)
  assert figures["serve.bad_5xx"] == 0
  assert figures["serve.bad_rss_after_vs_before"] <= 1.1, figures


def test_the_page_reads_a_json_body_whatever_its_content_type(server):
  port, _ = server
  image_id = bad_requests.upload(port)
  body = json.dumps({"id": image_id, "positive": [[5, 5]], "negative": []}).encode()
  for headers in ({}, {"Content-Type": "text/plain"}, {"Content-Type": "application/json"}):
    status, answer, _ = bad_requests.ask(port, "POST", "/page/segment", body, headers)
    assert status == 200, (headers, answer)
    assert answer["pixels"] >= 0


def test_a_burst_waits_its_turn_on_the_threads(server):
  """More requests at once than --threads: each answered, none refused."""
  port, _ = server
  answers = []

  def ask():
    answers.append(bad_requests.ask(port, "POST", PREDICT, _predict_body([[2, 2]]))[0])

  threads = [threading.Thread(target=ask) for _ in range(12)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert answers == [200] * 12


def test_the_limits_are_checked_when_the_command_starts(trained):
  for field in ("max_clicks", "threads", "max_request_mb", "max_pixels"):
    with pytest.raises(ValueError, match="--" + field.replace("_", "-")):
      ServeConfig(model=trained, **{field: 0})
  for port in (-1, 65536, 99999):  # The socket would take 99999 as 34463.
    with pytest.raises(ValueError, match="--port must be within 0..65535"):
      ServeConfig(model=trained, port=port)
  with pytest.raises(ValueError, match="--save-dir .* is a file, not a folder"):
    ServeConfig(model=trained, save_dir=os.path.join(trained, "config.json"))
