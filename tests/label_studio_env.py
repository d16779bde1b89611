"""Label Studio for the test that drives a real one
(`tests/train/test_label_studio_app.py`): installed once per machine in a
virtual environment of its own (its pins are not this project's), with a
data folder migrated once; each test run starts on a copy of that folder (a
first start migrates for about a minute, a copy starts in seconds).

  python tests/label_studio_env.py install    # once; says why when it cannot
  python -m tests.label_studio_env screenshot --model M --image I --click X,Y --out PNG
      # the docs' picture: Label Studio's page with the model's suggested mask

The install lives under $BEAM_PREP_LABEL_STUDIO_HOME, else
~/.cache/beam-prep/label-studio-VERSION, so that a machine (a CI runner
keeping its home) reuses it. A failed install says why in failure.txt there
and is tried again a day later. Standard library only: it runs before the
project's own environment exists.
"""

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from typing import Dict, Optional, Tuple

VERSION = "1.23.2"
HOME = os.environ.get("BEAM_PREP_LABEL_STUDIO_HOME") or os.path.join(
  os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
  "beam-prep",
  f"label-studio-{VERSION}",
)
USER, PASSWORD = "admin@example.com", "adminpass123"
TOKEN = "0123456789abcdef0123456789abcdef01234567"  # A test instance's own API token.
START_TIMEOUT_S = 300
# A failed install is tried again after this long (or once failure.txt is removed).
RETRY_AFTER_S = 24 * 3600


def _venv_bin(home: str) -> str:
  return os.path.join(home, "venv", "bin")


def _template(home: str) -> str:
  return os.path.join(home, "data")


def _ready(home: str) -> str:
  return os.path.join(home, "ready")


def _failure(home: str) -> str:
  return os.path.join(home, "failure.txt")


def environment(data_dir: str) -> Dict[str, str]:
  """Label Studio's settings for a local test instance: a backend on
  127.0.0.1 allowed (both settings are needed), no calls out."""
  env = dict(os.environ)
  env.update(
    LABEL_STUDIO_BASE_DATA_DIR=data_dir,
    ML_BLOCK_LOCAL_IP="false",
    SSRF_PROTECTION_ENABLED="false",
    COLLECT_ANALYTICS="false",
    LATEST_VERSION_CHECK="false",
    SENTRY_DSN="",
    FRONTEND_SENTRY_DSN="",
  )
  return env


def start(data_dir: str, port: int, log_path: str, home: str = HOME) -> subprocess.Popen:
  """Starts Label Studio on 127.0.0.1:`port` with `data_dir`, its output into `log_path`."""
  args = [
    os.path.join(_venv_bin(home), "label-studio"),
    "start",
    "--no-browser",
    "--internal-host",
    "127.0.0.1",
    "--port",
    str(port),
    "--data-dir",
    data_dir,
    "--username",
    USER,
    "--password",
    PASSWORD,
    "--user-token",
    TOKEN,
    "--enable-legacy-api-token",
  ]
  with open(log_path, "ab") as log:
    return subprocess.Popen(
      args, env=environment(data_dir), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def wait_up(url: str, proc: subprocess.Popen, log_path: str, timeout: float = START_TIMEOUT_S):
  """Waits until `url`/health/ answers UP; raises RuntimeError with the log's end otherwise."""
  deadline = time.time() + timeout
  while time.time() < deadline:
    if proc.poll() is not None:
      break
    with contextlib.suppress(OSError):
      with urllib.request.urlopen(url + "/health/", timeout=2) as r:
        if b"UP" in r.read():
          return
    time.sleep(0.5)
  with open(log_path, "rb") as f:
    tail = f.read()[-3000:].decode("utf-8", "replace")
  raise RuntimeError(f"Label Studio at {url} did not come up in {timeout:.0f} s:\n{tail}")


def stop(proc: subprocess.Popen) -> None:
  """Stops Label Studio and whatever it started."""
  with contextlib.suppress(ProcessLookupError):
    os.killpg(proc.pid, 15)
  try:
    proc.wait(20)
  except subprocess.TimeoutExpired:
    with contextlib.suppress(ProcessLookupError):
      os.killpg(proc.pid, 9)
    proc.wait()


def api(url: str, method: str, path: str, body=None, file: Optional[Tuple[str, bytes]] = None):
  """Label Studio's REST API with the test instance's token: a JSON body
  or a multipart `file` (name, bytes) in, JSON (or None) out."""
  headers, data = {"Authorization": f"Token {TOKEN}"}, None
  if file is not None:
    boundary = uuid.uuid4().hex
    data = (
      (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{file[0]}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
      ).encode()
      + file[1]
      + f"\r\n--{boundary}--\r\n".encode()
    )
    headers["Content-Type"] = f"multipart/form-data; boundary={boundary}"
  elif body is not None:
    data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
  req = urllib.request.Request(url + path, data=data, headers=headers, method=method)
  with urllib.request.urlopen(req, timeout=120) as r:
    text = r.read()
  return json.loads(text) if text else None


def free_port() -> int:
  import socket  # pylint: disable=g-import-not-at-top

  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@contextlib.contextmanager
def running(workdir: str, home: str = HOME):
  """Label Studio's URL, running on a copy of the migrated data folder in `workdir`."""
  data = os.path.join(workdir, "label-studio-data")
  shutil.copytree(_template(home), data)
  port, log = free_port(), data + ".log"
  proc = start(data, port, log, home)
  url = f"http://127.0.0.1:{port}"
  try:
    wait_up(url, proc, log, timeout=120)
    yield url
  finally:
    stop(proc)


def unavailable(home: str = HOME) -> Optional[str]:
  """Why Label Studio cannot be used here (None: it is installed and migrated)."""
  if os.path.exists(_ready(home)):
    return None
  if os.path.exists(_failure(home)):
    with open(_failure(home)) as f:
      return (
        f"its install failed (tried again a day later, or remove {_failure(home)}): "
        f"{f.read().strip()[-500:]}"
      )
  return f"not installed under {home}"


def _install(home: str) -> None:
  """The virtual environment, Label Studio in it, and a migrated data folder."""
  shutil.rmtree(os.path.join(home, "venv"), ignore_errors=True)
  shutil.rmtree(_template(home), ignore_errors=True)
  subprocess.run([sys.executable, "-m", "venv", os.path.join(home, "venv")], check=True)
  pip = [os.path.join(_venv_bin(home), "python"), "-m", "pip", "install", "--quiet", "--no-compile"]
  subprocess.run(pip + [f"label-studio=={VERSION}"], check=True)
  log, port = os.path.join(home, "migrate.log"), free_port()
  proc = start(_template(home), port, log, home)
  try:
    wait_up(f"http://127.0.0.1:{port}", proc, log)
  finally:
    stop(proc)


def install(home: str = HOME) -> Optional[str]:
  """Installs Label Studio under `home` unless it is there; returns why it
  cannot be used (None: ready). One install at a time per machine."""
  os.makedirs(home, exist_ok=True)
  with open(os.path.join(home, ".lock"), "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if os.path.exists(_ready(home)):
      return None
    failed = _failure(home)
    if os.path.exists(failed) and time.time() - os.path.getmtime(failed) < RETRY_AFTER_S:
      return unavailable(home)  # Not again on every `make test` (pip's retries take minutes).
    with contextlib.suppress(FileNotFoundError):
      os.remove(failed)
    t0 = time.time()
    try:
      _install(home)
    except (OSError, subprocess.CalledProcessError, RuntimeError) as e:
      with open(_failure(home), "w") as f:
        f.write(str(e))
      return unavailable(home)
    open(_ready(home), "w").close()
    print(f"label-studio {VERSION}: installed under {home} in {time.time() - t0:.0f} s")
    return None


LABEL_CONFIG = """<View>
  <Image name="image" value="$image"/>
  <BrushLabels name="tag" toName="image"><Label value="Object"/></BrushLabels>
  <KeyPointLabels name="kp" toName="image" smart="true"><Label value="Object"/></KeyPointLabels>
  <RectangleLabels name="rect" toName="image" smart="true"><Label value="Object"/></RectangleLabels>
</View>"""


def connect(url: str, backend_url: str, image_name: str, image: bytes) -> Tuple[int, int, int]:
  """(project, task, ML backend) ids: a project of LABEL_CONFIG, one image
  uploaded, `backend_url` connected as its interactive backend."""
  pid = api(url, "POST", "/api/projects/", {"title": "beam-train", "label_config": LABEL_CONFIG})
  pid = pid["id"]
  api(url, "POST", f"/api/projects/{pid}/import", file=(image_name, image))
  tasks = api(url, "GET", f"/api/tasks/?project={pid}")
  tasks = tasks["tasks"] if isinstance(tasks, dict) else tasks
  backend = {
    "url": backend_url,
    "project": pid,
    "is_interactive": True,
    "title": "beam-train serve",
  }
  return pid, tasks[0]["id"], api(url, "POST", "/api/ml", backend)["id"]


def keypoint(
  x: int, y: int, width: int, height: int, positive: Optional[bool] = True, label: str = "Object"
) -> Dict:
  """A smart keypoint at pixel (x, y), as Label Studio's page sends it
  (`positive` None: without `is_positive`, as after a page reload)."""
  region = {
    "original_width": width,
    "original_height": height,
    "image_rotation": 0,
    "value": {
      "x": (x + 0.5) / width * 100,
      "y": (y + 0.5) / height * 100,
      "width": 0.6,
      "keypointlabels": [label],
    },
    "from_name": "kp",
    "to_name": "image",
    "type": "keypointlabels",
  }
  if positive is not None:
    region["is_positive"] = positive
  return region


def screenshot(model: str, image_path: str, click: Tuple[int, int], out: str) -> None:
  """Label Studio's page with the model's mask for one keypoint, as a PNG."""
  import tempfile  # pylint: disable=g-import-not-at-top

  from PIL import Image  # pylint: disable=g-import-not-at-top

  from train.serve import app as serve_app  # pylint: disable=g-import-not-at-top
  from train.serve.config import ServeConfig  # pylint: disable=g-import-not-at-top

  with open(image_path, "rb") as f:
    data = f.read()
  width, height = Image.open(image_path).size
  served = serve_app.running(ServeConfig(model=model, port=0))
  with served as (server, _), tempfile.TemporaryDirectory() as work, running(work) as url:
    pid, task, ml = connect(
      url, f"http://127.0.0.1:{server.port}", os.path.basename(image_path), data
    )
    point = keypoint(*click, width, height)
    body = {"task": task, "context": {"result": [point]}}
    answer = api(url, "POST", f"/api/ml/{ml}/interactive-annotating", body)["data"]
    result = [dict(r, id="mask") for r in answer["result"]] + [dict(point, id="click")]
    api(
      url,
      "POST",
      "/api/predictions/",
      {"task": task, "result": result, "model_version": answer["model_version"]},
    )
    _browser_shot(url, f"{url}/projects/{pid}/data?task={task}", out)


def _browser_shot(url: str, page: str, out: str) -> None:
  """Logs in to Label Studio in headless Chromium, opens `page`, saves a screenshot."""
  from selenium.webdriver.common.by import By  # pylint: disable=g-import-not-at-top

  from tests.helpers import browser  # pylint: disable=g-import-not-at-top

  driver = browser(1400, 900)
  try:
    driver.get(url + "/user/login/")
    driver.find_element(By.NAME, "email").send_keys(USER)
    driver.find_element(By.NAME, "password").send_keys(PASSWORD)
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    time.sleep(3)
    driver.get(page)
    time.sleep(12)  # The labelling page draws the image and the prediction.
    driver.save_screenshot(out)
  finally:
    driver.quit()


def _main(argv) -> None:
  if argv[:1] == ["install"] and len(argv) == 1:
    why = install()
    if why:
      print(f"label-studio {VERSION} cannot be used here ({why}); its test will be skipped")
    return
  if argv[:1] == ["screenshot"]:
    import argparse  # pylint: disable=g-import-not-at-top

    parser = argparse.ArgumentParser(prog="python -m tests.label_studio_env screenshot")
    for flag in ("--model", "--image", "--click", "--out"):
      parser.add_argument(flag, required=True)
    args = parser.parse_args(argv[1:])
    x, y = (int(v) for v in args.click.split(","))
    screenshot(args.model, args.image, (x, y), args.out)
    return
  sys.exit("usage: python tests/label_studio_env.py install | screenshot ...")


if __name__ == "__main__":
  _main(sys.argv[1:])
