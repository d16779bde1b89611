"""`beam-prep`: the command line of the pipelines.

    beam-prep sample-data  --output DIR [--count N] [--seed S]
    beam-prep segmentation --input DIR --output DIR [--variants K]
                           [--image-size N] [--config FILE] [--preset smoke]
                           [--overwrite] [Beam options ...]
    beam-prep classification --input DIR --output DIR [--image-size N] ...
    beam-prep preview      --records DIR --output FILE.png [--count N]

Arguments the subcommand does not know are Beam pipeline options
(`--runner`, `--project`, `--direct_num_workers`, ...), as in Beam's own
examples.
"""

import argparse
import functools
import os
from typing import List, Optional

from beam_prep import keys, kit
from beam_prep.config import PrepConfig, PreviewConfig, SampleDataConfig
from beam_prep.console import (
  Refused,
  beam_option_flags,
  check_unknown,
  command,
  dispatch,
  option_flags,
  refusing,
)
from pipelines import logs

# Chosen by measurement (docs/performance.md, "Running mode of the DirectRunner"): below
# this many inputs one in-memory worker is as fast or faster (there are few
# shard groups to spread, and threads contend for the GIL); from it on, one
# worker thread per core (up to 8). Any --direct_* option the user gives wins.
PARALLEL_MIN_INPUTS = 200
MAX_LOCAL_WORKERS = 8


def _inputs_at_least(root: str, n: int) -> bool:
  """Whether a local input holds at least `n` images (or manifest rows); stops counting at n."""
  import os  # pylint: disable=g-import-not-at-top

  if keys.is_remote(root) or not os.path.exists(root):
    return False
  if os.path.isfile(root):
    with open(root, "rb") as f:
      return sum(1 for _, line in zip(range(n + 1), f) if line.strip()) > n  # a header row
  seen = 0
  for _, _, files in os.walk(root):
    seen += sum(1 for name in files if name.lower().endswith(keys.IMAGE_SUFFIXES))
    if seen >= 2 * n:  # images and masks alike are counted
      return True
  return False


def direct_defaults(input_root: str, cores: Optional[int] = None) -> List[str]:
  """The DirectRunner's mode and worker count for this input on this machine."""
  import os  # pylint: disable=g-import-not-at-top

  cores = cores or os.cpu_count() or 1
  if cores >= 2 and _inputs_at_least(input_root, PARALLEL_MIN_INPUTS):
    return [
      "--direct_running_mode=multi_threading",
      f"--direct_num_workers={min(cores, MAX_LOCAL_WORKERS)}",
    ]
  return ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def _preview(argv: List[str], log) -> int:
  config = kit.parse_command(
    "beam-prep preview",
    "Draw a grid of what the records hold (image, clicks, mask, distance maps).",
    PreviewConfig,
    argv,
  )
  from apache_beam.io.filesystems import FileSystems  # pylint: disable=g-import-not-at-top
  from pipelines import preview  # pylint: disable=g-import-not-at-top

  records = config.records
  if not FileSystems.exists(records):
    raise Refused(f"{records} does not exist")
  nested = FileSystems.join(records, keys.RECORDS_DIR)
  if FileSystems.exists(nested):
    records = nested
  with refusing(FileNotFoundError):
    path = preview.write_preview(records, config.output, config.count)
  log.info("preview: %d examples -> %s", config.count, path)
  return 0


def _sample_data(argv: List[str], log) -> int:
  config = kit.parse_command(
    "beam-prep sample-data",
    "Write a deterministic sample data set (images/ + masks/).",
    SampleDataConfig,
    argv,
  )
  from beam_prep.sample_data import write_sample_data  # pylint: disable=g-import-not-at-top

  with refusing(ValueError):  # The sizes and counts asked.
    counts = write_sample_data(
      config.output, config.count, config.seed, (config.width, config.height)
    )
  log.info(
    "sample-data: wrote %d scenes with %d objects to %s",
    counts["images"],
    counts["objects"],
    config.output,
  )
  return 0


def _layout_help(task) -> str:
  from beam_prep import layouts  # pylint: disable=g-import-not-at-top

  return (
    f"input layouts (--layout, default auto: the first that recognises --input):\n"
    f"{layouts.describe(task.labels)}\n"
  )


def _fields_not_used(task) -> set:
  """`PrepConfig` fields `task` has no use for: `--image-root` when none of
  its layouts lists image paths."""
  from beam_prep import layouts  # pylint: disable=g-import-not-at-top

  if any(lay.takes_image_root for lay in layouts.layouts_for(task.labels)):
    return set()
  return {"image_root"}


def _import_user_modules(argv: List[str]) -> None:
  """Imports `--ops-module` before the parser is built, so that the options
  and the help see the layouts (and ops) it registers."""
  from beam_prep.ops import registry  # pylint: disable=g-import-not-at-top

  pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
  pre.add_argument("--ops-module", default="")
  registry.import_ops_modules(pre.parse_known_args(argv)[0].ops_module)


def prep_parser(task_name: str = "segmentation") -> argparse.ArgumentParser:
  """The parser of `beam-prep TASK` for a registered task: the config's options
  (`beam_prep.kit`), those the task adds, and the command's own."""
  from beam_prep import tasks  # pylint: disable=g-import-not-at-top

  task = tasks.get_task(task_name)
  parser = argparse.ArgumentParser(
    prog=f"beam-prep {task.name}",
    description=f"Precompute {task.summary}. Unknown arguments are passed to Beam as "
    "pipeline options (--runner, --project, ...).",
    epilog=_layout_help(task),
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  kit.add_options(parser, PrepConfig, skip=_fields_not_used(task))
  kit.add_options(parser, task.options)
  task.add_arguments(parser)
  parser.add_argument("--config", help="JSON file of PrepConfig fields")
  parser.add_argument("--preset", help=kit.preset_help(PrepConfig))
  parser.add_argument(
    "--wait",
    action=argparse.BooleanOptionalAction,
    default=True,
    help="Dataflow: wait for the job and print its summary, or return once "
    "it is submitted (--no-wait) (default: wait)",
  )
  parser.add_argument("--verbose", action="store_true", help="show library logs")
  return parser


def build_config(args: argparse.Namespace, task_name: str = "segmentation"):
  """Defaults, then preset, then config file, then flags; validated (`beam_prep.kit`)."""
  from beam_prep import tasks  # pylint: disable=g-import-not-at-top

  task = tasks.get_task(task_name)
  if getattr(args, "add", None) and (args.overwrite or args.transform_from):
    raise ValueError(
      "--add keeps OUTPUT and its transform: it takes neither --overwrite nor --transform-from"
    )
  return kit.resolve(
    PrepConfig,
    args,
    fixed={"task": task_name},
    extra=task.config_fields(args),
    more=(task.options,),
  )


def pipeline_args(beam_args: List[str], input_root: str = "") -> List[str]:
  """Beam options with this tool's DirectRunner defaults filled in."""
  from pipelines.runners import is_direct  # pylint: disable=g-import-not-at-top

  args = list(beam_args)
  if is_direct(beam_args):
    given = [a for a in args if a.startswith("--direct_")]
    for default in [] if given else direct_defaults(input_root):
      flag = default.split("=")[0]
      if not any(a == flag or a.startswith(flag + "=") for a in args):
        args.append(default)
  return args


def _check(config) -> None:
  """Checks what can be checked before the job: chain, declarations, preprocessing_fn."""
  from beam_prep import preprocessing  # pylint: disable=g-import-not-at-top
  from beam_prep.ops import registry  # pylint: disable=g-import-not-at-top

  with refusing(ValueError, TypeError, OSError, ImportError):
    registry.import_ops_modules(config.ops_module)
    registry.build_chain(config.chain)  # Names and literal arguments, checked now.
    table = config.features()  # Declarations, checked now.
    preprocessing.preprocessing_fn_for(table, config.preprocessing_fn)


def _launch(config, beam_args, known):
  """Runs the job -> its manifest."""
  from apache_beam.options.pipeline_options import PipelineOptions  # pylint: disable=g-import-not-at-top
  from beam_prep.features import FeatureError  # pylint: disable=g-import-not-at-top
  from pipelines import dataflow, outputs, prep, runners, shard_sets  # pylint: disable=g-import-not-at-top

  refused = (
    outputs.OutputError,
    prep.TransformFromError,
    shard_sets.AddError,
    dataflow.DataflowOptionsError,
  )
  try:
    with refusing(*refused):
      if runners.is_dataflow(beam_args):
        beam_args = dataflow.check_and_complete(beam_args, config)
      options = PipelineOptions(pipeline_args(beam_args, config.input))
      return prep.run(config, options, wait=known.wait)
  except prep.InputError as e:
    raise Refused(f"{e}{_layout_from_file(config, known)}") from e
  except FeatureError as e:  # An op's bug: it stops the job, which leaves no output.
    kept = "the output is as it was before it" if config.add else "its output was removed"
    raise Refused(f"the job stopped and {kept}: {e}") from e


def _layout_from_file(config, known) -> str:
  """Says so when the layout that did not read the input came from --config
  (the settings of another run, reused for new data), not the command line."""
  given = keys.is_remote(config.input) or os.path.exists(config.input)
  if given and getattr(known, "layout", None) is None and known.config and config.layout != "auto":
    return (
      f" (--layout {config.layout} came from --config {known.config}: give --layout auto "
      "to detect the input's own, or its name)"
    )
  return ""


def _prep(task: str, argv: List[str], log) -> int:
  with refusing(ImportError):
    _import_user_modules(argv)
  parser = prep_parser(task)
  known, beam_args = parser.parse_known_args(argv)
  with refusing(ValueError, TypeError, OSError):
    # Beam drops options it does not know with a log line: a typo here
    # would run a whole job with a default.
    check_unknown(beam_args, option_flags(parser) + beam_option_flags(), f"beam-prep {task}")
    config = build_config(known, task)
  _check(config)
  return _report(_launch(config, beam_args, known), config, log, task)


def _report(manifest, config, log, task: str) -> int:
  from pipelines import report  # pylint: disable=g-import-not-at-top

  if manifest.get("dry_run"):
    log.info("%s: dry run: the job was built and not submitted", task)
    return 0
  if manifest.get("submitted"):
    log.info(
      "%s: not waiting; when the job is done, %s holds manifest.json and, if it is "
      "complete, _SUCCESS",
      task,
      config.output,
    )
    return 0
  log.info("%s: %s", task, "done" if manifest["complete"] else "FAILED")
  for line in report.summary_lines(manifest):
    log.info(line)
  if manifest["complete"]:
    return 0
  for line in report.failure_lines(manifest):
    log.error(line)
  return 1


def _task_commands():
  from beam_prep import tasks  # pylint: disable=g-import-not-at-top

  return {
    name: command(f"beam-prep {name}", logs.quiet, functools.partial(_prep, name))
    for name in tasks.task_names()
  }


def main(argv: Optional[List[str]] = None) -> None:
  commands = {
    "sample-data": command("beam-prep sample-data", logs.quiet, _sample_data),
    **_task_commands(),
    "preview": command("beam-prep preview", logs.quiet, _preview),
  }
  dispatch(__doc__, commands, argv)
