"""CVAT's interactor function for a model served by `beam-train serve`.

CVAT (its AI tools, "Interactors") sends each click of a user to a nuclio
function; this one forwards the frame and the clicks to a running
`beam-train serve` (TF Serving's REST API, signature `serve_encoded`, or
`serve_box_encoded` with a box: the frame as its file, decoded and
preprocessed in the served graph exactly as the records were made) and
answers what CVAT draws:

  request   {"image": base64 frame, "pos_points": [[x, y], ...],
             "neg_points": [[x, y], ...], "obj_bbox": [[x0, y0], [x1, y1]] or
             null, "threshold": 0.5}
            ("threshold" optional; a box may stand for the positive points:
            the model then crops the box with its context and clicks its
            centre, and the mask is cut to the box)
  answer    {"mask": [[0/1, ...], ...] (the frame's height x width),
             "points": [[x, y], ...] (the outline of the mask's largest part)}

The mask is the served model's own (probability > 0.49, the NoC protocol's
threshold) unless the request gives a threshold; then it is probability >
threshold, read from the served 8-bit probabilities (within 1/255 of it). A bad request is
answered 400 with {"error": ...} naming the field; a server that cannot be
reached or refuses the request, 502 with its reason.

Environment: BEAM_TRAIN_MODEL (required: the served model's name, which
`beam-train serve` prints in "REST at URL/v1/models/NAME"),
BEAM_TRAIN_SERVE_URL (default http://127.0.0.1:8501), BEAM_TRAIN_AUTH_TOKEN
(the server's bearer token: `beam-train serve --host 0.0.0.0` needs one),
BEAM_TRAIN_TIMEOUT (seconds, default 30).
Only the standard library, numpy, pillow and scipy are needed: the function
does not run TensorFlow.
"""

import base64
import http.client
import io
import json
import math
import os
import urllib.error
import urllib.request

import numpy as np
from PIL import Image
from scipy import ndimage

# Moore neighbourhood, clockwise in image coordinates (row down): W, NW, N, NE, E, SE, S, SW.
_AROUND = ((0, -1), (-1, -1), (-1, 0), (-1, 1), (0, 1), (1, 1), (1, 0), (1, -1))


class BadRequest(ValueError):
  """The request is not CVAT's interactor request; the message names the field."""


def init_context(context):
  url = os.environ.get("BEAM_TRAIN_SERVE_URL", "http://127.0.0.1:8501").rstrip("/")
  context.user_data.url = url
  context.user_data.model = os.environ.get("BEAM_TRAIN_MODEL", "")
  if not context.user_data.model:
    raise RuntimeError(
      "BEAM_TRAIN_MODEL is not set: give the name beam-train serve prints in "
      "'REST at URL/v1/models/NAME'"
    )
  context.user_data.timeout = float(os.environ.get("BEAM_TRAIN_TIMEOUT", "30"))
  token = os.environ.get("BEAM_TRAIN_AUTH_TOKEN", "")
  context.user_data.headers = {"Content-Type": "application/json"}
  if token:
    context.user_data.headers["Authorization"] = f"Bearer {token}"
  context.logger.info(f"beam-train interactor: model {context.user_data.model!r} at {url}")


def handler(context, event):
  try:
    request = _request(event.body)
  except BadRequest as e:
    return _answer(context, 400, {"error": str(e)})
  try:
    mask, grey = _served(context.user_data, request)
  except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as e:
    return _answer(context, 502, {"error": f"beam-train serve at {context.user_data.url}: {e}"})
  except (KeyError, IndexError, TypeError) as e:  # An answer without the predictions asked for.
    message = f"beam-train serve at {context.user_data.url}: an unexpected answer ({e!r})"
    return _answer(context, 502, {"error": message})
  if request["threshold"] is not None:
    mask = grey > round(255 * request["threshold"])
  return _answer(context, 200, {"mask": mask.astype(np.uint8).tolist(), "points": outline(mask)})


def _answer(context, status: int, body):
  return context.Response(
    body=json.dumps(body), headers={}, content_type="application/json", status_code=status
  )


def _request(body):
  """CVAT's request body (a dict, or its JSON text) -> checked fields."""
  if isinstance(body, (bytes, str)):
    try:
      body = json.loads(body)
    except ValueError as e:
      raise BadRequest(f"the body is not JSON: {e}") from None
  if not isinstance(body, dict):
    raise BadRequest("the body must be a JSON object")
  image = body.get("image")
  if not isinstance(image, str) or not image:
    raise BadRequest("image: expected the frame as a base64 string")
  try:
    data = base64.b64decode(image, validate=True)
  except ValueError:
    raise BadRequest("image: not base64") from None
  pos, neg = _points(body, "pos_points"), _points(body, "neg_points")
  box = _box(body.get("obj_bbox"))
  if not pos and box is None:
    raise BadRequest("pos_points: at least one positive point is needed, or obj_bbox")
  threshold = body.get("threshold")
  if threshold is not None and not (isinstance(threshold, (int, float)) and 0 < threshold < 1):
    raise BadRequest(f"threshold: expected a number between 0 and 1, got {threshold!r}")
  return {"image": data, "pos_points": pos, "neg_points": neg, "box": box, "threshold": threshold}


def _box(value):
  """CVAT's obj_bbox, [[x0, y0], [x1, y1]] (or flat [x0, y0, x1, y1]; corners
  in any order), as [x0, y0, x1, y1] with x0 <= x1 and y0 <= y1; None when absent."""
  if value is None or value == []:
    return None
  flat = [v for corner in value for v in corner] if _pairs(value) else value
  if not isinstance(flat, list) or len(flat) != 4 or not all(_coordinate(v) for v in flat):
    raise BadRequest("obj_bbox: expected [[x0, y0], [x1, y1]] (pixels)")
  x0, y0, x1, y1 = (int(round(v)) for v in flat)
  return [min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1)]


def _coordinate(value) -> bool:
  """Whether `value` is a pixel coordinate: a finite number (no bool) within int32."""
  number = isinstance(value, (int, float)) and not isinstance(value, bool)
  return number and math.isfinite(value) and abs(value) < 2**31


def _pairs(value) -> bool:
  return isinstance(value, list) and all(
    isinstance(c, (list, tuple)) and len(c) == 2 for c in value
  )


def _points(body, field: str):
  points = body.get(field) or []
  ok = isinstance(points, list) and all(
    isinstance(p, (list, tuple)) and len(p) == 2 and all(_coordinate(v) for v in p) for p in points
  )
  if not ok:
    raise BadRequest(f"{field}: expected [[x, y], ...] (pixels)")
  return [[int(round(x)), int(round(y))] for x, y in points]


def _served(server, request):
  """The served mask (bool [H, W]) of the request's frame and clicks, and its
  probabilities as grey levels round(p * 255) (uint8 [H, W])."""
  instance = {
    "image_bytes": {"b64": base64.b64encode(request["image"]).decode("ascii")},
    "positive_clicks": request["pos_points"],
    "negative_clicks": request["neg_points"],
  }
  signature = "serve_encoded"
  if request["box"] is not None:
    instance["box"] = request["box"]
    signature = "serve_box_encoded"
  body = json.dumps({"signature_name": signature, "instances": [instance]}).encode()
  req = urllib.request.Request(
    f"{server.url}/v1/models/{server.model}:predict",
    data=body,
    headers=server.headers,
  )
  try:
    with urllib.request.urlopen(req, timeout=server.timeout) as r:
      answer = json.loads(r.read())
  except urllib.error.HTTPError as e:
    raise ValueError(f"HTTP {e.code}: {e.read().decode('utf-8', 'replace')[:500]}") from None
  mask, grey = (
    np.asarray(Image.open(io.BytesIO(base64.b64decode(answer["predictions"][0][k]["b64"]))))
    for k in ("mask_bytes", "probabilities_bytes")
  )
  return mask > 0, grey


def outline(mask: np.ndarray):
  """The outer boundary of the mask's largest connected part (8-connected),
  as [[x, y], ...] pixel positions clockwise, without points inside
  straight runs; [] for an empty mask."""
  parts, count = ndimage.label(mask, structure=np.ones((3, 3)))
  if not count:
    return []
  largest = 1 + int(np.argmax(ndimage.sum_labels(mask, parts, range(1, count + 1))))
  inside = np.pad(parts == largest, 1)
  path = _trace(inside)
  return [[int(x) - 1, int(y) - 1] for y, x in _corners(path)]


def _trace(inside: np.ndarray):
  """Moore-neighbour tracing of the one part of `inside` (padded: no pixel
  on the border), from its first pixel in raster order -> [(row, col), ...]."""
  start = tuple(int(v) for v in np.argwhere(inside)[0])
  path, pixel, came = [start], start, 0  # Entered from the west: the pixel before is outside.
  first_step = None
  for _ in range(4 * inside.size):  # A boundary visits each pixel at most 4 times.
    for k in range(1, 9):
      d = (came + k) % 8
      nxt = (pixel[0] + _AROUND[d][0], pixel[1] + _AROUND[d][1])
      if inside[nxt]:
        break
    else:
      return path  # A part of one pixel.
    step = (pixel, nxt)
    if step == first_step:
      return path[:-1]
    first_step = first_step or step
    # The next sweep starts at the neighbour checked just before `nxt`, seen from `nxt`.
    back = (
      pixel[0] + _AROUND[(d - 1) % 8][0] - nxt[0],
      pixel[1] + _AROUND[(d - 1) % 8][1] - nxt[1],
    )
    came = _AROUND.index(back)
    pixel = nxt
    path.append(pixel)
  return path


def _corners(path):
  """`path` without the points inside straight runs."""
  if len(path) < 3:
    return path
  keep = []
  for i, p in enumerate(path):
    a, b = path[i - 1], path[(i + 1) % len(path)]
    if (p[0] - a[0], p[1] - a[1]) != (b[0] - p[0], b[1] - p[1]):
      keep.append(p)
  return keep
