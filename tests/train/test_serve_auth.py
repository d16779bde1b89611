"""Nobody reads or writes labels uninvited: `beam-train serve` on a network
address needs credentials and asks every request for them; on loopback it
stays open."""

import base64
import logging
import urllib.error
import urllib.request

import pytest

from train import cli
from train.serve import app as serve_app
from train.serve import auth
from train.serve.config import ServeConfig

TOKEN = "s3cret-token-0123456789"


def _basic(user, password):
  return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.20", "::", "my-laptop.local"])
def test_a_network_address_without_credentials_does_not_start(trained, host, monkeypatch, capsys):
  for name in (auth.ENV_TOKEN, auth.ENV_USER, auth.ENV_PASSWORD):
    monkeypatch.delenv(name, raising=False)
  with pytest.raises(ValueError, match=f"--host {host} opens the server to the network"):
    ServeConfig(model=trained, host=host, port=0)
  with pytest.raises(SystemExit) as e:
    cli.main(["serve", "--model", trained, "--host", host, "--port", "0"])
  assert e.value.code == 2
  out = capsys.readouterr()
  lines = [line for line in (out.out + out.err).splitlines() if "opens the server" in line]
  assert len(lines) == 1 and "--auth-token" in lines[0], out


def test_loopback_stays_open(trained, monkeypatch):
  monkeypatch.delenv(auth.ENV_TOKEN, raising=False)
  for host in ("127.0.0.1", "::1", "localhost"):
    assert not ServeConfig(model=trained, host=host, port=0).credentials
  with pytest.raises(ValueError, match="needs both a user and a password"):
    ServeConfig(model=trained, auth_user="ann", port=0)


def test_every_route_asks_for_the_credentials_given(trained, monkeypatch, caplog):
  monkeypatch.setenv(auth.ENV_TOKEN, TOKEN)  # From the environment, as the docs advise.
  config = ServeConfig(
    model=trained,
    model_name="cat",
    host="0.0.0.0",
    port=0,
    auth_user="ann",
    auth_password="pw:with:colons",
  )
  served = serve_app.running(config, logging.getLogger("beam_train"))
  with caplog.at_level(logging.INFO, logger="beam_train"), served as (server, _):
    url = f"http://127.0.0.1:{server.port}"
    routes = [(p, None) for p in ("/", "/v1/models/cat", "/page/sources", "/page/coco", "/health")]
    routes += [(p, b"{}") for p in ("/setup", "/predict", "/webhook", "/page/save")]
    for path, body in routes:  # Label Studio's routes too: they fetch images, keep labels.
      with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(url + path, data=body)
      assert e.value.code == 401, path
      assert e.value.headers["WWW-Authenticate"] == 'Basic realm="beam-train serve"'
      assert b"credentials needed" in e.value.read()
    for header in (
      "Bearer wrong",
      _basic("ann", "nope"),
      _basic("bob", "pw:with:colons"),
      "Basic !!!",
      "Token " + TOKEN,
    ):
      req = urllib.request.Request(url + "/v1/models/cat", headers={"Authorization": header})
      with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req)
      assert e.value.code == 401, header
    for header in ("Bearer " + TOKEN, _basic("ann", "pw:with:colons")):
      req = urllib.request.Request(url + "/v1/models/cat", headers={"Authorization": header})
      with urllib.request.urlopen(req) as r:
        assert r.status == 200
  logged = caplog.text
  assert "every request needs a bearer token or basic auth as 'ann'" in logged
  assert TOKEN not in logged and "pw:with:colons" not in logged
  assert TOKEN not in repr(config.credentials)
  shown = ServeConfig(model=trained, auth_token=TOKEN, auth_user="ann", auth_password="pw")
  assert TOKEN not in repr(shown) and "'pw'" not in repr(shown)
