"""`ServeConfig`: what `beam-train serve` was asked for. Each field is also
a flag of the command (`beam_prep.kit`); this module imports no web framework,
so the command can say what is missing before importing one."""

import dataclasses
import os

from beam_prep.kit import CommandConfig, option
from train.engine import EngineConfig
from train.serve import auth

# Label Studio's token when no flag gives it (kept out of process listings).
LABEL_STUDIO_TOKEN_ENV = "BEAM_TRAIN_LABEL_STUDIO_TOKEN"

# `serve --engine-X`: the `EngineConfig` field each sets for a background round
# (its default, its flag of `beam-train engine`).
ENGINE_FIELDS = {
  "engine_steps": "steps",
  "engine_minutes": "max_minutes",
  "engine_lr_scale": "lr_scale",
  "engine_warmup_steps": "warmup_steps",
  "engine_base_share": "base_share",
  "engine_judge_percent": "judge_percent",
}


def _engine_option(name: str, text: str):
  """A background round's setting: `EngineConfig`'s field `name`, with its default."""
  return option(next(f.default for f in dataclasses.fields(EngineConfig) if f.name == name), text)


@dataclasses.dataclass(frozen=True)
class ServeConfig(CommandConfig):
  """A server of one exported model."""

  model: str = option("", "model dir (newest export) or one export dir", required=True)
  model_name: str = option(
    "", "the name in /v1/models/NAME ('': the model dir's name)", show_default=False
  )
  host: str = option(
    "127.0.0.1",
    "address to listen on; another than loopback (0.0.0.0: every one) opens it to the "
    "network and needs credentials (--auth-*)",
  )
  port: int = option(8501, "port to listen on (0: any free port)")
  images: str = option("", "a folder whose images the page may open")
  data: str = option("", "a beam-prep output: the page opens its eval objects with their true mask")
  save_dir: str = option(
    "",
    "a folder the page saves its labels into, as beam-prep reads "
    "them: --layout folders --input DIR, or --layout coco --input "
    "DIR/instances.json ('': kept in memory only)",
    show_default=False,
  )
  # TF Serving checks its model base path every second by default; a load
  # takes seconds, so every 2 s costs nothing.
  poll_seconds: float = option(
    2.0,
    "look for a newer export under --model this often (0: never); it is served without a restart",
  )
  max_request_mb: float = option(64.0, "larger request bodies are refused (413)")
  # The Beam job's limit is 64M pixels for offline work; a click-to-mask
  # server keeps interactive sizes (16M = 4096 x 4096).
  max_pixels: int = option(16_777_216, "images with more pixels are refused")
  # A person clicks a few times, the NoC protocol at most 20; each click
  # costs the model a map of the image, so thousands would take it seconds
  # and gigabytes.
  max_clicks: int = option(
    256, "requests with more clicks (positive and negative together) are refused"
  )
  # Requests run on this many threads; more wait in a queue (the memory of a
  # burst stays that of this many requests at once).
  threads: int = option(4, "requests served at once; more wait their turn")
  cache_mb: float = option(512.0, "memory for the page's open images, in MB")
  max_eval_objects: int = option(100, "eval objects of --data the page lists")
  # Secrets: the environment variables (train.serve.auth) keep them out of
  # process listings; neither is ever logged.
  auth_token: str = option(
    "",
    "a bearer token every request must send (or the env BEAM_TRAIN_AUTH_TOKEN)",
    show_default=False,
    secret=True,
  )
  auth_user: str = option(
    "", "a user for HTTP basic auth (or the env BEAM_TRAIN_AUTH_USER)", show_default=False
  )
  auth_password: str = option(
    "",
    "the basic auth user's password (or the env BEAM_TRAIN_AUTH_PASSWORD)",
    show_default=False,
    secret=True,
  )
  label_studio_url: str = option(
    "",
    "Label Studio's address, where task images are fetched ('': the one Label Studio "
    "sends when it connects the backend)",
    show_default=False,
  )
  label_studio_token: str = option(
    "",
    f"Label Studio's API token for those images (or the env {LABEL_STUDIO_TOKEN_ENV}; "
    "'': the one Label Studio sends)",
    show_default=False,
    secret=True,
  )
  engine_every: int = option(
    0,
    "run a data engine round (beam-train engine) in the background "
    "after every N labels saved (0: never); needs --save-dir and a "
    "model dir",
  )
  engine_steps: int = _engine_option("steps", "a background round's fine-tuning steps")
  engine_minutes: float = _engine_option(
    "max_minutes",
    "a background round's budget in minutes, records, training and export (0: --engine-steps only)",
  )
  engine_lr_scale: float = _engine_option(
    "lr_scale",
    "a background round's learning rate, as "
    "a multiple of the model's own (beam-train engine "
    "--lr-scale)",
  )
  engine_warmup_steps: int = _engine_option(
    "warmup_steps",
    "a background round's steps of rising learning rate (beam-train engine --warmup-steps)",
  )
  engine_base_share: float = _engine_option(
    "base_share",
    "a background round's share of the "
    "records the model was first trained on "
    "(beam-train engine --base-share)",
  )
  engine_judge_percent: int = _engine_option(
    "judge_percent",
    "a background round's share of the labelled images held out to judge its "
    "model before it is published (beam-train engine --judge-percent)",
  )

  def __post_init__(self):
    auth.check_open(self.host, self.credentials)
    if self.engine_every and not self.save_dir:
      raise ValueError("--engine-every trains on the labels saved: give --save-dir too")
    if self.engine_every < 0 or self.engine_steps < 1 or self.engine_minutes < 0:
      raise ValueError(
        "--engine-every must be 0 or more, --engine-steps at least 1, --engine-minutes 0 or more"
      )
    if self.engine_every:  # The rounds' settings are refused now, not in the background.
      try:
        EngineConfig(
          labels=self.save_dir,
          model=self.model,
          **{dst: getattr(self, src) for src, dst in ENGINE_FIELDS.items()},
        )
      except ValueError as e:
        raise ValueError(f"a background round's settings (--engine-*): {e}") from None
    for flag, value in (
      ("--max-request-mb", self.max_request_mb),
      ("--max-pixels", self.max_pixels),
      ("--max-clicks", self.max_clicks),
      ("--threads", self.threads),
    ):
      if not value > 0:
        raise ValueError(f"{flag} must be above 0, got {value}")
    if self.save_dir and os.path.exists(self.save_dir) and not os.path.isdir(self.save_dir):
      raise ValueError(f"--save-dir {self.save_dir} is a file, not a folder")
    if not 0 <= self.port <= 65535:
      raise ValueError(f"--port must be within 0..65535 (0: any free port), got {self.port}")

  @property
  def engine_args(self):
    """The `beam-train engine` flags of a background round."""
    return [
      arg
      for src, dst in ENGINE_FIELDS.items()
      for arg in ("--" + dst.replace("_", "-"), str(getattr(self, src)))
    ]

  @property
  def credentials(self) -> auth.Credentials:
    """The credentials every request must present (none: an open server)."""
    return auth.credentials(self.auth_token, self.auth_user, self.auth_password)

  @property
  def label_studio_access(self):
    """(url, token) where Label Studio's task images are fetched ("": as Label Studio says)."""
    return self.label_studio_url, self.label_studio_token or os.environ.get(
      LABEL_STUDIO_TOKEN_ENV, ""
    )

  @property
  def name(self) -> str:
    from train.serve.model import default_name  # pylint: disable=g-import-not-at-top

    return self.model_name or default_name(self.model)
