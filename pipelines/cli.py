"""`beam-prep`: the command line of the pipelines.

    beam-prep sample-data  --output DIR [--count N] [--seed S]
    beam-prep segmentation --input DIR --output DIR [--variants K]
                           [--image-size N] [--config FILE] [--preset smoke]
                           [--overwrite] [Beam options ...]
    beam-prep classification --input DIR --output DIR [--image-size N] ...
    beam-prep preview      --records DIR --output FILE.png [--count N]

Arguments the subcommand does not know are Beam pipeline options
(`--runner`, `--project`, `--direct_num_workers`, ...), as in Beam's own
examples. Entry points stay thin: parse, build one frozen config, run.
"""

import argparse
from typing import List, Optional

from beam_prep.console import (beam_option_flags, check_unknown, dispatch, load_config_file,
                               option_flags, preset, show_defaults)
from pipelines import logs

# Chosen by measurement (README, "Running mode of the DirectRunner"): below
# this many inputs one in-memory worker is as fast or faster (there are few
# shard groups to spread, and threads contend for the GIL); from it on, one
# worker thread per core (up to 8). Any --direct_* option the user gives wins.
PARALLEL_MIN_INPUTS = 200
MAX_LOCAL_WORKERS = 8
_IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")


def _inputs_at_least(root: str, n: int) -> bool:
  """Whether a local input holds at least `n` images (or manifest rows); stops counting at n."""
  import os  # pylint: disable=g-import-not-at-top
  if "://" in root or not os.path.exists(root):
    return False
  if os.path.isfile(root):
    with open(root, "rb") as f:
      return sum(1 for _, line in zip(range(n + 1), f) if line.strip()) > n  # a header row
  seen = 0
  for _, _, files in os.walk(root):
    seen += sum(1 for name in files if name.lower().endswith(_IMAGE_SUFFIXES))
    if seen >= 2 * n:  # images and masks alike are counted
      return True
  return False


def direct_defaults(input_root: str, cores: Optional[int] = None) -> List[str]:
  """The DirectRunner's mode and worker count for this input on this machine."""
  import os  # pylint: disable=g-import-not-at-top
  cores = cores or os.cpu_count() or 1
  if cores >= 2 and _inputs_at_least(input_root, PARALLEL_MIN_INPUTS):
    return ["--direct_running_mode=multi_threading",
            f"--direct_num_workers={min(cores, MAX_LOCAL_WORKERS)}"]
  return ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def _preview(argv: List[str]) -> int:
  parser = argparse.ArgumentParser(
      prog="beam-prep preview",
      description="Draw a grid of what the records hold (image, clicks, mask, distance maps).")
  parser.add_argument("--records", required=True,
                      help="a records/ directory, or a pipeline output holding one")
  parser.add_argument("--output", required=True, help="PNG file to write")
  parser.add_argument("--count", type=int, default=6, help="examples to draw (default 6)")
  args = parser.parse_args(argv)
  logs.quiet()
  from apache_beam.io.filesystems import FileSystems  # pylint: disable=g-import-not-at-top
  from beam_prep import keys  # pylint: disable=g-import-not-at-top
  from pipelines import preview  # pylint: disable=g-import-not-at-top
  records = args.records
  nested = FileSystems.join(records, keys.RECORDS_DIR)
  if FileSystems.exists(nested):
    records = nested
  try:
    path = preview.write_preview(records, args.output, max(args.count, 1))
  except FileNotFoundError as e:
    logs.get().error("beam-prep preview: %s", e)
    return 2
  logs.get().info("preview: %d examples -> %s", max(args.count, 1), path)
  return 0


def _sample_data(argv: List[str]) -> int:
  parser = argparse.ArgumentParser(
      prog="beam-prep sample-data",
      description="Write a deterministic sample data set (images/ + masks/).")
  parser.add_argument("--output", required=True, help="directory to write")
  parser.add_argument("--count", type=int, default=32, help="number of scenes (default 32)")
  parser.add_argument("--seed", type=int, default=0, help="seed (default 0)")
  parser.add_argument("--width", type=int, default=160)
  parser.add_argument("--height", type=int, default=128)
  args = parser.parse_args(argv)
  logs.quiet()
  from beam_prep.sample_data import write_sample_data  # pylint: disable=g-import-not-at-top
  counts = write_sample_data(args.output, args.count, args.seed, (args.width, args.height))
  logs.get().info("sample-data: wrote %d scenes with %d objects to %s",
                  counts["images"], counts["objects"], args.output)
  return 0


LAYOUT_HELP = """input layouts (--layout, default auto):
  folders   ROOT/images/NAME.png|jpg + ROOT/masks/NAME.png (instance ids,
            0 background, 255 ignore)
  voc       ROOT/JPEGImages, ROOT/SegmentationObject,
            ROOT/ImageSets/Segmentation/{train,val}.txt
  classes   ROOT/<label>/NAME.png|jpg (classification)
  manifest  --input FILE.csv|jsonl with columns image[,mask][,label][,split]
  coco      --input instances.json [--image-root DIR]: COCO instance
            annotations (polygons, RLE; iscrowd regions become ignore pixels),
            as COCO, LVIS, CVAT, Label Studio and Roboflow write them
"""


def prep_parser(task: str = "segmentation") -> argparse.ArgumentParser:
  """The parser of `beam-prep segmentation` / `beam-prep classification`."""
  what = ("click-variant records for interactive segmentation" if task == "segmentation"
          else "records for image classification")
  parser = argparse.ArgumentParser(
      prog=f"beam-prep {task}",
      description=f"Precompute {what}. Unknown arguments are passed to Beam as pipeline "
      "options (--runner, --project, ...).",
      epilog=LAYOUT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--input", help="data root (local or gs://), or a manifest file")
  parser.add_argument("--output", help="output directory (local or gs://)")
  parser.add_argument("--layout", help="input layout (see below)")
  parser.add_argument("--allow-outside-root", dest="allow_outside_root", action="store_true",
                      default=None, help="let manifest (or COCO file_name) paths leave the manifest's "
                      "folder (or the image root)")
  parser.add_argument("--image-root", dest="image_root",
                      help="coco layout: folder of the images' file_names (default: the JSON "
                      "file's folder)")
  parser.add_argument("--config", help="JSON file of PrepConfig fields")
  parser.add_argument("--preset", help="named defaults: smoke (tiny, for tests), demo (make demo)")
  parser.add_argument("--image-size", type=int, dest="image_size",
                      help="records hold images resized to N x N")
  if task == "segmentation":
    parser.add_argument("--variants", type=int, help="click samplings per object")
    parser.add_argument("--flip-variants", dest="flip_variants", action="store_true",
                        default=None, help="mirror every odd variant left-right")
    parser.add_argument("--click-encoding", dest="click_encoding",
                        choices=["distance", "disks", "both"],
                        help="how clicks reach the model: distance maps (Xu et al. 2016), "
                        "binary disks (RITM), or both")
    parser.add_argument("--disk-radius", type=float, dest="disk_radius",
                        help="radius of the click disks in pixels")
  parser.add_argument("--seed", type=int, help="seed of the click sampling")
  parser.add_argument("--eval-percent", type=int, dest="eval_percent",
                      help="share of images in the eval split (by a hash of the image id)")
  parser.add_argument("--target-shard-mb", type=float, dest="target_shard_mb",
                      help="size each record file aims at, in MB; the number of files follows "
                      "from the data")
  parser.add_argument("--compression", choices=["", "gzip"],
                      help="record compression (README: 'Record layout, measured')")
  parser.add_argument("--max-pixels", type=int, dest="max_pixels",
                      help="reject images declaring more pixels (decompression bombs)")
  parser.add_argument("--max-error-fraction", type=float, dest="max_error_fraction",
                      help="exit 1 when more than this fraction of inputs fails")
  parser.add_argument("--ops", help="extra op chain applied after the built-in ones")
  parser.add_argument("--ops-module", dest="ops_module",
                      help="module (or comma-separated modules) to import first; it registers "
                      "user ops")
  parser.add_argument("--preprocessing-fn", dest="preprocessing_fn", metavar="MODULE:FUNCTION",
                      help="a tf.Transform preprocessing_fn to use instead of the one generated "
                      "from the declared features")
  parser.add_argument("--overwrite", action="store_true", default=None,
                      help="replace a non-empty output directory")
  parser.add_argument("--progress-seconds", type=float, dest="progress_seconds",
                      help="a progress line every N seconds while the job runs (0: none)")
  parser.add_argument("--wait", action=argparse.BooleanOptionalAction, default=True,
                      help="Dataflow: wait for the job and print its summary, or return once "
                      "it is submitted (--no-wait)")
  parser.add_argument("--verbose", action="store_true", help="show library logs")
  show_defaults(parser, _defaults())
  return parser


def _defaults():
  """The config's defaults, by option dest (what `--help` shows)."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  from beam_prep.config import ClickConfig, PrepConfig  # pylint: disable=g-import-not-at-top
  out = {f.name: f.default for f in dataclasses.fields(PrepConfig)
         if f.default is not dataclasses.MISSING and f.name not in ("input", "output")}
  clicks = ClickConfig()
  out.update(flip_variants=clicks.flip, disk_radius=clicks.disk_radius, wait=True, verbose=False)
  return out


def build_config(args: argparse.Namespace, task: str = "segmentation"):
  """Defaults, then preset, then config file, then flags; validated."""
  from beam_prep.config import PrepConfig  # pylint: disable=g-import-not-at-top
  fields = preset(args.preset, "prep")
  if args.config:
    fields.update(load_config_file(args.config))
  fields["task"] = task
  for name in ("input", "output", "layout", "allow_outside_root", "image_root", "image_size",
               "variants",
               "seed", "eval_percent", "target_shard_mb", "compression", "click_encoding",
               "max_pixels", "max_error_fraction", "ops", "ops_module", "preprocessing_fn",
               "overwrite", "progress_seconds"):
    value = getattr(args, name, None)
    if value is not None:
      fields[name] = value
  for flag, field in (("flip_variants", "flip"), ("disk_radius", "disk_radius")):
    if getattr(args, flag, None) is not None:
      clicks = dict(fields.get("clicks") or {})
      clicks[field] = getattr(args, flag)
      fields["clicks"] = clicks
  missing = [n for n in ("input", "output") if not fields.get(n)]
  if missing:
    raise ValueError(f"missing required option(s): {', '.join('--' + m for m in missing)}")
  return PrepConfig.from_dict(fields)


def pipeline_args(beam_args: List[str], input_root: str = "") -> List[str]:
  """Beam options with this tool's DirectRunner defaults filled in."""
  from pipelines.dataflow import runner_of  # pylint: disable=g-import-not-at-top
  args = list(beam_args)
  if runner_of(beam_args) in ("", "DirectRunner", "direct"):
    given = [a for a in args if a.startswith("--direct_")]
    for default in ([] if given else direct_defaults(input_root)):
      flag = default.split("=")[0]
      if not any(a == flag or a.startswith(flag + "=") for a in args):
        args.append(default)
  return args


def _prep(task: str, argv: List[str]) -> int:
  parser = prep_parser(task)
  known, beam_args = parser.parse_known_args(argv)
  logs.quiet(known.verbose)
  log = logs.get()
  try:
    # Beam drops options it does not know with a log line: a typo here
    # would run a whole job with a default.
    check_unknown(beam_args, option_flags(parser) + beam_option_flags(), f"beam-prep {task}")
    config = build_config(known, task)
    from beam_prep.ops import registry  # pylint: disable=g-import-not-at-top
    registry.import_ops_modules(config.ops_module)
    registry.build_chain(config.chain)  # Names and literal arguments, checked now.
    table = config.features()  # Declarations, checked now.
    from beam_prep import preprocessing  # pylint: disable=g-import-not-at-top
    preprocessing.preprocessing_fn_for(table, config.preprocessing_fn)
  except (ValueError, TypeError, OSError, ImportError) as e:
    log.error("beam-prep %s: %s", task, e)
    return 2
  from apache_beam.options.pipeline_options import PipelineOptions  # pylint: disable=g-import-not-at-top
  from beam_prep.features import FeatureError  # pylint: disable=g-import-not-at-top
  from pipelines import dataflow, outputs, prep  # pylint: disable=g-import-not-at-top
  try:
    if dataflow.is_dataflow(beam_args):
      beam_args = dataflow.check_and_complete(beam_args, config)
    options = PipelineOptions(pipeline_args(beam_args, config.input))
    manifest = prep.run(config, options, wait=known.wait)
  except (outputs.OutputError, prep.InputError, dataflow.DataflowOptionsError) as e:
    log.error("beam-prep %s: %s", task, e)
    return 2
  except prep.JobStillRunning as e:
    log.error("beam-prep %s: %s", task, e)
    return 130
  except FeatureError as e:  # An op's bug: it writes what it did not declare.
    log.error("beam-prep %s: the job stopped: %s", task, str(e).split(" [while running")[0])
    return 2
  if manifest.get("dry_run"):
    log.info("%s: dry run: the job was built and not submitted", task)
    return 0
  if manifest.get("submitted"):
    log.info("%s: not waiting; when the job is done, %s holds manifest.json and %s",
             task, config.output, "_SUCCESS")
    return 0
  log.info("%s: done", task)
  for line in prep.summary_lines(manifest):
    log.info(line)
  fraction = prep.error_fraction(manifest)
  if fraction > config.max_error_fraction:
    log.error("beam-prep %s: %.1f%% of inputs failed, over --max-error-fraction %.1f%% "
              "(everything was written; see the dead letters)",
              task, 100 * fraction, 100 * config.max_error_fraction)
    return 1
  return 0


COMMANDS = {
    "sample-data": _sample_data,
    "segmentation": lambda argv: _prep("segmentation", argv),
    "classification": lambda argv: _prep("classification", argv),
    "preview": _preview,
}


def main(argv: Optional[List[str]] = None) -> None:
  dispatch(__doc__, COMMANDS, argv)
