"""The commands print their own lines, not TensorFlow's C++ start-up lines
(CUDA probes, cpu_feature_guard, absl), unless --verbose asks for them."""

import os
import re
import subprocess
import sys

import pytest

from tests.helpers import ROOT, assert_never_imports

# absl's log lines ("I0000 00:00:... cudart_stub.cc:31] ...") and its preamble.
NOISE = re.compile(r"^[IWEF]\d{4} |absl::InitializeLog|cpu_feature_guard|oneDNN", re.M)


def _start(tmp_path, *extra):
  """`beam-train predict` of an image that is not there: it imports TensorFlow,
  then says what is missing."""
  env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}  # the user's: none
  env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
  cmd = [
    sys.executable,
    "-m",
    "train",
    "predict",
    "--model",
    str(tmp_path / "none"),
    "--image",
    "x.png",
    "--positive",
    "1,1",
    "--output",
    str(tmp_path / "m.png"),
    *extra,
  ]
  return subprocess.Popen(
    cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=str(tmp_path), env=env
  )


def test_tensorflow_start_up_lines_only_with_verbose(tmp_path):
  quiet, verbose = _start(tmp_path), _start(tmp_path, "--verbose")  # side by side
  quiet_out, verbose_out = quiet.communicate(timeout=300)[0], verbose.communicate(timeout=300)[0]
  for out in (quiet_out, verbose_out):
    assert "beam-train predict: no image at x.png" in out, out
  assert not NOISE.search(quiet_out), quiet_out
  if not NOISE.search(verbose_out):
    pytest.skip("TensorFlow prints no start-up lines on this machine: nothing to hide")


def test_beam_train_starts_without_importing_beam():
  """`beam-train`'s command module loads without Apache Beam (a second of
  start-up); only the engine's rounds, which run Beam jobs, import it."""
  assert_never_imports("from train import cli", "apache_beam")
