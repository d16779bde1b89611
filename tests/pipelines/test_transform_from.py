"""`beam-prep segmentation --transform-from`: records read with another
output's tf.Transform output, as it is (no analysis), given by the output
itself or by a model dir trained on it; records of another raw schema are
refused before the job runs."""

import filecmp
import os

import pytest

from beam_prep import keys
from beam_prep.features import FeatureTable
from beam_prep.prep_output import PrepOutput
from pipelines.prep import TransformFromError, transform_source
from tests.helpers import PREP_ARGS, manifest, run_cli

# The session's prep output's settings (`prep_dir`), without progress lines.
SETTINGS = [*PREP_ARGS, "--progress-seconds", "0"]


def _same_tree(a, b) -> bool:
  cmp = filecmp.dircmp(a, b)
  if cmp.left_only or cmp.right_only or cmp.diff_files or cmp.funny_files:
    return False
  return all(_same_tree(os.path.join(a, d), os.path.join(b, d)) for d in cmp.common_dirs)


def test_records_are_read_with_the_given_transform_without_analysis(
  sample_dir, prep_dir, trained, tmp_path
):
  subset = tmp_path / "few"
  for sub in ("images", "masks"):
    (subset / sub).mkdir(parents=True)
    for name in sorted(os.listdir(os.path.join(sample_dir, sub)))[:3]:
      os.link(os.path.join(sample_dir, sub, name), subset / sub / name)
  out = tmp_path / "round"
  assert (
    run_cli(
      [
        "segmentation",
        "--input",
        str(subset),
        "--output",
        str(out),
        "--transform-from",
        trained,
        *SETTINGS,
      ]
    )
    == 0
  )  # A model dir: its prep output.
  assert _same_tree(os.path.join(prep_dir, keys.TRANSFORM_DIR), out / keys.TRANSFORM_DIR)
  assert manifest(out)["config"]["transform_from"] == trained
  prep = PrepOutput(str(out))
  prep.check_trainable()
  assert next(iter(prep.read_numpy(keys.TRAIN_SPLIT)), None) is not None


def test_another_raw_schema_is_refused_before_the_job_runs(sample_dir, prep_dir, tmp_path):
  out = tmp_path / "other"
  settings = [s if s != "64" else "48" for s in SETTINGS]
  assert (
    run_cli(
      [
        "segmentation",
        "--input",
        sample_dir,
        "--output",
        str(out),
        "--transform-from",
        prep_dir,
        *settings,
      ]
    )
    != 0
  )
  assert not (out / keys.SUCCESS_FILE).exists() and not (out / keys.RECORDS_DIR).exists()
  table = PrepOutput(prep_dir).table
  other = FeatureTable.from_dict(dict(table.to_dict(), image_size=[48, 48]))
  with pytest.raises(TransformFromError, match="raw schema differs from this run's in .*image"):
    transform_source(prep_dir, other)
  missing = tmp_path / "none"
  missing.mkdir()
  assert (
    run_cli(
      [
        "segmentation",
        "--input",
        sample_dir,
        "--output",
        str(tmp_path / "x"),
        "--transform-from",
        str(missing),
        *SETTINGS,
      ]
    )
    == 2
  )
  assert not (tmp_path / "x").exists()  # Refused before anything is written.
