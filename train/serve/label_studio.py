"""Label Studio's ML backend protocol, answered by `beam-train serve` at its
root URL, so that Label Studio's backend URL is the server's own:

  GET  /health    {"status": "UP", "model_class", "model_version"}
  POST /setup     {"project": "ID.CREATED", "schema": label config,
                   "hostname", "access_token"} -> {"model_version"}
  POST /predict   {"tasks": [...], "project", "label_config",
                   "params": {"context": {"result": [regions]} or null}}
                  -> {"results": [{"result": [a brush region], "score",
                                   "model_version"}], "model_version"}
  POST /webhook   {"action", "annotation" or "annotations", "task", "project"}

An interactive call's context holds the object's smart regions, in
percent of the image: keypoints (positive; negative with `is_positive:
false`) and rectangles. They become the model's clicks (a rectangle alone:
a click at its centre) and the mask is cut to the rectangle. The answer is
one `brushlabels` region (`beam_prep.brush`) for the config's BrushLabels
tag, labelled as the keypoint when the brush has that label. Each keypoint
after the first refines the mask of the keypoints before it, as on the
page, when that mask was answered here recently. Without a context (a batch
call, a task opened) the answer is `{"results": []}`: nothing is predicted
for a task nobody clicked.

Images are fetched from Label Studio (--label-studio-url, else /setup's
hostname) with --label-studio-token, else /setup's access token: a legacy
token as `Authorization: Token`, a personal access token (a JWT) exchanged
at /api/token/refresh/ for a `Bearer` access token. They are kept in the
page's image cache.

Webhooks keep annotations in the label store (`train.serve.store`):
ANNOTATION_CREATED / UPDATED / ANNOTATIONS_CREATED save the annotation's
brush regions as the task image's objects, with the project, task,
annotation and annotator as the image's origin; ANNOTATIONS_DELETED
removes what those annotations saved. Other actions are answered and
ignored. Every refusal is a JSON 4xx naming the field.
"""

import collections
import dataclasses
import http.client
import json
import math
import time
import threading
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Dict, List, Optional, Tuple
from xml.etree import ElementTree

import numpy as np

from beam_prep import brush
from beam_prep.layouts.label_studio import rectangle_corners
from train.serve.page import DEFAULT_LEVEL, LEVELS, Page
from train.serve.rest import RequestError

TOOL = "label-studio"
SAVE_ACTIONS = ("ANNOTATION_CREATED", "ANNOTATION_UPDATED", "ANNOTATIONS_CREATED")
# Label Studio 1.23 sends ANNOTATIONS_DELETED with a list; ANNOTATION_DELETED,
# with one "annotation", is taken too.
DELETE_ACTIONS = ("ANNOTATIONS_DELETED", "ANNOTATION_DELETED")
FETCH_TIMEOUT_S = 30  # A whole fetch of an image, however slowly its host sends it.
READ_TIMEOUT_S = 10  # A host silent this long is given up.
FETCH_CHUNK = 1 << 16
MAX_PERCENT = 1e6  # Larger coordinates (percents of the image) are refused.
# Masks answered lately, by image and clicks, so that the next keypoint refines them.
RECENT_MASKS = 64
MAX_URLS = 100_000
# Personal access tokens are exchanged here for access tokens of 5 minutes;
# one is used for this long.
TOKEN_REFRESH = "/api/token/refresh/"
ACCESS_TOKEN_S = 240


@dataclasses.dataclass(frozen=True)
class LabelConfig:
  """What a project's label config tells the backend."""

  image_key: str  # The task data field of the image ($image -> "image").
  to_name: str  # The Image tag's name.
  brush: str  # The BrushLabels tag's name.
  labels: Tuple[str, ...]  # Its label values.

  def label_for(self, asked: List[str]) -> str:
    """The brush label of a region labelled `asked`, else the first."""
    return next((a for a in asked if a in self.labels), self.labels[0] if self.labels else "")


def parse_config(xml: Any, field: str) -> LabelConfig:
  """The Image and BrushLabels tags of a label config, or a RequestError naming `field`."""
  if not isinstance(xml, str) or not xml.strip():
    raise RequestError(f"{field}: expected the project's label config (XML)")
  try:
    root = ElementTree.fromstring(xml)
  except ElementTree.ParseError as e:
    raise RequestError(f"{field}: not XML ({e})") from None
  brushes = [t for t in root.iter() if t.tag == "BrushLabels"]
  if not brushes:
    raise RequestError(
      f"{field}: the label config has no BrushLabels tag; the model answers masks as brush regions"
    )
  tag = brushes[0]
  to_name = tag.get("toName", "")
  image = next((t for t in root.iter() if t.tag == "Image" and t.get("name") == to_name), None)
  if image is None or not image.get("value", "").startswith("$"):
    raise RequestError(
      f"{field}: the BrushLabels tag's toName {to_name!r} names no Image tag with value '$field'"
    )
  labels = tuple(t.get("value", "") for t in tag if t.tag == "Label")
  return LabelConfig(image.get("value")[1:], to_name, tag.get("name", ""), labels)


def _number(value: Any, field: str) -> float:
  """A percent of the image; far outside 0..100 is refused (inside, clamped later)."""
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
    raise RequestError(f"{field}: expected a number (percent of the image), got {value!r}")
  if abs(value) > MAX_PERCENT:
    raise RequestError(f"{field}: {value!r} is no percent of the image")
  return float(value)


@dataclasses.dataclass
class Prompts:
  """An interactive context's clicks and box, in the image's pixels."""

  clicks: List[Tuple[bool, int, int]] = dataclasses.field(default_factory=list)  # (positive, x, y)
  box: Optional[Tuple[int, int, int, int]] = None  # x0, y0, x1, y1 (inclusive)
  labels: List[str] = dataclasses.field(default_factory=list)

  def arrays(self) -> Tuple[np.ndarray, np.ndarray]:
    """(positive, negative) int32 [N, 2]."""
    return tuple(
      np.asarray([(x, y) for p, x, y in self.clicks if p == kind], np.int32).reshape(-1, 2)
      for kind in (True, False)
    )


def _rectangle_box(x, y, w, h, angle: float, width: int, height: int):
  """A rectangle's box in pixels (x0, y0, x1, y1): the box of its corners
  (`rectangle_corners`), clamped into the image."""
  value = {"x": x, "y": y, "width": w, "height": h, "rotation": angle}
  xs, ys = zip(*rectangle_corners(value, width, height), strict=True)
  return (
    _in_image(min(xs), width),
    _in_image(min(ys), height),
    _in_image(max(xs), width),
    _in_image(max(ys), height),
  )


def _pixel(percent: float, size: int) -> int:
  return _in_image(percent / 100.0 * size, size)


def _in_image(at: float, size: int) -> int:
  """The pixel under coordinate `at` of an axis of `size` pixels, clamped into it."""
  return min(max(int(math.floor(at)), 0), size - 1)


def parse_context(context: Any, width: int, height: int) -> Prompts:
  """The keypoints and rectangle of an interactive context (other regions
  are ignored); percents outside 0..100 are clamped into the image."""
  regions = context.get("result") if isinstance(context, dict) else None
  if not isinstance(regions, list):
    raise RequestError("params.context.result: expected the list of the object's regions")
  prompts = Prompts()
  for i, region in enumerate(regions):
    where = f"params.context.result[{i}]"
    kind = region.get("type") if isinstance(region, dict) else None
    if kind not in ("keypointlabels", "rectanglelabels"):
      continue
    value = region.get("value")
    if not isinstance(value, dict):
      raise RequestError(f"{where}.value: expected an object with x and y")
    x, y = (_number(value.get(k), f"{where}.value.{k}") for k in ("x", "y"))
    names = value.get(kind)
    prompts.labels += [n for n in names if isinstance(n, str)] if isinstance(names, list) else []
    if kind == "keypointlabels":
      prompts.clicks.append(
        (region.get("is_positive") is not False, _pixel(x, width), _pixel(y, height))
      )
      continue
    w, h = (_number(value.get(k), f"{where}.value.{k}") for k in ("width", "height"))
    angle = _number(value.get("rotation") or 0, f"{where}.value.rotation")
    prompts.box = _rectangle_box(x, y, w, h, angle, width, height)
  if prompts.box is None and not any(positive for positive, _, _ in prompts.clicks):
    raise RequestError(
      f"params.context.result: no positive keypoint and no rectangle among {len(regions)} "
      "regions: place a positive keypoint first (Alt+click places negative ones)"
    )
  return prompts


def _fetch(url: str, authorization: str, max_bytes: int, field: str) -> bytes:
  """The bytes at `url` (sending `authorization` when given), all sent within
  FETCH_TIMEOUT_S, or a RequestError naming `field`."""
  headers = {"Authorization": authorization} if authorization else {}
  deadline = time.monotonic() + FETCH_TIMEOUT_S
  try:
    with urllib.request.urlopen(
      urllib.request.Request(url, headers=headers), timeout=READ_TIMEOUT_S
    ) as r:
      data = _read_by(r, deadline, max_bytes + 1)
  except urllib.error.HTTPError as e:
    raise RequestError(f"{field}: {url} answered {e.code} {e.reason}") from None
  except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as e:
    raise RequestError(f"{field}: {url} cannot be fetched ({e})") from None
  if len(data) > max_bytes:
    raise RequestError(f"{field}: {url} is over {max_bytes // 2**20} MB (--max-request-mb)")
  return data


def _quoted(url: str) -> str:
  """`url` as a browser sends it: spaces and other unsafe characters
  percent-encoded, what is encoded already left as it is."""
  return urllib.parse.quote(url, safe="/:?#[]@!$&'()*+,;=%~")


def _read_by(response, deadline: float, limit: int) -> bytes:
  """Up to `limit` bytes of `response`; a TimeoutError past `deadline`
  (time.monotonic), however slowly the bytes come."""
  chunks, size = [], 0
  while size < limit:
    if time.monotonic() > deadline:
      raise TimeoutError(f"not all sent within {FETCH_TIMEOUT_S} s")
    chunk = response.read1(min(FETCH_CHUNK, limit - size))
    if not chunk:
      break
    chunks.append(chunk)
    size += len(chunk)
  return b"".join(chunks)


def _is_personal_token(token: str) -> bool:
  """A personal access token (a JWT: three dot-separated parts), not a legacy one."""
  parts = token.split(".")
  return len(parts) == 3 and all(parts)


def _access_token(base_url: str, refresh: str) -> str:
  """A personal access token exchanged for a short-lived access token, or a RequestError."""
  req = urllib.request.Request(
    base_url + TOKEN_REFRESH,
    data=json.dumps({"refresh": refresh}).encode(),
    headers={"Content-Type": "application/json"},
  )
  try:
    with urllib.request.urlopen(req, timeout=FETCH_TIMEOUT_S) as r:
      access = json.loads(r.read()).get("access")
  except urllib.error.HTTPError as e:
    raise RequestError(
      f"Label Studio refused its personal access token at {TOKEN_REFRESH} ({e.code} {e.reason})"
    ) from None
  except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as e:
    raise RequestError(f"Label Studio's {TOKEN_REFRESH} cannot be reached ({e})") from None
  if not isinstance(access, str):
    raise RequestError(f"Label Studio's {TOKEN_REFRESH} answered no access token")
  return access


@dataclasses.dataclass
class Connection:
  """Where a project's Label Studio is, and its token."""

  url: str = ""
  token: str = ""

  def __repr__(self) -> str:  # Never the token.
    return f"Connection(url={self.url!r})"


class LabelStudio:
  """The protocol's operations on the page's model, images and label store."""

  def __init__(
    self,
    page: Page,
    url: str = "",
    token: str = "",
    max_bytes: int = 64 * 2**20,
    on_saved: Optional[Callable[[], None]] = None,
  ):
    self.page, self.max_bytes, self.on_saved = page, max_bytes, on_saved
    self._given = Connection(url.rstrip("/"), token)
    self._projects: Dict[str, Connection] = {}
    self._configs: Dict[str, LabelConfig] = {}
    self._images: Dict[str, str] = {}  # URL -> the page's image id.
    self._masks: "collections.OrderedDict[tuple, np.ndarray]" = collections.OrderedDict()
    self._access: Dict[str, Tuple[str, float]] = {}  # Personal token -> (access, until).
    self._lock = threading.Lock()

  @property
  def model_version(self) -> str:
    return self._version_name(self.page.model.version)

  def _version_name(self, version: int) -> str:
    """Label Studio's model_version of a served version: NAME/VERSION."""
    return f"{self.page.model.name}/{version}"

  def health(self) -> Dict[str, Any]:
    return {"status": "UP", "model_class": "beam-train serve", "model_version": self.model_version}

  def setup(self, body: Dict[str, Any]) -> Dict[str, Any]:
    project = _project_id(body.get("project"), "project")
    config = parse_config(body.get("schema"), "schema")
    host, token = body.get("hostname"), body.get("access_token")
    with self._lock:
      self._configs[project] = config
      self._projects[project] = Connection(
        host.rstrip("/") if isinstance(host, str) else "", token if isinstance(token, str) else ""
      )
    return {"model_version": self.model_version}

  def _connection(self, project: str) -> Connection:
    seen = self._projects.get(project, Connection())
    return Connection(self._given.url or seen.url, self._given.token or seen.token)

  def _config(self, project: str, body: Dict[str, Any]) -> LabelConfig:
    if body.get("label_config") is not None:
      return parse_config(body["label_config"], "label_config")
    config = self._configs.get(project)
    if config is None:
      raise RequestError(
        f"label_config: none sent and none known for project {project or '(none named)'} "
        "(Label Studio sends it with /setup when the backend is connected)"
      )
    return config

  def _url(self, project: str, ref: str, field: str) -> Tuple[str, Connection]:
    """(URL, the connection whose token it takes) of a task's image reference:
    the token goes to Label Studio only."""
    conn = self._connection(project)
    try:
      parsed = urllib.parse.urlparse(ref)
    except ValueError as e:
      raise RequestError(f"{field}: {ref[:200]!r} is not a URL ({e})") from None
    if parsed.scheme in ("http", "https"):
      ours = bool(conn.url) and urllib.parse.urlparse(conn.url).netloc == parsed.netloc
      return _quoted(ref), conn if ours else Connection()
    if parsed.scheme or not ref.startswith("/"):
      raise RequestError(
        f"{field}: {ref[:200]!r} is neither an http(s) URL nor a Label Studio path (/data/...)"
      )
    if not conn.url:
      raise RequestError(
        f"{field}: a Label Studio path, but Label Studio's address is unknown for project "
        f"{project or '?'}: start serve with --label-studio-url (and --label-studio-token), "
        "or connect the backend again (Label Studio sends it with /setup)"
      )
    return _quoted(conn.url + ref), conn

  def _authorization(self, conn: Connection) -> str:
    """The Authorization header for Label Studio: `Token` of a legacy token,
    `Bearer` of an access token for a personal one (exchanged, then reused)."""
    if not conn.token or not _is_personal_token(conn.token):
      return f"Token {conn.token}" if conn.token else ""
    with self._lock:
      access, until = self._access.get(conn.token, ("", 0.0))
    if time.time() >= until:
      access = _access_token(conn.url, conn.token)
      with self._lock:
        self._access[conn.token] = (access, time.time() + ACCESS_TOKEN_S)
    return f"Bearer {access}"

  def _image(self, project: str, task: Any, config: LabelConfig, where: str) -> Dict[str, Any]:
    """The task's image as the page holds it: fetched once, then from its cache."""
    task_data = task.get("data") if isinstance(task, dict) else None
    field = f"{where}.data.{config.image_key}"
    ref = task_data.get(config.image_key) if isinstance(task_data, dict) else None
    if not isinstance(ref, str) or not ref:
      raise RequestError(f"{field}: expected the image's URL")
    url, conn = self._url(project, ref, field)
    with self._lock:
      key = self._images.get(url)
    if key is not None:
      try:
        return self.page.store.get(key)
      except RequestError:
        pass  # Pushed out of the cache: fetched again.
    file_bytes = _fetch(url, self._authorization(conn), self.max_bytes, field)
    name = urllib.parse.unquote(urllib.parse.urlparse(url).path.rsplit("/", 1)[-1]) or "task"
    key = self.page.add_file(file_bytes, name, field)
    with self._lock:
      if len(self._images) >= MAX_URLS:
        self._images.clear()  # Mostly ids of images long gone from the cache.
      self._images[url] = key
    return self.page.store.get(key)

  def predict(self, body: Dict[str, Any]) -> Dict[str, Any]:
    tasks = body.get("tasks")
    if not isinstance(tasks, list) or not tasks or not all(isinstance(t, dict) for t in tasks):
      raise RequestError("tasks: expected a list of tasks")
    params = body.get("params") or {}
    if not isinstance(params, dict):
      raise RequestError("params: expected an object")
    if not params.get("context"):
      return {"results": [], "model_version": self.model_version}
    project = _project_id(body.get("project"), "project")
    config = self._config(project, body)
    item = self._image(project, tasks[0], config, "tasks[0]")
    h, w = item["image"].shape[:2]
    prompts = parse_context(params["context"], w, h)
    mask, score, version = self._mask(item, prompts)
    label = config.label_for(prompts.labels)
    region = {
      "from_name": config.brush,
      "to_name": config.to_name,
      "type": "brushlabels",
      "original_width": w,
      "original_height": h,
      "image_rotation": 0,
      "value": {
        "format": "rle",
        "rle": brush.encode(mask),
        "brushlabels": [label] if label else [],
      },
      "score": score,
    }
    version = self._version_name(version)
    return {
      "results": [{"result": [region], "score": score, "model_version": version}],
      "model_version": version,
    }

  def _mask(self, item: Dict[str, Any], prompts: Prompts):
    """(mask, score, version): the model's mask for the prompts, refining the
    mask of the same clicks but the last when it was answered lately."""
    pos, neg = prompts.arrays()
    limit = self.page.model.max_clicks
    if limit and len(pos) + len(neg) > limit:
      raise RequestError(
        f"params.context.result: {len(pos) + len(neg)} clicks, over --max-clicks {limit}"
      )
    key = (item["digest"], prompts.box, tuple(prompts.clicks))
    with self._lock:
      previous = self._masks.get(key[:2] + (key[2][:-1],)) if key[2] else None
    levels, version = self.page.predict_levels(item, pos, neg, previous, prompts.box)
    mask = levels >= DEFAULT_LEVEL
    with self._lock:
      self._masks[key] = mask
      while len(self._masks) > RECENT_MASKS:
        self._masks.popitem(last=False)
    score = float(levels[mask].mean()) / LEVELS if mask.any() else 0.0
    return mask, round(score, 4), version

  def webhook(self, body: Dict[str, Any]) -> Dict[str, Any]:
    """Keeps or removes the labels of an annotation event; other events are ignored."""
    action = body.get("action")
    if action in DELETE_ACTIONS:
      ids = _annotation_ids(
        body["annotations"] if "annotations" in body else [body.get("annotation")]
      )
      removed = [n for i in ids for n in self.page.labels.remove_origin(tool=TOOL, annotation=i)]
      return {"action": action, "removed": removed}
    if action not in SAVE_ACTIONS:
      return {"action": action, "ignored": True}
    project_body = body.get("project") if isinstance(body.get("project"), dict) else {}
    project = _project_id(project_body.get("id"), "project.id")
    config = self._config(project, project_body)
    saved = [
      self._keep(project, config, annotation, task, where)
      for annotation, task, where in _annotations(body)
    ]
    if self.on_saved is not None and any(saved) and self.page.labels.dir:
      self.on_saved()
    return {"action": action, "saved": saved}

  def _keep(self, project: str, config: LabelConfig, annotation, task, where: str) -> Optional[str]:
    """Saves an annotation's brush regions as its image's objects (none
    removes the image's labels); returns the image's file name or None."""
    if annotation.get("was_cancelled"):
      return None
    item = self._image(project, task, config, f"{where}.task")
    h, w = item["image"].shape[:2]
    results = annotation.get("result")
    if not isinstance(results, list):
      raise RequestError(f"{where}.result: expected the annotation's regions")
    objects = []
    for i, r in enumerate(results):
      mask = _brush_mask(r, h, w, f"{where}.result[{i}]")
      if mask is not None and mask.any():
        objects.append({"mask": mask, "clicks": {"positive": [], "negative": []}, "version": None})
    origin = {
      "tool": TOOL,
      "project": project,
      "task": task.get("id"),
      "annotation": annotation.get("id"),
      "annotator": annotation.get("completed_by"),
    }
    try:
      return self.page.labels.save(item, objects, None, origin)["file_name"]
    except ValueError as e:
      raise RequestError(f"{where}: {e}") from None


def _brush_mask(region: Any, height: int, width: int, where: str) -> Optional[np.ndarray]:
  """A brush region's mask at the image's size; None for other regions."""
  if not isinstance(region, dict) or region.get("type") != "brushlabels":
    return None
  value = region.get("value")
  if not isinstance(value, dict) or value.get("format") != "rle":
    raise RequestError(f"{where}.value: expected a brush region in RLE ('format': 'rle')")
  size = (region.get("original_height"), region.get("original_width"))
  if size != (height, width):
    raise RequestError(f"{where}: a {size[1]}x{size[0]} mask for the task's {width}x{height} image")
  try:
    return brush.decode(value.get("rle"), height, width)
  except brush.BrushError as e:
    raise RequestError(f"{where}.value.rle: {e}") from None


def _project_id(value: Any, field: str) -> str:
  """A project's id: "7" of 7 or of "7.1700000000" (/setup's and /predict's form)."""
  if value is None:
    return ""
  if isinstance(value, bool) or not isinstance(value, (int, str)):
    raise RequestError(f"{field}: expected the project's id, got {value!r}")
  return str(value).split(".", 1)[0]


def _annotation_ids(value: Any) -> List[int]:
  if not isinstance(value, list) or not all(
    isinstance(a, dict) and isinstance(_id(a.get("id")), int) for a in value
  ):
    raise RequestError("annotations: expected a list of {'id': annotation id}")
  return [a["id"] for a in value]


def _id(value: Any) -> Any:
  """A task's or annotation's id as an event names it (a number or a string;
  None otherwise, a bool included)."""
  return value if isinstance(value, (int, str)) and not isinstance(value, bool) else None


def _annotations(body: Dict[str, Any]):
  """(annotation, task, where) of an event: one annotation and its task, or
  lists of both (ANNOTATIONS_CREATED), paired by the annotation's task id."""
  annotations, tasks = body.get("annotation"), body.get("task")
  many = isinstance(annotations, list)
  annotations = annotations if many else [annotations]
  tasks = tasks if isinstance(tasks, list) else [tasks]
  by_id = {_id(t.get("id")): t for t in tasks if isinstance(t, dict)}
  for i, a in enumerate(annotations):
    where = f"annotation[{i}]" if many else "annotation"
    if not isinstance(a, dict):
      raise RequestError(f"{where}: expected an annotation object")
    ref = a.get("task")
    task = ref if isinstance(ref, dict) else by_id.get(_id(ref), None if many else tasks[0])
    if not isinstance(task, dict):
      raise RequestError(f"{where}.task: the annotation's task is not in the event")
    yield a, task, where
