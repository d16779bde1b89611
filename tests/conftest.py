"""Shared fixtures: a small sample data set, one pipeline run and one model
trained a few steps on it (with its serving export), each made once per test
run: under pytest-xdist, by the first worker that asks, and read by the
others (they only read them)."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import pytest  # pylint: disable=g-import-not-at-top

from tests.helpers import FIT_ARGS, PREP_ARGS, made_once  # pylint: disable=g-import-not-at-top


# Fixtures made once per run whose making takes long (tens of seconds).
RUN_TOGETHER = ("portable_export",)


def _fixtures(item) -> set:
  params = getattr(getattr(item, "callspec", None), "params", {})
  return set(getattr(item, "fixturenames", ())) - set(params)


def pytest_collection_modifyitems(items):
  """The tests of a fixture in RUN_TOGETHER run back to back, from the first
  one's place. Under pytest-xdist each worker takes a contiguous share of
  the tests: with that fixture's tests in both shares, a worker that reached
  it while the other was making it sat idle until it was made."""
  for name in RUN_TOGETHER:
    users = [item for item in items if name in _fixtures(item)]
    if users:
      first = items.index(users[0])
      others = [item for item in items if name not in _fixtures(item)]
      items[:] = others[:first] + users + others[first:]


@pytest.fixture(scope="session")
def sample_dir(tmp_path_factory):
  from beam_prep.sample_data import write_sample_data  # pylint: disable=g-import-not-at-top

  return made_once(
    tmp_path_factory, "sample", lambda path: write_sample_data(path, count=10, seed=3)
  )


def _prep(sample, out):
  from pipelines import cli  # pylint: disable=g-import-not-at-top

  with pytest.raises(SystemExit) as e:
    cli.main(["segmentation", "--input", sample, "--output", out, *PREP_ARGS])
  assert e.value.code == 0


@pytest.fixture(scope="session")
def prep_dir(sample_dir, tmp_path_factory):
  """The real segmentation pipeline (DirectRunner) over the sample data."""
  return made_once(tmp_path_factory, "prep", lambda path: _prep(sample_dir, path))


def _guided(sample, out):
  from pipelines import cli  # pylint: disable=g-import-not-at-top

  with pytest.raises(SystemExit) as e:
    cli.main(
      [
        "segmentation",
        "--input",
        sample,
        "--output",
        out,
        "--preset",
        "smoke",
        "--image-size",
        "48",
        "--variants",
        "1",
        "--eval-percent",
        "30",
        "--click-encoding",
        "disks",
        "--previous-mask",
        "--max-error-fraction",
        "1",
        "--progress-seconds",
        "0",
      ]
    )
  assert e.value.code == 0


@pytest.fixture(scope="session")
def guided_prep(sample_dir, tmp_path_factory):
  """Records with click disks and a previous mask as model inputs (48 px, one variant)."""
  return made_once(tmp_path_factory, "guided", lambda path: _guided(sample_dir, path))


def _fit(prep, model_dir):
  from train import cli  # pylint: disable=g-import-not-at-top

  with pytest.raises(SystemExit) as e:
    cli.main(["fit", "--data", prep, "--model-dir", model_dir, "--steps", "6", *FIT_ARGS])
  assert e.value.code == 0


@pytest.fixture(scope="session")
def trained(prep_dir, tmp_path_factory):
  """A segmentation model trained a few steps on the session's records, exported."""
  return made_once(tmp_path_factory, "model", lambda path: _fit(prep_dir, path))


@pytest.fixture(scope="session")
def trained_served(trained):
  """The session model's export as `ServedModel`, loaded once per test process
  (tests only call it)."""
  from train.export.served import ServedModel  # pylint: disable=g-import-not-at-top

  return ServedModel(trained)


@pytest.fixture(scope="session")
def trained_loaded(trained):
  """The session model's export, `tf.saved_model.load`ed once per test process
  (tests only call its signatures)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from train.export.saved_model import latest_export  # pylint: disable=g-import-not-at-top

  return tf.saved_model.load(latest_export(trained))


@pytest.fixture(scope="session")
def trained_versions(trained):
  """The session model as `beam-train serve` holds it (`Versions`, named
  "cat"), loaded once per test process: tests make apps on it
  (`serve_app.make_app`, which does not watch it for new versions) and only
  call it."""
  from train.serve.versions import Versions  # pylint: disable=g-import-not-at-top

  return Versions(trained, "cat")


def _portable(prep, model, out):
  from train import cli  # pylint: disable=g-import-not-at-top

  argv = ["export", "--data", prep, "--model-dir", model, "--output", out]
  with pytest.raises(SystemExit) as e:
    cli.main(argv + ["--format", "tflite", "--format", "onnx"])
  assert e.value.code == 0


@pytest.fixture(scope="session")
def portable_export(prep_dir, trained, tmp_path_factory):
  """The session's model as TFLite and ONNX files (no SavedModel beside them):
  its export folder."""
  out = made_once(tmp_path_factory, "portable", lambda path: _portable(prep_dir, trained, path))
  (version,) = os.listdir(out)
  return os.path.join(out, version)
