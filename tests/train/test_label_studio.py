"""`beam-train serve` as Label Studio's ML backend: the brush RLE against
Label Studio's own SDK, /health, /setup, interactive and batch /predict
with the task image fetched from Label Studio's address with its token,
webhooks that keep and remove annotations in the label store, and refusals
that name the field and never answer 500."""

import base64
import http.server
import importlib.metadata
import importlib.util
import io
import json
import socketserver
import threading
import time

import numpy as np
import pytest
from PIL import Image

from tests import label_studio_env as lse
from tests.helpers import png
from train.serve import app as serve_app
from beam_prep import brush
from train.serve import label_studio as lsb, page
from train.serve.config import ServeConfig

H, W = 96, 128
LS_TOKEN = "0123456789abcdef0123456789abcdef01234567"
PERSONAL_TOKEN = (
  "eyJhbGciOiJIUzI1NiJ9.eyJ0b2tlbl90eXBlIjoicmVmcmVzaCJ9.c2lnbmF0dXJl"  # A JWT's shape.
)
ACCESS_TOKEN = "eyJhbGciOiJIUzI1NiJ9.eyJ0b2tlbl90eXBlIjoiYWNjZXNzIn0.c2lnbmF0dXJl"
CONFIG = """<View>
  <Image name="image" value="$image" zoom="true"/>
  <BrushLabels name="tag" toName="image"><Label value="Cat"/><Label value="Object"/></BrushLabels>
  <KeyPointLabels name="kp" toName="image" smart="true">
    <Label value="Object" smart="true"/>
  </KeyPointLabels>
  <RectangleLabels name="rect" toName="image" smart="true"><Label value="Object"/></RectangleLabels>
</View>"""


def _sdk_brush():
  """label_studio_sdk's brush module (numpy and PIL only), without importing
  the SDK's client (installed with --no-deps by `make`)."""
  path = importlib.metadata.distribution("label-studio-sdk").locate_file(
    "label_studio_sdk/converter/brush.py"
  )
  spec = importlib.util.spec_from_file_location("label_studio_brush", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _masks():
  rng = np.random.default_rng(3)
  yield np.array([[0, 0, 0, 0], [0, 1, 1, 0], [0, 0, 0, 0]], bool)
  yield np.ones((1, 1), bool)
  yield np.zeros((5, 7), bool)
  yield np.ones((300, 260), bool)  # Runs longer than the longest length field.
  for h, w in ((48, 64), (97, 131)):
    m = np.zeros((h, w), bool)
    m[h // 4 : h // 2, w // 5 : w - 3] = True
    m[rng.random((h, w)) < 0.05] = True
    yield m


def test_brush_rle_is_label_studio_s_own():
  sdk = _sdk_brush()
  for mask in _masks():
    h, w = mask.shape
    ours = brush.encode(mask)
    theirs = sdk.mask2rle(mask.astype(np.uint8) * 255)
    # The same bits; the SDK pads a whole zero byte where the bits end on one.
    assert ours == theirs[: len(ours)] and theirs[len(ours) :] in ([], [0])
    assert (sdk.decode_rle(ours).reshape(h, w, 4)[:, :, 3] == mask * 255).all()
    np.testing.assert_array_equal(
      brush.decode(sdk.mask2rle(mask.astype(np.uint8) * 255), h, w), mask
    )
  # Values one by one (runs of 1, as a brush drawn with soft edges gives).
  values = np.zeros((6, 5, 4), np.uint8)
  values[..., 3] = np.arange(30).reshape(6, 5) * 8
  rle = sdk.encode_rle(values.ravel())
  np.testing.assert_array_equal(brush.decode(rle, 6, 5), values[..., 3] >= 128)


@pytest.mark.parametrize(
  "rle, size, message",
  [
    ("abc", (3, 4), "byte values"),
    ([0, 0, 0, 48, 300], (3, 4), "byte values"),
    ([0, 0, 0, 48, 57, 27, 254, 19], (3, 4), "ends before"),
    ([255, 255, 255, 255, 57, 27, 254, 19, 0], (3, 4), "4294967295 values"),
    ([], (3, 4), "ends before"),
  ],
)
def test_a_bad_rle_is_refused_with_its_reason(rle, size, message):
  with pytest.raises(brush.BrushError, match=message):
    brush.decode(rle, *size)


class _LabelStudioFiles(http.server.BaseHTTPRequestHandler):
  """Label Studio's /data/upload/... files, for its legacy token or an
  access token its /api/token/refresh/ gave for the personal token."""

  files = {}

  def do_POST(self):  # noqa: N802 (http.server's name)
    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
    if self.path != "/api/token/refresh/" or body.get("refresh") != PERSONAL_TOKEN:
      self.send_error(401)
      return
    self._send(json.dumps({"access": ACCESS_TOKEN}).encode(), "application/json")

  def do_GET(self):  # noqa: N802 (http.server's name)
    if self.headers.get("Authorization") not in (f"Token {LS_TOKEN}", f"Bearer {ACCESS_TOKEN}"):
      self.send_error(401)
    elif self.path not in self.files:
      self.send_error(404)
    else:
      self._send(self.files[self.path], "image/png")

  def _send(self, data, kind):
    self.send_response(200)
    self.send_header("Content-Type", kind)
    self.end_headers()
    self.wfile.write(data)

  def log_message(self, *args):
    pass


def _scene():
  yy, xx = np.mgrid[:H, :W]
  disk = (xx - 40) ** 2 + (yy - 48) ** 2 <= 22**2
  image = np.full((H, W, 3), 90, np.uint8)
  image[disk] = (220, 40, 30)
  image[10:40, 90:120] = (30, 60, 220)
  return image


@pytest.fixture(scope="module")
def backend(trained, trained_versions, tmp_path_factory):
  """(client, Label Studio's address, save dir): a server saving into a folder,
  and Label Studio's file server holding one task image."""

  scene = png(_scene())
  _LabelStudioFiles.files = {
    "/data/upload/1/0a1b2c3d-scene.png": scene,
    "/data/upload/1/my%20scene.png": scene,
  }
  files = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _LabelStudioFiles)
  threading.Thread(target=files.serve_forever, daemon=True).start()
  save = str(tmp_path_factory.mktemp("ls_labels"))
  config = ServeConfig(model=trained, save_dir=save)
  app = serve_app.make_app(config, trained_versions, page.Sources())
  yield app.test_client(), f"http://127.0.0.1:{files.server_port}", save
  app.extensions[serve_app.LABELS].close()
  files.shutdown()


def _task(task_id=7):
  return {"id": task_id, "data": {"image": "/data/upload/1/0a1b2c3d-scene.png"}}


def _keypoint(x, y, positive=None, label="Object"):
  return lse.keypoint(x, y, W, H, positive, label)


def _predict(client, regions, project="1.1764000000", **extra):
  body = {
    "tasks": [_task()],
    "project": project,
    "label_config": CONFIG,
    "params": {"login": None, "password": None, "context": {"result": regions}},
    **extra,
  }
  return client.post("/predict", json=body)


def _region_mask(answer):
  (result,) = answer["results"]
  (region,) = result["result"]
  assert region["type"] == "brushlabels" and region["value"]["format"] == "rle"
  assert (region["from_name"], region["to_name"]) == ("tag", "image")
  assert (region["original_width"], region["original_height"]) == (W, H)
  mask = _sdk_brush().decode_rle(region["value"]["rle"]).reshape(H, W, 4)[:, :, 3] > 0
  return mask, region


def _version(client):
  """'cat/V': the model and the version serving (TF Serving's status)."""
  return "cat/" + client.get("/v1/models/cat").get_json()["model_version_status"][0]["version"]


def _setup(client, url):
  r = client.post(
    "/setup",
    json={"project": "1.1764000000", "schema": CONFIG, "hostname": url, "access_token": LS_TOKEN},
  )
  assert r.status_code == 200 and r.get_json()["model_version"] == _version(client), r.get_json()


def test_a_keypoint_gives_the_page_s_mask_as_a_brush_region(backend):
  client, url, _ = backend
  health = client.get("/health").get_json()
  assert health["status"] == "UP" and health["model_version"] == _version(client)
  _setup(client, url)
  r = _predict(client, [_keypoint(40, 48)])
  assert r.status_code == 200, r.get_json()
  mask, region = _region_mask(r.get_json())
  assert region["value"]["brushlabels"] == ["Object"] and 0 < region["score"] <= 1
  opened = client.post(
    "/page/upload",
    data={"file": (io.BytesIO(png(_scene())), "scene.png")},
    content_type="multipart/form-data",
  ).get_json()
  seg = client.post("/page/segment", json={"id": opened["id"], "positive": [[40, 48]]}).get_json()
  np.testing.assert_array_equal(mask, _png_mask(seg["mask"]))
  # The next keypoint refines this mask, as the page's next click does.
  two = _predict(client, [_keypoint(40, 48), _keypoint(110, 20, positive=False)])
  seg2 = client.post(
    "/page/segment",
    json={
      "id": opened["id"],
      "positive": [[40, 48]],
      "negative": [[110, 20]],
      "previous": seg["probabilities"],
    },
  ).get_json()
  np.testing.assert_array_equal(_region_mask(two.get_json())[0], _png_mask(seg2["mask"]))


def _png_mask(data_url):
  """The page's mask PNG data URL -> bool [H, W]."""
  return np.asarray(Image.open(io.BytesIO(base64.b64decode(data_url.split(",", 1)[1])))) > 0


def test_a_rectangle_is_the_models_box_prompt_and_labels_fall_back_to_the_brush(
  backend, trained_served
):
  client, url, _ = backend
  _setup(client, url)
  rect = {
    "type": "rectanglelabels",
    "from_name": "rect",
    "to_name": "image",
    "value": {
      "x": 10.0,
      "y": 20.0,
      "width": 40.0,
      "height": 50.0,
      "rotation": 0,
      "rectanglelabels": ["Dog"],
    },
  }
  r = _predict(client, [rect])
  assert r.status_code == 200, r.get_json()
  mask, region = _region_mask(r.get_json())
  assert region["value"]["brushlabels"] == ["Cat"]  # "Dog" is no brush label: the first one.
  box = (int(0.1 * W), int(0.2 * H), int(0.5 * W), int(0.7 * H))
  want = trained_served.segment(_scene(), [], [], box=box)["mask"] > 0
  np.testing.assert_array_equal(mask, want)  # serve_box's mask: none outside the box.
  # A keypoint in the rectangle refines the box's mask, the box kept.
  two = _predict(client, [rect, _keypoint(30, 40)])
  previous = want.astype(np.uint8)
  again = trained_served.segment(_scene(), [[30, 40]], [], previous=previous, box=box)
  np.testing.assert_array_equal(_region_mask(two.get_json())[0], again["mask"] > 0)


def test_batch_calls_predict_nothing_and_bad_contexts_name_the_field(backend):
  client, url, _ = backend
  _setup(client, url)
  for context in (None, {}):
    r = client.post("/predict", json={"tasks": [_task()], "params": {"context": context}})
    assert r.status_code == 200 and r.get_json()["results"] == []
  far = _predict(client, [_keypoint(10_000, -50)])  # Percents out of range: clamped.
  assert far.status_code == 200
  nan = dict(_keypoint(3, 3))
  nan["value"] = dict(nan["value"], x="12")
  for regions, field in (
    ("nope", "params.context.result"),
    ([{"type": "brushlabels"}], "params.context.result"),
    ([_keypoint(5, 5, positive=False)], "params.context.result: no positive keypoint"),
    ([nan], "params.context.result[0].value.x"),
    ([dict(_keypoint(3, 3), value=[1, 2])], "params.context.result[0].value"),
  ):
    r = _predict(client, regions)
    assert r.status_code == 400 and r.get_json()["error"].startswith(field), r.get_json()
  for body, field in (
    ({"tasks": "x"}, "tasks"),
    (
      {
        "tasks": [{"id": 1, "data": {}}],
        "label_config": CONFIG,
        "params": {"context": {"result": []}},
      },
      "tasks[0].data.image",
    ),
    (
      {"tasks": [_task()], "label_config": "<View>", "params": {"context": {"result": []}}},
      "label_config",
    ),
    (
      {"tasks": [_task()], "label_config": "<View/>", "params": {"context": {"result": []}}},
      "label_config",
    ),
    (
      {
        "tasks": [{"id": 1, "data": {"image": "s3://b/k.png"}}],
        "label_config": CONFIG,
        "params": {"context": {"result": []}},
      },
      "tasks[0].data.image",
    ),
  ):
    r = client.post("/predict", json=body)
    assert r.status_code == 400 and r.get_json()["error"].startswith(field), (body, r.get_json())
  unknown = _predict(client, [_keypoint(3, 3)], project="99.1")  # No /setup, no --label-studio-url.
  assert unknown.status_code == 400 and "--label-studio-url" in unknown.get_json()["error"]


def _brush_result(mask, h=H, w=W):
  return {
    "type": "brushlabels",
    "from_name": "tag",
    "to_name": "image",
    "original_width": w,
    "original_height": h,
    "value": {"format": "rle", "rle": brush.encode(mask), "brushlabels": ["Cat"]},
  }


def test_webhooks_keep_and_remove_annotations_in_the_label_store(backend):
  client, url, save = backend
  _setup(client, url)
  labels = client.application.extensions[serve_app.LABELS]
  disk = np.zeros((H, W), bool)
  disk[30:60, 20:60] = True
  box = np.zeros((H, W), bool)
  box[10:40, 90:120] = True
  event = {
    "action": "ANNOTATION_CREATED",
    "annotation": {
      "id": 51,
      "completed_by": 3,
      "result": [_brush_result(disk), _brush_result(box)],
    },
    "task": _task(),
    "project": {"id": 1, "label_config": CONFIG},
  }
  r = client.post("/webhook", json=event)
  assert r.status_code == 200 and r.get_json()["saved"] == ["images/0a1b2c3d-scene.png"], (
    r.get_json()
  )
  (entry,) = labels.entries()
  assert entry["origin"] == {
    "tool": "label-studio",
    "project": "1",
    "task": 7,
    "annotation": 51,
    "annotator": 3,
  }
  instance = np.asarray(Image.open(f"{save}/masks/0a1b2c3d-scene.png"))
  np.testing.assert_array_equal(instance == 1, disk)
  np.testing.assert_array_equal(instance == 2, box)
  event["action"], event["annotation"]["result"] = "ANNOTATION_UPDATED", [_brush_result(box)]
  assert client.post("/webhook", json=event).status_code == 200
  assert len(labels.entries()[0]["annotations"]) == 1
  for bad, field in (
    ([_brush_result(box, h=H + 1)], "annotation.result[0]"),
    (
      [dict(_brush_result(box), value={"format": "rle", "rle": [255] * 9})],
      "annotation.result[0].value.rle",
    ),
    ([dict(_brush_result(box), value={"format": "polygon"})], "annotation.result[0].value"),
  ):
    r = client.post("/webhook", json=dict(event, annotation=dict(event["annotation"], result=bad)))
    assert r.status_code == 400 and r.get_json()["error"].startswith(field), r.get_json()
  assert client.post("/webhook", json={"action": "PROJECT_UPDATED"}).get_json()["ignored"]
  gone = client.post(
    "/webhook", json={"action": "ANNOTATIONS_DELETED", "annotations": [{"id": 51}]}
  )
  assert gone.get_json()["removed"] == ["images/0a1b2c3d-scene.png"] and labels.count() == 0
  assert client.post("/webhook", json=event).status_code == 200 and labels.count() == 1
  one = {"action": "ANNOTATION_DELETED", "annotation": {"id": 51}}
  assert client.post("/webhook", json=one).get_json()["removed"] and labels.count() == 0
  r = client.post("/webhook", json={"action": "ANNOTATION_DELETED", "annotation": "x"})
  assert r.status_code == 400 and r.get_json()["error"].startswith("annotations:")


@pytest.mark.parametrize(
  "token, ok", [(PERSONAL_TOKEN, True), (PERSONAL_TOKEN[:-3] + "xyz", False)]
)
def test_a_personal_access_token_is_exchanged_for_the_images(
  backend, trained, trained_versions, token, ok
):

  _, url, _ = backend
  config = ServeConfig(model=trained, label_studio_url=url, label_studio_token=token)
  app = serve_app.make_app(config, trained_versions, page.Sources())
  try:
    r = _predict(app.test_client(), [_keypoint(40, 48)], project="5.1")  # No /setup.
    if ok:
      assert r.status_code == 200 and _region_mask(r.get_json())[0].any(), r.get_json()
    else:
      assert r.status_code == 400 and "personal access token" in r.get_json()["error"]
  finally:
    app.extensions[serve_app.LABELS].close()


def _mutations(body, rng, n):
  """`n` copies of a JSON body, each with one value somewhere replaced by another kind."""
  odd = [None, True, -1, 1e308, float("-inf"), "x", "", [], {}, [[1, 2]], {"a": 1}, 2**70]

  def paths(v, at=()):
    yield at
    items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
    for k, child in items:
      yield from paths(child, at + (k,))

  every = list(paths(body))
  for _ in range(n):
    copy = json.loads(json.dumps(body))
    at = every[rng.integers(len(every))]
    if not at:
      yield odd[rng.integers(len(odd))]
      continue
    parent = copy
    for k in at[:-1]:
      parent = parent[k]
    parent[at[-1]] = odd[rng.integers(len(odd))]
    yield copy


def test_nothing_label_studio_could_send_answers_500(backend):
  client, url, _ = backend
  _setup(client, url)
  rng = np.random.default_rng(7)
  predict = {
    "tasks": [_task()],
    "project": "1.1",
    "label_config": CONFIG,
    "params": {"context": {"result": [_keypoint(40, 48), _keypoint(5, 5, positive=False)]}},
  }
  hook = {
    "action": "ANNOTATION_CREATED",
    "annotation": {"id": 9, "completed_by": 1, "result": [_brush_result(np.eye(H, W, dtype=bool))]},
    "task": _task(),
    "project": {"id": 1, "label_config": CONFIG},
  }
  for route, body in (("/predict", predict), ("/webhook", hook), ("/setup", {"project": "1.1"})):
    for bad in _mutations(body, rng, 60):
      r = client.post(route, json=bad)
      assert r.status_code < 500, (route, bad, r.get_json())
      assert r.status_code == 200 or "error" in r.get_json()


class _OddHost(socketserver.BaseRequestHandler):
  """An image host that answers no HTTP (`slow` False) or an image a byte at
  a time (`slow` True)."""

  def handle(self):
    self.request.recv(65536)
    if not self.server.slow:
      self.request.sendall(b"THIS IS NOT HTTP\r\n\r\n")
      return
    self.request.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 1000\r\n\r\n")
    for _ in range(1000):
      time.sleep(0.05)
      self.request.sendall(b"x")


def _odd_host(slow: bool) -> str:
  server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _OddHost)
  server.daemon_threads, server.slow = True, slow
  threading.Thread(target=server.serve_forever, daemon=True).start()
  return f"http://127.0.0.1:{server.server_address[1]}"


def test_hostile_values_urls_and_hosts_are_400s(backend, monkeypatch):
  client, url, _ = backend
  _setup(client, url)
  monkeypatch.setattr(lsb, "FETCH_TIMEOUT_S", 1.0)  # The slow host's byte a 0.05 s: over it.
  far = dict(_keypoint(3, 3))
  far["value"] = dict(far["value"], x=1.7e308)  # Its pixel (x W / 100) would be inf.
  box = {"type": "rectanglelabels", "value": {"x": -1e300, "y": 0, "width": 1e308, "height": 5}}
  for regions, field in (([far], "value.x"), ([box], "value.x")):
    r = _predict(client, regions)
    assert r.status_code == 400 and field in r.get_json()["error"], r.get_json()
  image = "tasks[0].data.image"
  for ref, reason in (
    ("http://[::1/x.png", "not a URL"),
    (f"{url}/a\x00.png", "answered 40"),  # Sent encoded, as a browser would.
    (_odd_host(slow=False) + "/x.png", "cannot be fetched"),
    (_odd_host(slow=True) + "/x.png", "not all sent within 1.0 s"),
  ):
    body = {"tasks": [{"id": 1, "data": {"image": ref}}], "label_config": CONFIG}
    r = client.post("/predict", json=dict(body, params={"context": {"result": [_keypoint(3, 3)]}}))
    error = r.get_json()["error"]
    assert r.status_code == 400 and reason in error and image in error, (ref, error)
  spaced = {"id": 1, "data": {"image": f"{url}/data/upload/1/my scene.png"}}  # As browsers fetch.
  r = _predict(client, [_keypoint(40, 48)], tasks=[spaced])
  assert r.status_code == 200 and _region_mask(r.get_json())[0].any(), r.get_json()
  listed = {"action": "ANNOTATIONS_CREATED", "annotation": [{"id": 24, "task": [7]}]}
  hook = dict(listed, task=[_task()], project={"id": 1, "label_config": CONFIG})
  r = client.post("/webhook", json=hook)
  assert r.status_code == 400 and "annotation[0].task" in r.get_json()["error"], r.get_json()
  r = client.post("/webhook", json={"action": "ANNOTATION_DELETED", "annotation": {"id": True}})
  assert r.status_code == 400 and r.get_json()["error"].startswith("annotations: "), r.get_json()
  r = client.post("/webhook", data='{"action": "\\ud800"}', content_type="application/json")
  assert r.status_code == 200 and r.get_json()["action"] == "\ud800", r.data


def test_a_turned_rectangle_is_the_box_of_its_corners():
  from train.serve.label_studio import parse_context  # pylint: disable=g-import-not-at-top

  def box(**value):
    region = {"type": "rectanglelabels", "value": dict(value, rectanglelabels=["Object"])}
    return parse_context({"result": [region]}, W, H).box

  # 20% x 30% of a 128 x 96 image at (50%, 10%): 25.6 x 28.8 pixels from (64, 9.6).
  assert box(x=50, y=10, width=20, height=30) == (64, 9, 89, 38)
  assert box(x=50, y=10, width=20, height=30, rotation=0) == (64, 9, 89, 38)
  # Turned 90 degrees clockwise about its top left corner: it spans x 35.2..64, y 9.6..35.2.
  assert box(x=50, y=10, width=20, height=30, rotation=90) == (35, 9, 64, 35)
  assert box(x=50, y=10, width=20, height=30, rotation=360) == (64, 9, 89, 38)
  with pytest.raises(page.RequestError, match=r"value\.rotation"):
    box(x=50, y=10, width=20, height=30, rotation="x")
