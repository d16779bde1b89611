"""Measures click-to-mask latency of the trained model as served.

serve.latency_ms_p50/p95   one 512x512 image, 5+5 clicks, loaded SavedModel
serve.rest_latency_ms_p50/p95  the same through `beam-train serve`'s TF Serving
                           REST endpoint (JSON both ways), and its ratio to the
                           SavedModel's p50 (serve.rest_vs_saved_model)
serve.page_latency_ms_p50/p95  a click through the page's own endpoint
serve.encoded_*            a 512x600 JPEG sent as the encoded file: the
                           SavedModel's `serve_encoded` and the same through
                           REST (b64), timed in turn (serve.encoded_rest_vs_saved_model)
serve.bad_*                requests meant to bring the server down
                           (`benchmarks.bad_requests`): answers of 500, the
                           slowest answer, the server's RSS after / before
"""

import time
from typing import Dict

import numpy as np

from benchmarks.bad_requests import bench_bad_requests
from benchmarks.common import log, serving, timed, url_of


def bench_serve(model_dir: str, repeats: int) -> Dict[str, float]:
  """The SavedModel's latency (`bench_serving`), then REST's and the page's
  (`bench_rest`, `bench_rest_encoded`) against it: one server, whose loaded
  model is the one timed alone; then the bad requests, on a server of their own."""
  with serving(model_dir) as (server, versions):
    out = _served_latencies(versions.current, url_of(server), repeats)
  out.update(bench_bad_requests(model_dir))
  log(
    f"bad requests: {out['serve.bad_5xx']} of {out['serve.bad_requests']} answered 500 or "
    f"not at all, the slowest in {out['serve.bad_max_ms']:.0f} ms, RSS after / before "
    f"{out['serve.bad_rss_after_vs_before']:.3f}"
  )
  return out


def _served_latencies(model, url: str, repeats: int) -> Dict[str, float]:
  out = bench_serving(model, repeats)
  log(
    f"serving: p50 {out['serve.latency_ms_p50']:.1f} ms, p95 {out['serve.latency_ms_p95']:.1f} ms"
  )
  out.update(bench_rest(model, url, repeats, out["serve.latency_ms_p50"]))
  log(
    f"serving over REST: p50 {out['serve.rest_latency_ms_p50']:.1f} ms "
    f"({out['serve.rest_vs_saved_model']:.2f}x the SavedModel's); the page's endpoint "
    f"p50 {out['serve.page_latency_ms_p50']:.1f} ms"
  )
  out.update(bench_rest_encoded(model, url, repeats))
  log(
    f"an encoded JPEG: SavedModel p50 {out['serve.encoded_latency_ms_p50']:.1f} ms, REST "
    f"{out['serve.encoded_rest_latency_ms_p50']:.1f} ms "
    f"({out['serve.encoded_rest_vs_saved_model']:.2f}x)"
  )
  return out


def bench_serving(model, repeats: int) -> Dict[str, float]:
  """Milliseconds from click to mask of the loaded SavedModel's signature
  (`model`: a `ServedModel`), called in this process."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from train.export import signatures as sig  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(0)
  request = model.segment_inputs(
    tf.constant(rng.integers(0, 256, (512, 512, 3), dtype=np.uint8)),
    tf.constant(rng.integers(0, 512, (5, 2)), tf.int32),
    tf.constant(rng.integers(0, 512, (5, 2)), tf.int32),
  )
  for _ in range(3):
    model.call(*request)
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    model.call(*request)[sig.MASK].numpy()
    times.append(1000 * (time.perf_counter() - t))
  return {
    "serve.latency_ms_p50": float(np.percentile(times, 50)),
    "serve.latency_ms_p95": float(np.percentile(times, 95)),
  }


def _page_times(url: str, post, image: np.ndarray, pos, neg, repeats: int):
  """Clicks through the page's endpoint on `image`, uploaded once -> ms each."""
  import urllib.request  # pylint: disable=g-import-not-at-top
  import orjson  # pylint: disable=g-import-not-at-top

  form = urllib.request.Request(
    url + "/page/upload",
    data=_multipart(image),
    headers={"Content-Type": "multipart/form-data; boundary=bench"},
  )
  with urllib.request.urlopen(form) as r:
    key = orjson.loads(r.read())["id"]
  # Two click sets in turn, each a first request (no previous mask): the
  # server keeps no click state, so each runs the model.
  clicks = [
    orjson.dumps({"id": key, "positive": [[x + i, y] for x, y in pos], "negative": neg})
    for i in (0, 1)
  ]
  turn = iter(range(10**9))
  return timed(lambda: post("/page/segment", clicks[next(turn) % 2]), repeats)


def bench_rest(model, url: str, repeats: int, saved_model_p50: float) -> Dict[str, float]:
  """Click to mask through `beam-train serve` at `url` (serving `model`), the
  same 512x512 image and 5+5 clicks as `bench_serving`: TF Serving's JSON
  predict (request text made once; the answer read into numpy arrays, as a
  client must) and the page's endpoint (image sent once, then clicks;
  probabilities and mask as PNG)."""
  import urllib.request  # pylint: disable=g-import-not-at-top
  import orjson  # pylint: disable=g-import-not-at-top
  from train.export import signatures as sig  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(0)
  image = rng.integers(0, 256, (512, 512, 3), dtype=np.uint8)
  pos, neg = rng.integers(0, 512, (5, 2)).tolist(), rng.integers(0, 512, (5, 2)).tolist()

  def post(path, body):
    req = urllib.request.Request(
      url + path, data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req) as r:
      return orjson.loads(r.read())

  body = orjson.dumps(
    {"inputs": {sig.IMAGE: image, sig.POSITIVE_CLICKS: pos, sig.NEGATIVE_CLICKS: neg}},
    option=orjson.OPT_SERIALIZE_NUMPY,
  )
  rest = lambda: {
    k: np.asarray(v)
    for k, v in post(f"/v1/models/{model.name}:predict", body)["outputs"].items()  # pylint: disable=unnecessary-lambda-assignment
  }
  rest_times = timed(rest, repeats)
  page_times = _page_times(url, post, image, pos, neg, repeats)
  p50 = float(np.percentile(rest_times, 50))
  return {
    "serve.rest_latency_ms_p50": p50,
    "serve.rest_latency_ms_p95": float(np.percentile(rest_times, 95)),
    "serve.rest_vs_saved_model": p50 / saved_model_p50,
    "serve.rest_request_mb": len(body) / 1e6,
    "serve.page_latency_ms_p50": float(np.percentile(page_times, 50)),
    "serve.page_latency_ms_p95": float(np.percentile(page_times, 95)),
  }


def _photo_jpeg(height: int = 512, width: int = 600) -> bytes:
  """A photograph-like JPEG: a sample scene (smooth background, clutter,
  objects) at quality 90, as a camera or a browser would send it."""
  import io  # pylint: disable=g-import-not-at-top
  from PIL import Image  # pylint: disable=g-import-not-at-top
  from beam_prep.sample_data import make_scene  # pylint: disable=g-import-not-at-top

  buf = io.BytesIO()
  Image.fromarray(make_scene(0, 0, (width, height))[0]).save(buf, format="JPEG", quality=90)
  return buf.getvalue()


def _encoded_request(jpeg: bytes, pos, neg) -> bytes:
  """TF Serving's predict request of `serve_encoded`: one instance, the file as {"b64": ...}."""
  import base64  # pylint: disable=g-import-not-at-top
  import orjson  # pylint: disable=g-import-not-at-top
  from train.export import signatures as sig  # pylint: disable=g-import-not-at-top

  instance = {
    sig.IMAGE_BYTES: {"b64": base64.b64encode(jpeg).decode()},
    sig.POSITIVE_CLICKS: pos,
    sig.NEGATIVE_CLICKS: neg,
  }
  return orjson.dumps({"signature_name": sig.SERVE_ENCODED, "instances": [instance]})


def bench_rest_encoded(model, url: str, repeats: int) -> Dict[str, float]:
  """Click to mask with the image sent as its file: a 512x600 JPEG and 5+5
  clicks, through `beam-train serve`'s REST `serve_encoded` (TF Serving's
  {"b64": ...}, one instance; the client decodes the answer's PNG mask into a
  numpy array, as a client would, within the REST time) against the same
  loaded SavedModel's `serve_encoded` called on the same bytes (its PNG
  files as bytes) at `url`, serving `model`. Timed in turn (`_in_turn`)."""
  import urllib.request  # pylint: disable=g-import-not-at-top
  import orjson  # pylint: disable=g-import-not-at-top
  from train.export import signatures as sig  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(0)
  jpeg = _photo_jpeg()
  pos, neg = rng.integers(0, 512, (5, 2)).tolist(), rng.integers(0, 512, (5, 2)).tolist()
  body = _encoded_request(jpeg, pos, neg)
  request = urllib.request.Request(
    f"{url}/v1/models/{model.name}:predict",
    data=body,
    headers={"Content-Type": "application/json"},
  )
  answer_bytes = []

  def rest():
    with urllib.request.urlopen(request) as r:
      answer = r.read()
    answer_bytes.append(len(answer))
    return _png_array(orjson.loads(answer)["predictions"][0][sig.MASK_BYTES]["b64"])

  inputs = model.encoded_inputs(jpeg, pos, neg)
  times = _in_turn(
    {"saved": lambda: model.call(*inputs)[sig.MASK_BYTES].numpy(), "rest": rest}, repeats
  )
  saved, rest_p50 = (float(np.percentile(times[k], 50)) for k in ("saved", "rest"))
  return {
    "serve.encoded_latency_ms_p50": saved,
    "serve.encoded_rest_latency_ms_p50": rest_p50,
    "serve.encoded_rest_latency_ms_p95": float(np.percentile(times["rest"], 95)),
    "serve.encoded_rest_vs_saved_model": rest_p50 / saved,
    "serve.encoded_request_kb": len(body) / 1e3,
    "serve.encoded_answer_kb": answer_bytes[-1] / 1e3,
  }


def _png_array(b64: str) -> np.ndarray:
  """A PNG file sent as base64 -> its pixels (uint8), as a client reads them."""
  import base64  # pylint: disable=g-import-not-at-top
  import io  # pylint: disable=g-import-not-at-top
  from PIL import Image  # pylint: disable=g-import-not-at-top

  return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))))


def _in_turn(calls, repeats: int, warmup: int = 3):
  """{name: [ms per call]}: one call of each per round, in turn, so all see
  the machine's load alike; the first `warmup` rounds are not timed."""
  times = {k: [] for k in calls}
  for i in range(repeats + warmup):
    for k, fn in calls.items():
      t = time.perf_counter()
      fn()
      if i >= warmup:
        times[k].append(1000 * (time.perf_counter() - t))
  return times


def _multipart(image: np.ndarray) -> bytes:
  import io  # pylint: disable=g-import-not-at-top
  from PIL import Image  # pylint: disable=g-import-not-at-top

  buf = io.BytesIO()
  Image.fromarray(image).save(buf, format="PNG")
  return (
    b'--bench\r\nContent-Disposition: form-data; name="file"; filename="b.png"\r\n'
    b"Content-Type: image/png\r\n\r\n" + buf.getvalue() + b"\r\n--bench--\r\n"
  )
