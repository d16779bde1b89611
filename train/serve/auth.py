"""Who may call `beam-train serve`: nobody reads or writes labels or images
uninvited.

On a loopback address (127.0.0.1, ::1, localhost) the server is open, as a
local tool is. Any other --host opens it to the network, so the server then
needs credentials and refuses to start without them:

  a bearer token   --auth-token or BEAM_TRAIN_AUTH_TOKEN:
                   `Authorization: Bearer TOKEN` (scripts, CVAT's function)
  a user           --auth-user and --auth-password, or BEAM_TRAIN_AUTH_USER
                   and BEAM_TRAIN_AUTH_PASSWORD: HTTP basic auth (a browser
                   asks for them; Label Studio's `BASIC_AUTH`)

With credentials given, every route asks for them, on any address. A
request without them, or with wrong ones, is answered 401 with
`{"error": ...}` and a `WWW-Authenticate` header. Credentials are never
logged; the environment variables keep them out of process listings.
"""

import base64
import binascii
import dataclasses
import hmac
import ipaddress
import os
from typing import Optional

ENV_TOKEN, ENV_USER, ENV_PASSWORD = (
  "BEAM_TRAIN_AUTH_TOKEN",
  "BEAM_TRAIN_AUTH_USER",
  "BEAM_TRAIN_AUTH_PASSWORD",
)
REALM = "beam-train serve"


@dataclasses.dataclass(frozen=True, repr=False)
class Credentials:
  """What a request must present: a bearer token, a user and password, or both."""

  token: str = ""
  user: str = ""
  password: str = ""

  def __bool__(self) -> bool:
    return bool(self.token or self.user)

  def __repr__(self) -> str:  # Never the secrets.
    return f"Credentials(token={'***' if self.token else ''}, user={self.user!r})"

  def describe(self) -> str:
    """What a client must send, for the log (no secret in it)."""
    ways = (["a bearer token"] if self.token else []) + (
      [f"basic auth as {self.user!r}"] if self.user else []
    )
    return " or ".join(ways)

  def allows(self, header: Optional[str]) -> bool:
    """Whether an Authorization header value presents these credentials."""
    kind, _, value = (header or "").partition(" ")
    if kind.lower() == "bearer" and self.token:
      return hmac.compare_digest(value.strip().encode(), self.token.encode())
    if kind.lower() == "basic" and self.user:
      try:
        user, _, password = base64.b64decode(value.strip(), validate=True).decode().partition(":")
      except (binascii.Error, UnicodeDecodeError):
        return False
      return hmac.compare_digest(user.encode(), self.user.encode()) & hmac.compare_digest(
        password.encode(), self.password.encode()
      )
    return False

  def challenge(self) -> str:
    """The `WWW-Authenticate` header of a refusal."""
    return f'Basic realm="{REALM}"' if self.user else f'Bearer realm="{REALM}"'


def credentials(token: str = "", user: str = "", password: str = "") -> Credentials:
  """The flags' credentials, else the environment's.

  Raises:
    ValueError: a user without a password, or a password without a user.
  """
  token = token or os.environ.get(ENV_TOKEN, "")
  user = user or os.environ.get(ENV_USER, "")
  password = password or os.environ.get(ENV_PASSWORD, "")
  if bool(user) != bool(password):
    raise ValueError(
      f"basic auth needs both a user and a password (--auth-user and --auth-password, or "
      f"{ENV_USER} and {ENV_PASSWORD})"
    )
  return Credentials(token, user, password)


def is_loopback(host: str) -> bool:
  if host == "localhost":
    return True
  try:
    return ipaddress.ip_address(host.strip("[]")).is_loopback
  except ValueError:
    return False  # A host name: it may be reachable from elsewhere.


def check_open(host: str, creds: Credentials) -> None:
  """Raises ValueError (one line, saying why) for a network address without credentials."""
  if not creds and not is_loopback(host):
    raise ValueError(
      f"--host {host} opens the server to the network, and nobody may read or write labels "
      f"and images uninvited: give a bearer token (--auth-token or {ENV_TOKEN}) or a user "
      f"(--auth-user and --auth-password, or {ENV_USER} and {ENV_PASSWORD}), or listen on "
      "127.0.0.1"
    )
