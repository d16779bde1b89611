"""Shared fixtures: a small sample data set, one pipeline run and one model
trained a few steps on it (with its serving export), each made once."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import pytest  # pylint: disable=g-import-not-at-top


@pytest.fixture(scope="session")
def sample_dir(tmp_path_factory):
  from beam_prep.sample_data import write_sample_data  # pylint: disable=g-import-not-at-top
  path = str(tmp_path_factory.mktemp("sample"))
  write_sample_data(path, count=10, seed=3)
  return path


@pytest.fixture(scope="session")
def prep_dir(sample_dir, tmp_path_factory):
  """The real segmentation pipeline (DirectRunner) over the sample data."""
  from pipelines import cli  # pylint: disable=g-import-not-at-top
  out = str(tmp_path_factory.mktemp("prep") / "out")
  with pytest.raises(SystemExit) as e:
    cli.main(["segmentation", "--input", sample_dir, "--output", out, "--preset", "smoke",
              "--image-size", "64", "--variants", "2", "--eval-percent", "30",
              "--target-shard-mb", "0.03",
              # 64 px records: many sample objects are too small to click.
              "--max-error-fraction", "1"])
  assert e.value.code == 0
  return out


@pytest.fixture(scope="session")
def trained(prep_dir, tmp_path_factory):
  """A segmentation model trained a few steps on the session's records, exported."""
  from train import cli  # pylint: disable=g-import-not-at-top
  model_dir = str(tmp_path_factory.mktemp("model"))
  with pytest.raises(SystemExit) as e:
    cli.main(["fit", "--data", prep_dir, "--model-dir", model_dir, "--steps", "6",
              "--batch-size", "4", "--width", "4", "--depth", "2", "--histogram-every", "0",
              "--noc-clicks", "0"])
  assert e.value.code == 0
  return model_dir
