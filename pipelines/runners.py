"""Which engine runs a job: Beam's runner names, read once.

A DirectRunner run (the default) executes on Beam's FnApiRunner, the batch
engine the DirectRunner itself picks for this job. Beam 2.7x's DirectRunner
first tries its Prism runner, which it downloads from the internet on first
use: offline that is a failed download on every run (about 0.7 s), online a
different engine than the one measured here. Asking for the FnApiRunner
directly gives the same engine on every machine, with the same options
(`--direct_running_mode`, `--direct_num_workers`). Any other `--runner`
(DataflowRunner, PrismRunner, ...) is Beam's to build.
"""

from typing import List, Optional

DIRECT_RUNNERS = ("", "DirectRunner", "direct")
DATAFLOW_RUNNERS = ("DataflowRunner", "dataflow")


def runner_name(options) -> str:
  """The --runner of `PipelineOptions` ("" when absent)."""
  from apache_beam.options.pipeline_options import StandardOptions  # pylint: disable=g-import-not-at-top

  return options.view_as(StandardOptions).runner or ""


def runner_of(args: List[str]) -> str:
  """The --runner among Beam arguments ("" when absent)."""
  from apache_beam.options.pipeline_options import PipelineOptions  # pylint: disable=g-import-not-at-top

  return runner_name(PipelineOptions(args))


def is_direct(args: List[str]) -> bool:
  return runner_of(args) in DIRECT_RUNNERS


def is_dataflow(args: List[str]) -> bool:
  return runner_of(args) in DATAFLOW_RUNNERS


def local_engine(options) -> Optional[object]:
  """For a DirectRunner run, the FnApiRunner with the run's options (as
  Beam's DirectRunner builds it); None for any other runner."""
  if runner_name(options) not in DIRECT_RUNNERS:
    return None
  # pylint: disable=g-import-not-at-top
  from apache_beam.portability.api import beam_provision_api_pb2
  from apache_beam.runners.portability.fn_api_runner import fn_runner
  from apache_beam.runners.portability.portable_runner import JobServiceHandle

  # pylint: enable=g-import-not-at-top
  encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
  return fn_runner.FnApiRunner(
    provision_info=fn_runner.ExtendedProvisionInfo(
      beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded)
    )
  )
