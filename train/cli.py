"""`beam-train`: train on beam_prep records, and predict with the export.

beam-train fit --data PREP_OUTPUT --model-dir DIR [--preset smoke]
               [--config FILE] [--steps N] [--batch-size B] ...
beam-train predict --model DIR|FILE.tflite|FILE.onnx --image FILE --positive X,Y [...]
                   [--negative X,Y ...] --output MASK.png
beam-train evaluate --model DIR [--data PREP_OUTPUT] [--max-clicks 20] [--iou 0.85,0.90]
beam-train export --data PREP_OUTPUT (--model-file MODEL.keras | --model-dir DIR)
                  [--output EXPORT_DIR] [--model-module M] [--format savedmodel|tflite|onnx|all]
beam-train serve --model MODEL_DIR|EXPORT_DIR [--model-name NAME] [--host 127.0.0.1]
                 [--port 8501] [--images DIR] [--data PREP_OUTPUT] [--save-dir DIR]
                 [--engine-every N]
beam-train engine --labels DIR --model MODEL_DIR [--steps N] [--max-minutes M]
"""

import argparse
import importlib.util
import json
import os
from typing import List, Optional

from beam_prep import kit
from beam_prep.console import (
  Interrupted,
  Refused,
  check_unknown,
  command,
  dispatch,
  failing,
  option_flags,
  refusing,
)
from train import logs, model_layout
from train.config import EvalConfig, ExportConfig, PredictConfig, TrainConfig
from train.serve.config import ServeConfig


def fit_parser() -> argparse.ArgumentParser:
  """`beam-train fit`'s options: one per `TrainConfig` option field (`beam_prep.kit`)."""
  p = argparse.ArgumentParser(prog="beam-train fit", description="Train on beam_prep records.")
  kit.add_options(p, TrainConfig)
  for options in _task_options():
    kit.add_options(p, options)
  p.add_argument(
    "--model-args",
    dest="model_args_json",
    metavar="JSON",
    help="keyword arguments of the model factory, a JSON object",
  )
  p.add_argument(
    "--profile-steps",
    dest="profile_steps_text",
    metavar="A,B",
    help="record a profiler trace of global steps A..B",
  )
  p.add_argument("--config", help="JSON file of TrainConfig fields")
  p.add_argument("--preset", help=kit.preset_help(TrainConfig))
  p.add_argument("--verbose", action="store_true", help="show library logs")
  return p


def build_config(args: argparse.Namespace):
  """Defaults, then preset, then config file, then flags; validated."""
  extra = {}
  if args.model_args_json:
    try:
      extra["model_args"] = json.loads(args.model_args_json)
    except json.JSONDecodeError as e:
      raise ValueError(f"--model-args is not JSON: {e}") from None
  if args.profile_steps_text:
    try:
      extra["profile_steps"] = tuple(int(v) for v in args.profile_steps_text.split(","))
    except ValueError:
      raise ValueError(
        f"--profile-steps takes A,B (two step numbers), got {args.profile_steps_text!r}"
      ) from None
  return kit.resolve(TrainConfig, args, extra=extra, more=_task_options())


def _task_options():
  """The tasks' own `fit` options (importing their training sides imports TensorFlow)."""
  from train import tasks  # pylint: disable=g-import-not-at-top

  return tasks.option_classes()


def missing_train_packages() -> List[str]:
  """Packages of the `train` extra (as setup.py declares it) that are not installed."""
  import importlib.metadata as md  # pylint: disable=g-import-not-at-top
  from packaging.requirements import Requirement  # pylint: disable=g-import-not-at-top

  try:
    requires = md.requires("beam-prep") or []
  except md.PackageNotFoundError:
    return []  # Run from a source tree that is not installed: nothing to check against.
  missing = []
  for text in requires:
    req = Requirement(text)
    if (
      req.marker is not None
      and req.marker.evaluate({"extra": "train"})
      and not req.marker.evaluate({"extra": ""})
    ):
      try:
        md.distribution(req.name)
      except md.PackageNotFoundError:
        missing.append(req.name)
  return missing


def _fit(argv: List[str], log) -> int:
  parser = fit_parser()
  args, rest = parser.parse_known_args(argv)
  with refusing(ValueError, TypeError, OSError, json.JSONDecodeError):
    check_unknown(rest, option_flags(parser), "beam-train fit", strict=True)
    config = build_config(args)
  missing = missing_train_packages()
  if missing:
    raise Refused(
      f"{', '.join(missing)} not installed; the trainer needs the train extra: "
      "pip install 'beam-prep[train]'"
    )
  from train.fit import loop  # pylint: disable=g-import-not-at-top

  log.info(
    "train: %s, %d steps, batch %d per replica -> %s",
    config.data,
    config.steps,
    config.batch_size,
    config.model_dir,
  )
  from beam_prep.prep_output import RecordsError  # pylint: disable=g-import-not-at-top
  from train.fit.train_step import RetraceError  # pylint: disable=g-import-not-at-top

  try:
    with failing(RecordsError, RetraceError, FloatingPointError):
      m = loop.fit(config)
  except KeyboardInterrupt:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    saved = tf.train.latest_checkpoint(os.path.join(config.model_dir, model_layout.CHECKPOINTS_DIR))
    raise Interrupted(
      "interrupted; checkpoint saved, rerun the same command to resume"
      if saved
      else "interrupted before the first checkpoint: nothing to resume"
    ) from None
  log.info(
    "train: done at step %d, loss %.4f, %.1f examples/s, input wait %.0f%%, "
    "%d replica(s), step traced %d time(s)",
    m["final_step"],
    m["final_loss"],
    m["examples_per_second"] or 0,
    100 * (m["input_wait_fraction"] or 0),
    m["replicas"],
    m["step_traces"],
  )
  from train.tasks import task_class  # pylint: disable=g-import-not-at-top

  for line in task_class(m["task"]).summary_lines(m, config.model_dir):
    log.info("eval: %s", line)
  if "export_dir" in m:
    log.info("export: %s", m["export_dir"])
  return 0


EVALUATE = (
  "NoC evaluation: simulated clicks until the mask reaches each IoU threshold, for a "
  "trained segmentation model (through its serving graph) and the nearest-click "
  "baseline, on the eval images at their own size (docs/evaluation.md: 'Evaluation: "
  "clicks to a good mask')."
)
PREDICT = (
  "Predict a mask from an image and clicks (or, with a classification model, the image's class)."
)
EXPORT = (
  "Write the serving SavedModel (raw image and clicks in, preprocessing in the graph) "
  "for a model trained outside `beam-train fit`, or again for a fit run."
)
SERVE = (
  "Serve the exported model with TensorFlow Serving's REST API, and a page to segment by "
  "clicking (docs/serving.md: 'Click and see')."
)


def _evaluate(argv: List[str], log) -> int:
  config = kit.parse_command("beam-train evaluate", EVALUATE, EvalConfig, argv)
  from beam_prep.prep_output import RecordsError  # pylint: disable=g-import-not-at-top
  from train.evaluate import command  # pylint: disable=g-import-not-at-top

  with failing(RecordsError, KeyError):
    report, out = command.run(config, log)
  for line in command.said(report, out):
    log.info("evaluate: %s", line)
  return 0


def _predict(argv: List[str], log) -> int:
  config = kit.parse_command("beam-train predict", PREDICT, PredictConfig, argv)
  from train.export import predict  # pylint: disable=g-import-not-at-top
  from train.export import signatures as sig  # pylint: disable=g-import-not-at-top
  from train.export.portable_model import open_model  # pylint: disable=g-import-not-at-top

  # A model, an image or clicks that cannot be used: nothing was predicted.
  with refusing():
    request = predict.read_request(config)  # Before the model: said at once.
    model = open_model(config.model)
    if model.classifies:
      for line in predict.class_lines(predict.classify(model, config.image)):
        log.info("predict: %s", line)
      return 0
    image, positive, negative = predict.segment_inputs(config, model, request, log)
    result = model.segment(image, positive, negative)
  mask_path, overlay_path = predict.write_outputs(config.output, image, result, positive, negative)
  log.info(
    "predict: %d of %d pixels in the mask -> %s (overlay %s)",
    int(result[sig.MASK].sum()),
    result[sig.MASK].size,
    mask_path,
    overlay_path,
  )
  return 0


def _export(argv: List[str], log) -> int:
  config = kit.parse_command("beam-train export", EXPORT, ExportConfig, argv)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from train.export import saved_model, portable  # pylint: disable=g-import-not-at-top

  with refusing(ValueError):
    formats = portable.parse_formats(config.format)
  path = saved_model.export_trained(
    config.data,
    config.export_base,
    config.model_file,
    config.model_dir,
    config.model_module,
    formats,
  )
  log.info("export: %s", path)
  for suffix in (portable.SUFFIXES[f] for f in formats if f in portable.SUFFIXES):
    for name in sorted(tf.io.gfile.glob(os.path.join(path, "*" + suffix))):
      log.info("export: %s (%d kB)", name, tf.io.gfile.stat(name).length // 1024)
  return 0


def _serve(argv: List[str], log) -> int:
  p = kit.command_parser("beam-train serve", SERVE, ServeConfig)
  missing = [m for m in ("flask", "waitress") if importlib.util.find_spec(m) is None]
  if missing:
    raise Refused(f"{', '.join(missing)} not installed: pip install 'beam-prep[train]'")
  from train.serve import app  # pylint: disable=g-import-not-at-top

  with refusing(ValueError, FileNotFoundError, OSError):
    server, _ = app.start(kit.resolve_argv(p, ServeConfig, argv), log)
  try:
    server.serve_forever()
  except KeyboardInterrupt:
    log.info("serve: stopped")
  return 0


ENGINE = (
  "One round of the data engine: the labels saved under --labels (beam-train serve "
  "--save-dir) fine-tune the served model, and the export is published under "
  "MODEL/export/, where beam-train serve picks it up (docs/serving.md: 'The data "
  "engine')."
)


def _engine(argv: List[str], log) -> int:
  from train import engine  # pylint: disable=g-import-not-at-top

  config = kit.parse_command("beam-train engine", ENGINE, engine.EngineConfig, argv)
  with refusing(ValueError):
    engine.check_inputs(config)
  with failing(RuntimeError):
    engine.run_round(config, log)
  return 0


COMMANDS = {
  name: command(f"beam-train {name}", logs.quiet, body)
  for name, body in (
    ("fit", _fit),
    ("evaluate", _evaluate),
    ("predict", _predict),
    ("export", _export),
    ("serve", _serve),
    ("engine", _engine),
  )
}


def main(argv: Optional[List[str]] = None) -> None:
  dispatch(__doc__, COMMANDS, argv)
