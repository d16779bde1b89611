"""`beam-train serve`: TF Serving's REST API against the SavedModel called
directly, every refused request, the page's endpoints, several clients at
once, the command line, and the page in a real browser (headless Chromium)."""

import base64
import io
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image
from scipy import ndimage

from beam_prep import keys
from beam_prep.ops.image import decode_file
from tests import helpers
from tests.helpers import ROOT, assert_encoded_answer, encoded, png, unpng
from train.export.saved_model import latest_export
from train.evaluate.noc import eval_objects
from beam_prep.prep_output import PrepOutput
from beam_prep.record_codec import RecordCodec
from train.serve import app as serve_app
from train.serve import json_arrays
from train.serve.config import ServeConfig

NAME = "cat"


@pytest.fixture(scope="module")
def images_dir(tmp_path_factory):
  """--images: a PNG, a JPEG whose EXIF says 'rotate 90', one in a subfolder;
  and a secret beside the folder."""
  root = tmp_path_factory.mktemp("pics")
  folder = root / "images"
  (folder / "sub").mkdir(parents=True)
  rng = np.random.default_rng(1)
  (folder / "a.png").write_bytes(png(rng.integers(0, 255, (30, 40, 3), dtype=np.uint8)))
  (folder / "sub" / "b.png").write_bytes(png(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)))
  im = Image.fromarray(rng.integers(0, 255, (24, 48, 3), dtype=np.uint8))
  exif = Image.Exif()
  exif[0x0112] = 6  # orientation: rotate 90 (viewers show it 24 wide, 48 high)
  buf = io.BytesIO()
  im.save(buf, format="JPEG", exif=exif)
  (folder / "phone.jpg").write_bytes(buf.getvalue())
  (root / "secret.png").write_bytes(png(np.zeros((4, 4, 3), np.uint8)))
  os.symlink(root / "secret.png", folder / "link.png")
  return str(folder)


@pytest.fixture(scope="module")
def served(trained, prep_dir, images_dir):
  """The server on a free port of 127.0.0.1, in a thread: (base URL, server)."""
  config = ServeConfig(model=trained, model_name=NAME, port=0, images=images_dir, data=prep_dir)
  with serve_app.running(config) as (server, _):
    yield f"http://127.0.0.1:{server.port}", server


@pytest.fixture(scope="module")
def client(served):
  return served[1].app.test_client()


@pytest.fixture(scope="module")
def direct(trained_loaded):
  """The SavedModel's signatures, called without the server."""
  return trained_loaded.signatures


def _image(h=37, w=53, seed=0):
  return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _predict_body(image, pos, neg, **extra):
  return json.dumps(
    {"inputs": {"image": image.tolist(), "positive_clicks": pos, "negative_clicks": neg}, **extra}
  )


def _direct_call(direct, image, pos, neg):
  out = direct["serving_default"](
    image=tf.constant(image),
    positive_clicks=tf.constant(np.reshape(pos, (-1, 2)), tf.int32),
    negative_clicks=tf.constant(np.reshape(neg, (-1, 2)), tf.int32),
  )
  return {k: v.numpy() for k, v in out.items()}


def _same_outputs(answer, want):
  np.testing.assert_array_equal(np.asarray(answer["mask"], np.uint8), want["mask"])
  # float32 written as the shortest text that reads back to the same float32.
  np.testing.assert_array_equal(
    np.asarray(answer["probabilities"], np.float32), want["probabilities"]
  )


def test_status_and_metadata_are_tf_servings_json(client, trained):
  version = os.path.basename(latest_export(trained))
  status = client.get(f"/v1/models/{NAME}").get_json()
  assert status == {
    "model_version_status": [
      {
        "version": version,
        "state": "AVAILABLE",
        "status": {"error_code": "OK", "error_message": ""},
      }
    ]
  }
  assert client.get(f"/v1/models/{NAME}/versions/{version}").get_json() == status
  meta = client.get(f"/v1/models/{NAME}/metadata").get_json()
  assert meta["model_spec"] == {"name": NAME, "signature_name": "", "version": version}
  sigs = meta["metadata"]["signature_def"]["signature_def"]
  assert {"serving_default", "serve_examples"} <= set(sigs)
  image = sigs["serving_default"]["inputs"]["image"]
  assert image["dtype"] == "DT_UINT8"
  assert [d["size"] for d in image["tensor_shape"]["dim"]] == ["-1", "-1", "3"]
  assert sigs["serving_default"]["method_name"] == "tensorflow/serving/predict"
  assert set(sigs["serving_default"]["outputs"]) == {"probabilities", "mask"}


def test_columnar_predict_answers_what_the_saved_model_answers(client, direct, trained):
  image, pos, neg = _image(), [[10, 12], [30, 20]], [[50, 3]]
  r = client.post(f"/v1/models/{NAME}:predict", data=_predict_body(image, pos, neg))
  assert r.status_code == 200, r.get_json()
  assert set(r.get_json()) == {"outputs"}
  _same_outputs(r.get_json()["outputs"], _direct_call(direct, image, pos, neg))
  # A version in the URL, a signature named, "[]" for no negative click, a
  # 64x64 image (parsed by the numpy fast path) and a click outside (clamped).
  version = os.path.basename(latest_export(trained))
  image = _image(64, 64, seed=2)
  r = client.post(
    f"/v1/models/{NAME}/versions/{version}:predict",
    data=_predict_body(image, [[500, -4]], [], signature_name="serving_default"),
  )
  assert r.status_code == 200, r.get_json()
  _same_outputs(r.get_json()["outputs"], _direct_call(direct, image, [[63, 0]], []))
  # A box prompt: serve_box, its inputs named as TF Serving names them.
  box, none = [10, 5, 40, 30], np.zeros([0, 2], np.int32)
  inputs = {"image": image.tolist(), "box": box, "positive_clicks": [], "negative_clicks": []}
  r = client.post(
    f"/v1/models/{NAME}:predict", json={"signature_name": "serve_box", "inputs": inputs}
  )
  assert r.status_code == 200, r.get_json()
  want = direct["serve_box"](
    image=tf.constant(image), box=tf.constant(box), positive_clicks=none, negative_clicks=none
  )
  _same_outputs(r.get_json()["outputs"], {k: v.numpy() for k, v in want.items()})


def test_row_predict_of_the_batch_signature(client, direct, prep_dir):
  prep = PrepOutput(prep_dir)  # The example view: what serve_examples takes.
  examples = [
    RecordCodec(prep.table).encode(ex) for ex in prep.read_numpy(keys.EVAL_SPLIT, limit=2)
  ]
  want = {k: v.numpy() for k, v in direct["serve_examples"](examples=tf.constant(examples)).items()}
  plain = [{"b64": base64.b64encode(e).decode()} for e in examples]
  for instances in (plain, [{"examples": p} for p in plain]):
    r = client.post(
      f"/v1/models/{NAME}:predict",
      json={"signature_name": "serve_examples", "instances": instances},
    )
    assert r.status_code == 200, r.get_json()
    predictions = r.get_json()["predictions"]
    assert len(predictions) == 2 and set(predictions[0]) == {"probabilities", "mask"}
    for i, p in enumerate(predictions):
      _same_outputs(p, {k: v[i] for k, v in want.items()})
  # The same signature in columnar form.
  r = client.post(
    f"/v1/models/{NAME}:predict",
    json={"signature_name": "serve_examples", "inputs": {"examples": plain}},
  )
  _same_outputs(r.get_json()["outputs"], want)


def _b64(data: bytes):
  return {"b64": base64.b64encode(data).decode()}


def _png_header(w, h):
  """A PNG that declares w x h pixels and holds none."""
  import struct  # pylint: disable=g-import-not-at-top
  import zlib  # pylint: disable=g-import-not-at-top

  def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

  return (
    b"\x89PNG\r\n\x1a\n"
    + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
    + chunk(b"IDAT", zlib.compress(b""))
    + chunk(b"IEND", b"")
  )


def _png_answer(answer):
  """An answer of an encoded signature, {name: {"b64": ...}} -> {name: the PNG file}."""
  assert {k: set(v) for k, v in answer.items()} == {
    "mask_bytes": {"b64"},
    "probabilities_bytes": {"b64"},
  }, answer
  return {k: base64.b64decode(v["b64"]) for k, v in answer.items()}


def test_encoded_images_over_rest_as_tf_serving_takes_them(client, served, direct, images_dir):
  sigs = client.get(f"/v1/models/{NAME}/metadata").get_json()["metadata"]["signature_def"][
    "signature_def"
  ]
  for name in ("serve_encoded", "serve_iterative_encoded"):
    assert sigs[name]["inputs"]["image_bytes"]["dtype"] == "DT_STRING"
    assert [d["size"] for d in sigs[name]["inputs"]["positive_clicks"]["tensor_shape"]["dim"]] == [
      "-1",
      "-1",
      "2",
    ]
    assert {k: v["dtype"] for k, v in sigs[name]["outputs"].items()} == {
      "mask_bytes": "DT_STRING",
      "probabilities_bytes": "DT_STRING",
    }
  # A phone photo (EXIF: turned to show it 24 wide, 48 high), sent as b64.
  jpeg = open(os.path.join(images_dir, "phone.jpg"), "rb").read()
  pos, neg = [[5, 40], [12, 30]], [[20, 3]]
  url = f"/v1/models/{NAME}:predict"

  def want(negative, previous=None):
    """The SavedModel's PNG files, checked against the array signature's arrays."""
    inputs = {
      "image_bytes": tf.constant([jpeg]),
      "positive_clicks": tf.constant([pos], tf.int32),
      "negative_clicks": tf.constant(np.reshape(negative, (1, -1, 2)), tf.int32),
    }
    if previous is None:
      out = direct["serve_encoded"](**inputs)
      arrays = _direct_call(direct, decode_file(jpeg), pos, negative)
    else:
      out = direct["serve_iterative_encoded"](**inputs, previous_mask=tf.constant(previous[None]))
      arrays = {
        k: v.numpy()
        for k, v in direct["serve_iterative"](
          image=tf.constant(decode_file(jpeg)),
          positive_clicks=tf.constant(pos, tf.int32),
          negative_clicks=tf.constant(np.reshape(negative, (-1, 2)), tf.int32),
          previous_mask=tf.constant(previous),
        ).items()
      }
    files = {k: v.numpy()[0] for k, v in out.items()}
    assert_encoded_answer(files, arrays)
    return files

  # Columnar: a batch of one in each input ("[[]]": no negative click).
  for negative in (neg, []):
    r = client.post(
      url,
      json={
        "signature_name": "serve_encoded",
        "inputs": {
          "image_bytes": [_b64(jpeg)],
          "positive_clicks": [pos],
          "negative_clicks": [negative],
        },
      },
    )
    assert r.status_code == 200, r.get_json()
    answer = _png_answer({k: v[0] for k, v in r.get_json()["outputs"].items()})
    assert unpng(answer["mask_bytes"]).shape == (48, 24)
    assert answer == want(negative)
  # Rows, through the port: one instance per image, "[]" for no negative click.
  body = {
    "signature_name": "serve_encoded",
    "instances": [{"image_bytes": _b64(jpeg), "positive_clicks": pos, "negative_clicks": []}],
  }
  [answer] = _post(f"{served[0]}{url}", json.dumps(body).encode())["predictions"]
  assert _png_answer(answer) == want([])
  # The next click, with the previous mask: the decoded PNG (0 / 255) as is.
  previous = unpng(_png_answer(answer)["mask_bytes"])
  r = client.post(
    url,
    json={
      "signature_name": "serve_iterative_encoded",
      "instances": [
        {
          "image_bytes": _b64(jpeg),
          "positive_clicks": pos,
          "negative_clicks": neg,
          "previous_mask": previous.tolist(),
        }
      ],
    },
  )
  assert r.status_code == 200, r.get_json()
  assert _png_answer(r.get_json()["predictions"][0]) == want(neg, previous)


def test_string_outputs_in_rows_and_clicks_counted_in_batches():
  from train.serve import rest  # pylint: disable=g-import-not-at-top

  # A row of a string output is one bytes object (classification's label).
  body = rest.encode_outputs(
    {
      "label": np.array([b"red", b"blue"], object),
      "probabilities": np.array([[0.25, 0.75], [1, 0]], np.float32),
    },
    row=True,
  )
  assert json.loads(body)["predictions"] == [
    {"label": "red", "probabilities": [0.25, 0.75]},
    {"label": "blue", "probabilities": [1.0, 0.0]},
  ]
  # As in TF Serving, a string output whose name ends in "_bytes" is binary:
  # {"b64": ...} per value, in rows and columns; other names stay text.
  files = np.array([b"\x89PNG\xff", b""], object)
  for row, key in ((True, "predictions"), (False, "outputs")):
    answer = json.loads(
      rest.encode_outputs({"mask_bytes": files, "label": np.array([b"a", b"b"], object)}, row=row)
    )[key]
    if row:
      answer = {k: [a[k] for a in answer] for k in answer[0]}
    assert answer == {"mask_bytes": [{"b64": "iVBOR/8="}, {"b64": ""}], "label": ["a", "b"]}
  # --max-clicks counts [x, y] pairs, batched ([B, N, 2]) or not, lists or arrays.
  batched = {"positive_clicks": [[[[1, 2], [3, 4]]]], "negative_clicks": [np.zeros((1, 1, 2))]}
  rest.check_clicks(batched, 3)
  with pytest.raises(rest.RequestError, match="3 clicks in one request.*at most 2"):
    rest.check_clicks(batched, 2)


def test_the_jobs_records_sent_to_serve_examples_are_refused_in_one_line(client, prep_dir):
  from tests.helpers import records  # pylint: disable=g-import-not-at-top

  job = [r.SerializeToString() for r in records(prep_dir, keys.EVAL_SPLIT)][:2]
  r = client.post(
    f"/v1/models/{NAME}:predict",
    json={"signature_name": "serve_examples", "instances": [_b64(e) for e in job]},
  )
  assert r.status_code == 400
  error = r.get_json()["error"]
  assert "\n" not in error and error.startswith("examples[0]: feature '"), error
  assert (
    "holds string values where serve_examples reads int64: beam-prep's records stack an "
    "object's click variants"
  ) in error, error


def test_row_format_on_the_unbatched_signature_is_refused_as_tf_serving_does(client):
  # TF Serving stacks instances into a batch dimension the signature does not
  # have; its graph then refuses the request. Here: a 400 saying what to send.
  r = client.post(
    f"/v1/models/{NAME}:predict",
    json={
      "instances": [
        {"image": _image(8, 8).tolist(), "positive_clicks": [[1, 1]], "negative_clicks": []}
      ]
    },
  )
  assert r.status_code == 400
  error = r.get_json()["error"]
  assert "row format" in error and "batch dimension" in error and '"inputs"' in error


BAD = {
  "not JSON": (b"{nope", "not JSON"),
  "a list": (b"[1, 2]", "JSON object"),
  "both forms": ({"inputs": {}, "instances": []}, "'inputs'"),
  "no tensors": ({"signature_name": "serving_default"}, "'inputs'"),
  "signature_name type": ({"signature_name": 3, "inputs": {}}, "signature_name"),
  "unknown signature": ({"signature_name": "nope", "inputs": {}}, "signature_name"),
  "missing input": ({"inputs": {"image": [[[1, 2, 3]]], "negative_clicks": []}}, "positive_clicks"),
  "unknown input": (
    {
      "inputs": {
        "image": [[[1, 2, 3]]],
        "positive_clicks": [[0, 0]],
        "negative_clicks": [],
        "mask": [1],
      }
    },
    "mask",
  ),
  "float image": (
    {"inputs": {"image": [[[1.5, 2, 3]]], "positive_clicks": [[0, 0]], "negative_clicks": []}},
    "image",
  ),
  "string clicks": (
    {"inputs": {"image": [[[1, 2, 3]]], "positive_clicks": [["a", "b"]], "negative_clicks": []}},
    "positive_clicks",
  ),
  "bool clicks": (
    {
      "inputs": {
        "image": [[[1, 2, 3]]],
        "positive_clicks": [[0, 0]],
        "negative_clicks": [[True, False]],
      }
    },
    "negative_clicks",
  ),
  "ragged image": (
    {
      "inputs": {
        "image": [[[1, 2, 3]], [[1, 2]]],
        "positive_clicks": [[0, 0]],
        "negative_clicks": [],
      }
    },
    "image",
  ),
  "grey image": (
    {"inputs": {"image": [[1, 2], [3, 4]], "positive_clicks": [[0, 0]], "negative_clicks": []}},
    "image",
  ),
  "three numbers a click": (
    {"inputs": {"image": [[[1, 2, 3]]], "positive_clicks": [[0, 0, 1]], "negative_clicks": []}},
    "positive_clicks",
  ),
  "clicks past int64": (
    {
      "inputs": {
        "image": [[[1, 2, 3]]],
        "positive_clicks": [[2**70, -(2**63)]],
        "negative_clicks": [],
      }
    },
    "positive_clicks: values must be within -2147483648..2147483647",
  ),
  "clicks at 2**63": (
    {"inputs": {"image": [[[1, 2, 3]]], "positive_clicks": [[2**63, -1]], "negative_clicks": []}},
    "positive_clicks: values must be within",
  ),
  "a lone surrogate": (
    '{"signature_name": "serve_examples", "inputs": {"examples": ["\\ud800"]}}'.encode(),
    "examples: a string that is no UTF-8 text",
  ),
  **{
    f"a cut {kind} file": (
      {
        "signature_name": "serve_encoded",
        "instances": [
          {
            "image_bytes": _b64(encoded(Image.fromarray(_image(30, 40)), kind)[:cut]),
            "positive_clicks": [[0, 0]],
            "negative_clicks": [],
          }
        ],
      },
      "image_bytes: an image file that does not decode whole",
    )
    for kind, cut in (("JPEG", 1000), ("PNG", 60))
  },
  "over 255": (
    {"inputs": {"image": [[[1, 2, 300]]], "positive_clicks": [[0, 0]], "negative_clicks": []}},
    "image",
  ),
  "no positive click": (
    {"inputs": {"image": [[[1, 2, 3]]], "positive_clicks": [], "negative_clicks": []}},
    "positive_clicks",
  ),
  "empty image": (
    {
      "inputs": {
        "image": np.zeros((0, 4, 3), int).tolist(),
        "positive_clicks": [[0, 0]],
        "negative_clicks": [],
      }
    },
    "image",
  ),
  "not an image file": (
    {
      "signature_name": "serve_encoded",
      "instances": [
        {"image_bytes": _b64(b"junk"), "positive_clicks": [[0, 0]], "negative_clicks": []}
      ],
    },
    "image_bytes[0]: not an image file",
  ),
  "a TIFF file": (
    {
      "signature_name": "serve_encoded",
      "inputs": {
        "image_bytes": [_b64(encoded(Image.new("RGB", (4, 4)), "TIFF"))],
        "positive_clicks": [[[0, 0]]],
        "negative_clicks": [[]],
      },
    },
    "image_bytes[0]: a TIFF file",
  ),
  "over --max-pixels": (
    {
      "signature_name": "serve_encoded",
      "instances": [
        {
          "image_bytes": _b64(_png_header(5000, 5000)),
          "positive_clicks": [[0, 0]],
          "negative_clicks": [],
        }
      ],
    },
    "image_bytes[0]: 25000000 pixels",
  ),
  "a decompression bomb": (
    {
      "signature_name": "serve_encoded",
      "instances": [
        {
          "image_bytes": _b64(_png_header(20000, 20000)),
          "positive_clicks": [[0, 0]],
          "negative_clicks": [],
        }
      ],
    },
    "image_bytes[0]: a decompression bomb",
  ),
  "not base64": (
    {
      "signature_name": "serve_encoded",
      "instances": [
        {"image_bytes": {"b64": "@@"}, "positive_clicks": [[0, 0]], "negative_clicks": []}
      ],
    },
    "image_bytes",
  ),
  "batch sizes disagree": (
    {
      "signature_name": "serve_encoded",
      "inputs": {
        "image_bytes": [_b64(png(np.zeros((4, 4, 3), np.uint8)))],
        "positive_clicks": [[[1, 2]], [[2, 2]], [[3, 3]]],
        "negative_clicks": [[]],
      },
    },
    "inputs disagree on the batch size (image_bytes 1, negative_clicks 1, positive_clicks 3)",
  ),
  "an empty batch": ({"signature_name": "serve_examples", "inputs": {"examples": []}}, "examples"),
  "encoded, no positive click": (
    {
      "signature_name": "serve_encoded",
      "instances": [
        {
          "image_bytes": _b64(png(np.zeros((4, 4, 3), np.uint8))),
          "positive_clicks": [],
          "negative_clicks": [],
        }
      ],
    },
    "positive_clicks",
  ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_request_is_a_400_naming_the_field(client, case):
  body, field = BAD[case]
  data = body if isinstance(body, bytes) else json.dumps(body)
  r = client.post(f"/v1/models/{NAME}:predict", data=data)
  assert r.status_code == 400, (case, r.status_code, r.data[:300])
  assert set(r.get_json()) == {"error"} and field in r.get_json()["error"], r.get_json()


def test_unknown_models_versions_and_routes_are_404_json(client):
  assert client.get("/v1/models/dog").status_code == 404
  r = client.post("/v1/models/dog:predict", data=b"{}")
  assert r.status_code == 404 and "Servable not found" in r.get_json()["error"]
  assert client.get(f"/v1/models/{NAME}/versions/7").status_code == 404
  assert "error" in client.get("/nowhere").get_json()
  for url in (f"/v1/models/{NAME}:predict", f"/v1/models/{NAME}/versions/7:predict"):
    r = client.get(url)  # A method URL asked without POST: 405, as for any route.
    assert r.status_code == 405 and "POST" in r.headers["Allow"], (url, r.data)
  r = client.get("/v1/models/" + "d" * 100_000)
  assert r.status_code == 404 and len(r.data) < 500, r.data[:200]


def test_large_integer_arrays_parse_as_json_does():
  rng = np.random.default_rng(0)
  image = rng.integers(0, 256, (70, 40, 3))
  for seps in ((",", ":"), (", ", ": ")):
    text = json.dumps({"inputs": {"image": image.tolist(), "x": [1.5, 2]}}, separators=seps)
    doc = json_arrays.loads(text.encode())
    assert isinstance(doc["inputs"]["image"], np.ndarray)  # the fast path took it
    np.testing.assert_array_equal(doc["inputs"]["image"], image)
    assert doc["inputs"]["x"] == [1.5, 2]
  big = b"1," * 2000 + b"1"
  for text in (
    b'{"a": [' + b"-7," * 2000 + b"3]}",  # negative numbers
    b'{"a": [[' + big + b"],[" + big + b",1]]}",  # ragged: json's lists
    b'{"a": "[' + big + b']"}',  # inside a string
    b'{"a": [' + big.replace(b"1,1,", b"1 1,", 1) + b"]}",  # "1 1": not JSON
    b'{"a": [' + big.replace(b"1,1,", b"1-1,", 1) + b"]}",  # "1-1": not JSON
    b'{"a": [' + big + b",]}",
  ):  # trailing comma: not JSON
    try:
      want = json.loads(text)
    except ValueError:
      with pytest.raises(ValueError):
        json_arrays.loads(text)
      continue
    got = json_arrays.loads(text)
    assert json.dumps(got, default=lambda a: a.tolist()) == json.dumps(want)


def test_the_page_opens_uploads_with_exif_applied_and_the_limits_hold(
  client, trained, trained_versions, images_dir
):
  phone = open(os.path.join(images_dir, "phone.jpg"), "rb").read()
  r = client.post(
    "/page/upload",
    data={"file": (io.BytesIO(phone), "phone.jpg")},
    content_type="multipart/form-data",
  )
  assert r.status_code == 200, r.get_json()
  opened = r.get_json()
  assert (opened["width"], opened["height"], opened["truth"]) == (24, 48, False)
  shown = np.asarray(Image.open(io.BytesIO(client.get(f"/page/image/{opened['id']}.png").data)))
  from train.export.predict import load_image  # pylint: disable=g-import-not-at-top

  np.testing.assert_array_equal(shown, load_image(os.path.join(images_dir, "phone.jpg")))
  r = client.post(
    "/page/upload",
    data={"file": (io.BytesIO(b"not an image"), "x.png")},
    content_type="multipart/form-data",
  )
  assert r.status_code == 400 and "file" in r.get_json()["error"]
  # A server with small limits: pixels (the Beam job's guard) and bytes.
  config = ServeConfig(model=trained, max_pixels=1000, max_request_mb=0.05)
  from train.serve.page import Sources  # pylint: disable=g-import-not-at-top

  small = serve_app.make_app(config, trained_versions, Sources()).test_client()
  r = small.post(
    "/page/upload",
    data={"file": (io.BytesIO(png(_image(40, 40))), "big.png")},
    content_type="multipart/form-data",
  )
  assert r.status_code == 400 and "1000" in r.get_json()["error"], r.get_json()
  r = small.post(f"/v1/models/{NAME}:predict", data=_predict_body(_image(64, 64), [[1, 1]], []))
  assert r.status_code == 413 and "--max-request-mb" in r.get_json()["error"]
  # An encoded image, by the size its header declares, before it is decoded.
  r = small.post(
    f"/v1/models/{NAME}:predict",
    json={
      "signature_name": "serve_encoded",
      "instances": [
        {
          "image_bytes": _b64(png(_image(40, 40))),
          "positive_clicks": [[1, 1]],
          "negative_clicks": [],
        }
      ],
    },
  )
  assert r.status_code == 400 and "image_bytes[0]: 1600 pixels" in r.get_json()["error"]


def test_images_folder_serves_only_files_under_it(client):
  files = client.get("/page/sources").get_json()["files"]
  assert set(files) >= {"a.png", "phone.jpg", os.path.join("sub", "b.png")}
  r = client.post("/page/open", json={"file": os.path.join("sub", "b.png")})
  assert r.status_code == 200 and r.get_json()["width"] == 20
  for path in ("../secret.png", "sub/../../secret.png", "/etc/passwd", "link.png"):
    r = client.post("/page/open", json={"file": path})
    assert r.status_code == 403 and "outside" in r.get_json()["error"], (path, r.get_json())
  assert client.post("/page/open", json={"file": "none.png"}).status_code == 404
  assert client.post("/page/open", json={"eval": 10**6}).status_code == 400
  for bad in ({"file": "a.png\x00.png"}, {"file": "\ud800.png"}, {"file": 5}, {"file": None}):
    r = client.post("/page/open", data=json.dumps(bad))
    assert r.status_code == 400 and r.get_json()["error"].startswith("file: "), (bad, r.data)
  r = client.post("/page/open", data=json.dumps({"saved": "\ud800"}))
  assert r.status_code == 404 and r.get_json()["error"].startswith("saved: "), r.data
  r = client.post("/page/segment", json={"id": "gone", "positive": [[1, 1]]})
  assert r.status_code == 404 and "id" in r.get_json()["error"]


def _innermost(truth):
  """The protocol's first click, computed independently: the object pixel
  farthest from its boundary (image border included), row-major first."""
  d = ndimage.distance_transform_edt(np.pad(truth == 1, 1))[1:-1, 1:-1]
  y, x = np.unravel_index(np.argmax(d), d.shape)
  return [int(x), int(y)]


def test_the_page_segments_and_plays_the_noc_protocol(client, direct, prep_dir):
  images, labels, names = eval_objects(PrepOutput(prep_dir), 1)
  opened = client.post("/page/open", json={"eval": 0}).get_json()
  assert opened["truth"] and opened["name"] == names[0]
  first = client.post("/page/next_click", json={"id": opened["id"]}).get_json()
  assert first == {"click": _innermost(labels[0]), "kind": "positive"}
  r = client.post(
    "/page/segment", json={"id": opened["id"], "positive": [first["click"]], "negative": []}
  )
  assert r.status_code == 200, r.get_json()
  out = r.get_json()
  mask = np.asarray(Image.open(io.BytesIO(base64.b64decode(out["mask"].split(",")[1])))) > 0
  # The protocol's mask (beam-train evaluate's): probability above RITM's 0.49.
  want = _direct_call(direct, images[0], [first["click"]], [])["probabilities"] > 0.49
  np.testing.assert_array_equal(mask, want)
  assert out["pixels"] == int(want.sum())
  care, obj = labels[0] != keys.IGNORE, labels[0] == 1
  union = ((want | obj) & care).sum()
  assert out["iou"] == pytest.approx(((want & obj & care).sum() / union) if union else 0.0)
  second = client.post(
    "/page/next_click", json={"id": opened["id"], "positive": [first["click"]]}
  ).get_json()
  assert second["click"] != first["click"] or second["kind"] is None
  r = client.post("/page/segment", json={"id": opened["id"], "positive": [], "negative": []})
  assert r.status_code == 400 and r.get_json()["error"].startswith("positive: "), r.get_json()
  r = client.post("/page/segment", json={"id": opened["id"], "positive": [[1, "a"]]})
  assert r.status_code == 400 and "positive" in r.get_json()["error"]


def _post(url, body):
  req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
  with urllib.request.urlopen(req, timeout=120) as r:
    return json.loads(r.read())


def test_several_clients_at_once_each_get_their_own_answer(served, direct):
  url = f"{served[0]}/v1/models/{NAME}:predict"
  cases = [(_image(30 + i, 45 - i, seed=i), [[i, 2 * i]], [[40 - i, 5]]) for i in range(8)]
  answers, errors = {}, []

  def ask(i):
    try:
      answers[i] = _post(url, _predict_body(*cases[i]).encode())["outputs"]
    except Exception as e:  # pylint: disable=broad-except
      errors.append(repr(e))

  threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(cases))]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert not errors and len(answers) == len(cases)
  for i, case in enumerate(cases):
    _same_outputs(answers[i], _direct_call(direct, *case))


def test_the_command_line_serves_and_says_where(trained, tmp_path):
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  proc = subprocess.Popen(
    [sys.executable, "-m", "train", "serve", "--model", trained, "--port", "0"],
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
    cwd=str(tmp_path),
    env=env,
  )
  try:
    lines = []
    deadline = time.time() + 120
    while time.time() < deadline:
      line = proc.stdout.readline()
      if not line:
        break
      lines.append(line)
      if "the page at" in line:
        break
    text = "".join(lines)
    assert "serving_default(image uint8 [-1, -1, 3]" in text, text
    url = text.split("the page at ")[1].split("/ ;")[0]
    assert url.startswith("http://127.0.0.1:")
    name = os.path.basename(trained)
    with urllib.request.urlopen(f"{url}/v1/models/{name}", timeout=30) as r:
      assert json.loads(r.read())["model_version_status"][0]["state"] == "AVAILABLE"
    with urllib.request.urlopen(f"{url}/", timeout=30) as r:
      assert b"page.js" in r.read()
  finally:
    proc.terminate()
    proc.wait(timeout=30)


def test_the_page_in_a_browser(served, prep_dir):
  from selenium.webdriver.common.action_chains import ActionChains  # pylint: disable=g-import-not-at-top
  from selenium.webdriver.support.ui import Select, WebDriverWait  # pylint: disable=g-import-not-at-top

  browser = helpers.browser()
  try:
    browser.get(served[0] + "/")
    wait = WebDriverWait(browser, 60, poll_frequency=helpers.POLL_SECONDS)
    wait.until(lambda b: len(b.find_elements("css selector", "#evals option")) > 1)
    Select(browser.find_element("id", "evals")).select_by_index(1)  # eval object 0
    wait.until(lambda b: b.execute_script("return document.getElementById('clicks').width") > 0)
    _, labels, _ = eval_objects(PrepOutput(prep_dir), 1)
    x, y = _innermost(labels[0])
    canvas = browser.find_element("id", "clicks")
    h, w = labels[0].shape
    box = canvas.rect  # CSS pixels: the canvas is scaled to fit the window
    assert box["width"] > w  # a 64 px record is enlarged to be clickable
    ActionChains(browser).move_to_element_with_offset(
      canvas,
      (x + 0.5) * box["width"] / w - box["width"] / 2,
      (y + 0.5) * box["height"] / h - box["height"] / 2,
    ).click().perform()
    wait.until(lambda b: "IoU" in b.find_element("id", "iou").text)
    tinted = browser.execute_script(
      "const c = document.getElementById('mask');"
      "const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
      "let n = 0; for (let i = 3; i < d.length; i += 4) n += d[i] > 0; return n;"
    )
    status = browser.find_element("id", "status").text
    assert tinted > 0 and status.startswith(f"{tinted} pixels in the mask"), (tinted, status)
    iou = float(browser.find_element("id", "iou").text.split()[1])
    assert 0 <= iou <= 1
    browser.find_element("id", "simulate").click()
    wait.until(lambda b: not b.find_element("id", "simulate").get_attribute("disabled"))
    assert "click" in browser.find_element("id", "iou").text
  finally:
    browser.quit()
