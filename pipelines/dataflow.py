"""Running the same pipelines on Google Cloud Dataflow.

`check_and_complete(args, config)` validates the options of a Dataflow run
before anything is submitted, offline (no credentials, no network), and adds
`--setup_file` so that workers install this very package.
"""

import os
import re
from typing import List, Optional

from beam_prep.config import PrepConfig


class DataflowOptionsError(ValueError):
  """The options cannot make a Dataflow job; the message says what to fix."""


def _view(args: List[str], cls):
  """Beam's own reading of its options (`PipelineOptions.view_as`)."""
  from apache_beam.options import pipeline_options  # pylint: disable=g-import-not-at-top

  return pipeline_options.PipelineOptions(args).view_as(getattr(pipeline_options, cls))


_BUCKET_CHARS = re.compile(r"^[a-z0-9][a-z0-9._-]*[a-z0-9]$")
_IP = re.compile(r"^\d{1,3}(\.\d{1,3}){3}$")


def bucket_problem(path: str) -> Optional[str]:
  """Why the bucket of a gs:// path breaks GCS's naming rules (None when it is fine).

  Checked offline: Beam, given a bad temp and staging bucket, tries to create
  a default bucket instead, which hangs without credentials.
  """
  if not path.startswith("gs://"):
    return None
  bucket = path[len("gs://") :].split("/", 1)[0]
  rules = (
    "bucket names are 3-63 characters (up to 222 with dots, 63 between dots) of "
    "lowercase letters, digits, '-', '_' and '.', starting and ending with a letter or "
    "digit"
  )
  if not 3 <= len(bucket) <= (222 if "." in bucket else 63):
    return f"bucket {bucket!r} in {path} has {len(bucket)} characters; {rules}"
  if not _BUCKET_CHARS.match(bucket) or any(len(p) > 63 or not p for p in bucket.split(".")):
    return f"bucket {bucket!r} in {path} is not a valid name: {rules}"
  if _IP.match(bucket):
    return f"bucket {bucket!r} in {path} looks like an IP address, which GCS refuses"
  if bucket.startswith("goog") or re.search(r"g[o0]{2}g(le|l3)", bucket):
    return f"bucket {bucket!r} in {path}: GCS refuses names that start with 'goog' or hold 'google'"
  return None


def package_setup_file() -> str:
  """This package's setup.py (present in a source checkout or editable install)."""
  here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  return os.path.join(here, "setup.py")


def check_and_complete(args: List[str], config: PrepConfig) -> List[str]:
  """Validates a Dataflow run and returns the Beam arguments to use.

  Raises:
    DataflowOptionsError: listing every problem found, not only the first.
  """
  problems = []
  gcp = _view(args, "GoogleCloudOptions")
  if not gcp.project:
    problems.append("--project is required (the GCP project that runs the job)")
  if not gcp.region:
    problems.append("--region is required (e.g. --region=us-central1)")
  temp, staging = gcp.temp_location, gcp.staging_location
  if not temp:
    problems.append(
      "--temp_location=gs://BUCKET/tmp is required (also holds tf.Transform's temporary files)"
    )
  elif not temp.startswith("gs://"):
    problems.append(
      f"--temp_location must be on GCS (gs://...), got {temp}: workers and "
      "tf.Transform cannot use a local temp dir"
    )
  if staging and not staging.startswith("gs://"):
    problems.append(f"--staging_location must be on GCS (gs://...), got {staging}")
  for name, path in (("--input", config.input), ("--output", config.output)):
    if not path.startswith("gs://"):
      problems.append(
        f"{name} {path} is not on GCS: Dataflow workers cannot see this "
        "machine's disk; copy the data to gs:// first"
      )
  for name, path in (
    ("--temp_location", temp),
    ("--staging_location", staging),
    ("--input", config.input),
    ("--output", config.output),
  ):
    problem = bucket_problem(path or "")
    if problem:
      problems.append(f"{name}: {problem}")
  if problems:
    raise DataflowOptionsError("cannot submit to Dataflow:\n  - " + "\n  - ".join(problems))
  out = list(args)
  # A custom worker image (docker/Dockerfile) already holds the package.
  if (
    _view(args, "SetupOptions").setup_file is None
    and _view(args, "WorkerOptions").sdk_container_image is None
  ):
    setup = package_setup_file()
    if not os.path.exists(setup):
      raise DataflowOptionsError(
        "cannot find beam-prep's setup.py to stage for the workers; pass "
        "--setup_file=/path/to/beam-prep/setup.py"
      )
    out.append(f"--setup_file={setup}")
  return out
