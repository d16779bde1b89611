"""CVAT's interactor function (`deploy/cvat/`): CVAT's request shapes sent
through nuclio's own Python SDK (its test platform calls `init_context`, then
the handler, as the runtime does) to a real `beam-train serve`; the mask is
the served model's, the outline traces it. CVAT itself needs Docker."""

import base64
import importlib.util
import json
import os
import socketserver
import sys
import threading

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image, ImageDraw
from scipy import ndimage

from tests.helpers import ROOT, png
from train.serve import app as serve_app
from train.serve.config import ServeConfig

nuclio_test = pytest.importorskip("nuclio_sdk.test", reason="pip install nuclio-sdk")
import nuclio_sdk  # noqa: E402

FUNCTION = os.path.join(ROOT, "deploy", "cvat")
TOKEN = "cvat-function-token"  # The server asks for it; the function sends it.


def _function_module():
  spec = importlib.util.spec_from_file_location(
    "cvat_beam_train_main", os.path.join(FUNCTION, "main.py")
  )
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # As nuclio's runtime imports `main`.
  spec.loader.exec_module(module)
  return module


@pytest.fixture(scope="module")
def function(trained, monkeypatch_module):
  config = ServeConfig(model=trained, model_name="cat", port=0, auth_token=TOKEN)
  with serve_app.running(config) as (server, _):
    monkeypatch_module.setenv("BEAM_TRAIN_SERVE_URL", f"http://127.0.0.1:{server.port}")
    monkeypatch_module.setenv("BEAM_TRAIN_MODEL", "cat")
    monkeypatch_module.setenv("BEAM_TRAIN_AUTH_TOKEN", TOKEN)
    module = _function_module()
    platform = nuclio_test.Platform()

    def call(body):
      event = nuclio_sdk.Event(body=body, content_type="application/json", method="POST")
      response = platform.call_handler(module.handler, event)
      return response.status_code, json.loads(response.body)

    yield call, module


@pytest.fixture(scope="module")
def monkeypatch_module():
  with pytest.MonkeyPatch.context() as mp:
    yield mp


def _frame(h=37, w=53):
  rng = np.random.default_rng(4)
  img = rng.integers(0, 80, (h, w, 3), dtype=np.uint8)
  img[8:30, 12:40] = (200, 60, 40)
  return img


def _filled(points, shape) -> np.ndarray:
  """The polygon `points` drawn filled, its outline included."""
  drawn = Image.new("L", (shape[1], shape[0]))
  ImageDraw.Draw(drawn).polygon([tuple(p) for p in points], fill=1, outline=1)
  return np.asarray(drawn, bool)


def test_a_click_request_answers_the_served_models_mask_and_its_outline(function, trained_loaded):
  call, module = function
  img = _frame()
  data = png(img)
  body = {
    "image": base64.b64encode(data).decode(),
    "pos_points": [[20, 15], [30.4, 20.6]],
    "neg_points": [[2, 2]],
    "obj_bbox": None,
  }  # As CVAT sends it (no box, no threshold).
  status, answer = call(body)
  assert status == 200, answer
  mask = np.asarray(answer["mask"], np.uint8)
  direct = trained_loaded.signatures["serving_default"]
  want = direct(
    image=tf.constant(img),
    positive_clicks=tf.constant([[20, 15], [30, 21]], tf.int32),
    negative_clicks=tf.constant([[2, 2]], tf.int32),
  )
  np.testing.assert_array_equal(mask, want["mask"].numpy())
  prob = want["probabilities"].numpy()
  assert bool(answer["points"]) == bool(mask.any())
  if mask.any():  # The outline is that of the mask's largest part, holes filled ...
    parts, n = ndimage.label(mask, structure=np.ones((3, 3)))
    sizes = ndimage.sum_labels(mask, parts, range(1, n + 1))
    largest = parts == 1 + int(np.argmax(sizes))
    filled, whole = _filled(answer["points"], mask.shape), ndimage.binary_fill_holes(largest)
    assert (filled >= whole).all()
    # ... and background pixels the 8-connected outline passes at a diagonal pinch.
    assert not (filled & ~ndimage.binary_dilation(whole, np.ones((3, 3)))).any()
  # A threshold of CVAT's: the served probabilities, in 8-bit steps.
  status, answer = call(dict(body, threshold=0.3))
  assert status == 200
  got = np.asarray(answer["mask"], bool)
  sure = np.abs(prob - 0.3) > 1 / 255
  np.testing.assert_array_equal(got[sure], (prob > 0.3)[sure])
  # The body as JSON text, as nuclio hands it over without a JSON content type.
  assert call(json.dumps(body))[0] == 200


@pytest.mark.parametrize(
  "change, field",
  [
    ({"image": None}, "image"),
    ({"image": "not base64!"}, "image"),
    ({"pos_points": []}, "pos_points"),
    ({"pos_points": [[1, 2, 3]]}, "pos_points"),
    ({"neg_points": "x"}, "neg_points"),
    ({"obj_bbox": [[0, 0], [5]]}, "obj_bbox"),
    ({"obj_bbox": [[0, 0], [5, "x"]]}, "obj_bbox"),
    ({"obj_bbox": [float("nan"), 0, 5, 5]}, "obj_bbox"),
    ({"pos_points": [[float("nan"), 1]]}, "pos_points"),
    ({"pos_points": [[float("inf"), 1]]}, "pos_points"),
    ({"neg_points": [[True, False]]}, "neg_points"),
    ({"pos_points": [[2**40, 1]]}, "pos_points"),
    ({"threshold": 2}, "threshold"),
  ],
)
def test_a_bad_request_is_a_400_naming_the_field(function, change, field):
  call, _ = function
  body = dict(
    {"image": base64.b64encode(png(_frame())).decode(), "pos_points": [[5, 5]], "neg_points": []},
    **change,
  )
  status, answer = call(body)
  assert status == 400 and answer["error"].startswith(f"{field}:"), answer


def test_a_file_that_is_no_image_is_the_servers_reason_in_a_502(function):
  call, _ = function
  status, answer = call(
    {"image": base64.b64encode(b"no image").decode(), "pos_points": [[1, 1]], "neg_points": []}
  )
  assert status == 502 and "HTTP 400" in answer["error"], answer


class _NoHttp(socketserver.BaseRequestHandler):
  def handle(self):
    self.request.recv(65536)
    self.request.sendall(b"THIS IS NOT HTTP\r\n\r\n")


def test_a_server_answering_no_http_is_a_502(monkeypatch):
  host = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _NoHttp)
  threading.Thread(target=host.serve_forever, daemon=True).start()
  monkeypatch.setenv("BEAM_TRAIN_SERVE_URL", f"http://127.0.0.1:{host.server_address[1]}")
  monkeypatch.setenv("BEAM_TRAIN_MODEL", "cat")
  module = _function_module()
  body = {"image": base64.b64encode(png(_frame())).decode(), "pos_points": [[5, 5]]}
  response = nuclio_test.Platform().call_handler(module.handler, nuclio_sdk.Event(body=body))
  host.shutdown()
  assert response.status_code == 502, response.body
  assert "beam-train serve at http://127.0.0.1" in json.loads(response.body)["error"]


def test_the_outline_follows_the_largest_part_clockwise():
  outline = _function_module().outline
  square = np.zeros((10, 12), bool)
  square[2:6, 3:9] = True
  square[8, 0] = True  # A smaller part: left out.
  assert outline(square) == [[3, 2], [8, 2], [8, 5], [3, 5]]
  assert outline(np.zeros((4, 4), bool)) == []
  one = np.zeros((3, 3), bool)
  one[1, 1] = True
  assert outline(one) == [[1, 1]]
  yy, xx = np.mgrid[:64, :80]
  disk = (yy - 30) ** 2 + (xx - 41) ** 2 <= 20**2
  np.testing.assert_array_equal(_filled(outline(disk), disk.shape), disk)
  ring = disk & ((yy - 30) ** 2 + (xx - 41) ** 2 > 8**2)  # A hole: filled by the outline.
  np.testing.assert_array_equal(_filled(outline(ring), ring.shape), disk)
  # A ring of diagonal steps alone (8-connected): the background it closes is a hole too.
  diamond = np.abs(yy - 30) + np.abs(xx - 41)
  np.testing.assert_array_equal(_filled(outline(diamond == 9), disk.shape), diamond <= 9)


def test_a_wrong_token_is_the_servers_401_in_a_502(function, monkeypatch):
  monkeypatch.setenv("BEAM_TRAIN_AUTH_TOKEN", "wrong")
  module = _function_module()  # A new deployment, with the wrong token.
  event = nuclio_sdk.Event(
    body={
      "image": base64.b64encode(png(_frame())).decode(),
      "pos_points": [[5, 5]],
      "neg_points": [],
    }
  )
  response = nuclio_test.Platform().call_handler(module.handler, event)
  assert response.status_code == 502 and "HTTP 401" in json.loads(response.body)["error"]


def test_without_the_models_name_the_function_does_not_start(monkeypatch):
  monkeypatch.delenv("BEAM_TRAIN_MODEL", raising=False)
  module = _function_module()
  with pytest.raises(RuntimeError, match="BEAM_TRAIN_MODEL is not set"):
    nuclio_test.Platform().call_handler(module.handler, nuclio_sdk.Event(body={}))


def test_a_box_request_answers_the_served_box_prompts_mask(function, trained_loaded):
  call, _ = function
  img = _frame()
  body = {
    "image": base64.b64encode(png(img)).decode(),
    "pos_points": [],
    "neg_points": [],
    "obj_bbox": [[40, 30], [12, 8]],  # Corners as dragged: bottom right first.
  }
  status, answer = call(body)
  assert status == 200, answer
  mask = np.asarray(answer["mask"], np.uint8)
  direct = trained_loaded.signatures["serve_box"]
  want = direct(
    image=tf.constant(img),
    box=tf.constant([12, 8, 40, 30], tf.int32),
    positive_clicks=tf.zeros([0, 2], tf.int32),
    negative_clicks=tf.zeros([0, 2], tf.int32),
  )["mask"].numpy()
  np.testing.assert_array_equal(mask, want)
  assert not mask[:8].any() and not mask[:, 41:].any()  # Nothing outside the box.
  # With a positive point too, and the box flat, as other clients send it.
  status, answer = call(dict(body, pos_points=[[20, 15]], obj_bbox=[12, 8, 40, 30]))
  assert status == 200, answer


def test_the_function_yaml_declares_an_interactor_of_points_or_a_box():
  text = open(os.path.join(FUNCTION, "function.yaml")).read()
  for line in (
    "type: interactor",
    "min_pos_points: 0",
    "min_neg_points: 0",
    "startswith_box: false",
    "startswith_box_optional: true",
    "handler: main:handler",
  ):
    assert line in text, line
