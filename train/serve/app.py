"""`beam-train serve`: the exported model behind TF Serving's REST API, and
the click-and-see page, on Flask, served by waitress on a fixed pool of
threads (`train.serve.server`).

  GET  /v1/models/NAME[/versions/V]            status (TF Serving's JSON)
  GET  /v1/models/NAME[/versions/V]/metadata   the signatures (TF Serving's JSON)
  POST /v1/models/NAME[/versions/V]:predict    `train.serve.rest`
  GET  /                                       the page (static/)
  /page/...                                    the page's own endpoints (`train.serve.page`)
  GET /health, POST /setup /predict /webhook   Label Studio's ML backend
                                               (`train.serve.label_studio`)

Every refused request is answered `{"error": "..."}` with a 4xx status:
400 for a wrong request (the message names the field, or the limit and
its flag: --max-clicks, --max-pixels, the JSON's nesting), 403 for a path
outside --images, 404 for an unknown model, version, route or image id,
413 for a body over --max-request-mb, however it is sent. The limits are
checked before the model runs, and no request is answered 500 but a bug.
Requests are served on --threads threads; the model's concrete functions
are safe to call concurrently.
"""

import contextlib
import json
import logging
import os
import threading
from typing import Iterator, Optional, Tuple

import orjson
from flask import Flask, Response, request, send_from_directory
from werkzeug.exceptions import HTTPException, MethodNotAllowed

from train.serve import auth, rest
from train.serve.config import ServeConfig
from train.serve.exports import COCO_FILE
from train.serve.model import RestModel
from train.serve.versions import Versions
from train.serve.label_studio import LabelStudio
from train.serve.page import ImageStore, Page, Sources
from train.serve.rest import RequestError
from train.serve.server import Server, too_large
from train.serve.rounds import Rounds
from train.serve.store import Labels

LABELS, ROUNDS = "beam_train.labels", "beam_train.rounds"
STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")


def _json(body, status: int = 200) -> Response:
  if isinstance(body, bytes):
    data = body
  else:
    try:
      data = orjson.dumps(body)
    except orjson.JSONEncodeError:  # A string echoed back that is not UTF-8 (a lone surrogate).
      data = json.dumps(body).encode()
  return Response(data, status=status, mimetype="application/json")


def _body() -> dict:
  """The request's JSON object, whatever its Content-Type says (as TF Serving reads bodies)."""
  body = rest.load_json(request.get_data(cache=False), arrays=False)
  if not isinstance(body, dict):
    raise RequestError("the request body must be a JSON object")
  return body


def _json_posts(app: Flask, prefix: str, handlers) -> None:
  """POST PREFIX+NAME for each handler: the body's JSON object in, its answer out as JSON."""
  for name, handle in handlers.items():
    app.add_url_rule(
      prefix + name,
      f"{prefix.strip('/')}_{name}",
      methods=["POST"],
      view_func=lambda handle=handle: _json(handle(_body())),
    )


def _not_a_method(name: str) -> None:
  """A 405 for NAME:predict (or another method) asked with GET: a model name has no ':'."""
  if ":" in name:
    raise MethodNotAllowed(valid_methods=["POST"], description=f"{name[:100]}: POST only")


def _rest_routes(app: Flask, versions: Versions, config: ServeConfig) -> None:
  """TF Serving's URLs."""

  @app.get("/v1/models/<name>")
  @app.get("/v1/models/<name>/versions/<int:version>")
  def status(name, version=None):
    _not_a_method(name)
    return _json(versions.status(name, version))

  @app.get("/v1/models/<name>/metadata")
  @app.get("/v1/models/<name>/versions/<int:version>/metadata")
  def metadata(name, version=None):
    _not_a_method(name)
    return _json(versions.check(name, version).metadata())

  @app.post("/v1/models/<name>:predict")
  @app.post("/v1/models/<name>/versions/<int:version>:predict")
  def predict(name, version=None):
    model = versions.check(name, version)
    signature, inputs, row = rest.parse_predict(
      request.get_data(cache=False), model.signatures, config.max_clicks, config.max_pixels
    )
    return _json(rest.encode_outputs(model.predict(signature, inputs), row))


def _page_routes(app: Flask, page: Page) -> None:
  """The page and its endpoints (`train.serve.page`)."""

  @app.get("/")
  def index():
    return send_from_directory(STATIC, "index.html")

  @app.get("/page/sources")
  def sources():
    return _json(page.describe())

  @app.post("/page/upload")
  def upload():
    f = request.files.get("file")
    if f is None:
      raise RequestError("file: a multipart upload with a 'file' part is expected")
    return _json(page.upload(f.read(), f.filename or ""))

  @app.get("/page/image/<key>.png")
  def image(key):
    return Response(page.image_png(key), mimetype="image/png")

  @app.get("/page/truth/<key>.png")
  def truth(key):
    return Response(page.truth_png(key), mimetype="image/png")

  @app.get("/page/coco")
  def coco():
    return Response(
      page.labels.document_json(),
      mimetype="application/json",
      headers={"Content-Disposition": f"attachment; filename={COCO_FILE}"},
    )

  posts = {
    "open": page.open,
    "segment": page.segment,
    "iou": page.iou,
    "next_click": page.next_click,
    "save": page.save,
  }
  _json_posts(app, "/page/", posts)


def _label_studio_routes(app: Flask, backend: LabelStudio) -> None:
  """Label Studio's ML backend protocol at the root (`train.serve.label_studio`)."""
  app.add_url_rule("/health", "ls_health", view_func=lambda: _json(backend.health()))
  posts = {"setup": backend.setup, "predict": backend.predict, "webhook": backend.webhook}
  _json_posts(app, "/", posts)


def _guard(app: Flask, creds: auth.Credentials) -> None:
  """With credentials, every request must present them (`train.serve.auth`)."""
  if not creds:
    return

  @app.before_request
  def authorized():
    if not creds.allows(request.headers.get("Authorization")):
      refusal = _json(rest.error_body(f"credentials needed: {creds.describe()}"), 401)
      refusal.headers["WWW-Authenticate"] = creds.challenge()
      return refusal
    return None


def make_app(
  config: ServeConfig,
  versions: Versions,
  sources: Sources,
  labels: Optional[Labels] = None,
  rounds: Optional[Rounds] = None,
) -> Flask:
  """The Flask app of one loaded model; its label store (`labels`, else
  opened on --save-dir) is `app.extensions[LABELS]`, and `rounds` (which
  counts its saves) `app.extensions[ROUNDS]`."""
  app = Flask(__name__, static_folder=STATIC, static_url_path="/static")
  app.config["MAX_CONTENT_LENGTH"] = int(config.max_request_mb * 1024 * 1024)
  labels = labels or Labels(config.save_dir)
  app.extensions[LABELS], app.extensions[ROUNDS] = labels, rounds
  page = Page(
    versions,
    sources,
    ImageStore(int(config.cache_mb * 1024 * 1024)),
    config.max_pixels,
    labels,
    on_saved=rounds.saved if rounds else None,
  )
  _guard(app, config.credentials)
  _rest_routes(app, versions, config)
  _page_routes(app, page)
  url, token = config.label_studio_access
  _label_studio_routes(
    app, LabelStudio(page, url, token, app.config["MAX_CONTENT_LENGTH"], page.on_saved)
  )

  @app.errorhandler(RequestError)
  def refused(e: RequestError):
    return _json(rest.error_body(str(e)), e.status)

  @app.errorhandler(HTTPException)
  def http_error(e: HTTPException):
    message = e.description
    if e.code == 413 and (request.content_length or 0) > app.config["MAX_CONTENT_LENGTH"]:
      message = too_large(config.max_request_mb)
    elif e.code == 413:  # Werkzeug's limits of a multipart form (Flask's defaults).
      message = (
        f"the form is over the server's limits: {app.config['MAX_FORM_PARTS']} parts, "
        f"{app.config['MAX_FORM_MEMORY_SIZE'] // 1000} kB of fields besides files"
      )
    answer = _json(rest.error_body(message), e.code or 500)
    if isinstance(e, MethodNotAllowed) and e.valid_methods:
      answer.headers["Allow"] = ", ".join(e.valid_methods)
    return answer

  @app.errorhandler(Exception)
  def failed(e: Exception):  # A bug of ours: said as JSON, logged with its traceback.
    logging.getLogger("beam_train").exception("serve: %s %s failed", request.method, request.path)
    return _json(rest.error_body(f"internal error: {type(e).__name__}: {e}"), 500)

  return app


def describe(model: RestModel) -> str:
  """One line per signature: inputs and outputs with dtypes and shapes."""
  lines = []
  for sig, specs in sorted(model.signatures.items()):
    outs = model.metadata()["metadata"]["signature_def"]["signature_def"][sig]["outputs"]
    ins = ", ".join(f"{k} {s.dtype.name} {_dims(s.shape)}" for k, s in sorted(specs.items()))
    outs = ", ".join(
      f"{k} {v['dtype'][3:].lower()} {[int(d['size']) for d in v['tensor_shape'].get('dim', [])]}"
      for k, v in sorted(outs.items())
    )
    lines.append(f"{sig}({ins}) -> {outs}")
  return "\n".join(lines)


def _dims(shape) -> list:
  return [-1 if d is None else d for d in shape.as_list()] if shape.rank is not None else "?"


def build(config: ServeConfig, log: Optional[logging.Logger] = None):
  """(app, versions, rounds): the model's newest version loaded, the sources
  opened, the engine's rounds (None without --engine-every)."""
  versions = Versions(config.model, config.name, config.max_clicks, log)
  if config.engine_every and not versions.watched:
    raise ValueError(
      f"--engine-every publishes new versions under the model dir: --model "
      f"{config.model} is one export folder; give its model dir"
    )
  rounds = (
    Rounds(config.engine_every, config.save_dir, config.model, config.engine_args, log)
    if config.engine_every
    else None
  )
  sources = Sources(config.images, config.data, config.max_eval_objects)
  return make_app(config, versions, sources, rounds=rounds), versions, rounds


def _stopper(app: Flask, versions: Versions, rounds: Optional[Rounds]):
  def stop():
    if rounds is not None:
      rounds.stop()
    versions.stop()
    app.extensions[LABELS].close()

  return stop


def start(config: ServeConfig, log: Optional[logging.Logger] = None):
  """Builds the app, binds its server (`train.serve.server.Server`) and
  watches for new versions; returns (server, versions). `server.serve_forever()`
  serves; `server.port` is the bound port (0 asks the system for a free
  one); stopping the server stops the watch and closes the label store."""
  if config.images and not os.path.isdir(config.images):
    raise FileNotFoundError(f"--images {config.images}: no such folder")
  app, versions, rounds = build(config, log)
  server = Server(
    app,
    config.host,
    config.port,
    config.threads,
    config.max_request_mb,
    on_stop=_stopper(app, versions, rounds),
  )
  versions.watch(config.poll_seconds)
  if log:
    _say_started(log, config, versions, server.port, app.extensions[LABELS])
  return server, versions


@contextlib.contextmanager
def running(
  config: ServeConfig, log: Optional[logging.Logger] = None
) -> Iterator[Tuple[Server, Versions]]:
  """`start`, serving in a thread of this process until the block ends, then
  shut down (the watch stopped, the label store closed): (server, versions).
  For a program that serves beside its own work: the demo, the benchmarks."""
  server, versions = start(config, log)
  thread = threading.Thread(target=server.serve_forever, daemon=True, name="serve")
  thread.start()
  try:
    yield server, versions
  finally:
    server.shutdown()
    thread.join(30)


def _say_started(
  log: logging.Logger, config: ServeConfig, versions: Versions, port: int, labels: Labels
) -> None:
  model = versions.current
  log.info("serve: model %r version %d from %s", model.name, model.version, model.path)
  for line in describe(model).splitlines():
    log.info("serve:   %s", line)
  if versions.watched and config.poll_seconds > 0:
    log.info(
      "serve: a newer export under %s is served when it appears (checked every %g s)",
      config.model,
      config.poll_seconds,
    )
  host = f"[{config.host}]" if ":" in config.host else config.host
  url = f"http://{host}:{port}"
  log.info(
    "serve: the page at %s/ ; REST at %s/v1/models/%s (TF Serving's API)", url, url, model.name
  )
  creds = config.credentials
  if creds:
    log.info("serve: every request needs %s", creds.describe())
  else:
    log.info("serve: open to this machine only (%s, no credentials asked)", config.host)
  if config.save_dir:
    log.info("serve: labels saved under %s (%d images so far)", config.save_dir, labels.count())
  if config.engine_every:
    log.info(
      "serve: a data engine round runs after every %d labels saved (--engine-every)",
      config.engine_every,
    )
  if config.host not in ("127.0.0.1", "localhost", "::1"):
    log.info("serve: listening on %s: anyone who can reach this machine can use it", config.host)
