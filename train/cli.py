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
from beam_prep.console import check_unknown, dispatch, option_flags
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


def _fit(argv: List[str]) -> int:
  log = logs.quiet("--verbose" in argv)  # Before the parser imports the tasks (TensorFlow).
  parser = fit_parser()
  args, rest = parser.parse_known_args(argv)
  try:
    check_unknown(rest, option_flags(parser), "beam-train fit", strict=True)
    config = build_config(args)
  except (ValueError, TypeError, OSError, json.JSONDecodeError) as e:
    log.error("beam-train fit: %s", e)
    return 2
  missing = missing_train_packages()
  if missing:
    log.error(
      "beam-train fit: %s not installed; the trainer needs the train extra: "
      "pip install 'beam-prep[train]'",
      ", ".join(missing),
    )
    return 2
  from beam_prep.prep_output import RecordsError  # pylint: disable=g-import-not-at-top
  from train import loop, train_step  # pylint: disable=g-import-not-at-top

  log.info(
    "train: %s, %d steps, batch %d per replica -> %s",
    config.data,
    config.steps,
    config.batch_size,
    config.model_dir,
  )
  try:
    m = loop.fit(config)
  except KeyboardInterrupt:
    log.error("beam-train fit: interrupted; checkpoint saved, rerun the same command to resume")
    return 130
  except (
    FileNotFoundError,
    ImportError,
    ValueError,
    RecordsError,
    train_step.RetraceError,
    FloatingPointError,
  ) as e:
    log.error("beam-train fit: %s", e)
    return 1
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


def _evaluate(argv: List[str]) -> int:
  log = logs.quiet("--verbose" in argv)
  config = kit.parse_command("beam-train evaluate", EVALUATE, EvalConfig, argv, log)
  if config is None:
    return 2
  from train import noc  # pylint: disable=g-import-not-at-top
  from train.tasks import task_class  # pylint: disable=g-import-not-at-top
  from beam_prep.prep_output import PrepOutput, RecordsError  # pylint: disable=g-import-not-at-top
  from beam_prep import source_records  # pylint: disable=g-import-not-at-top

  try:
    # The data a model dir recorded is found from any folder (PrepOutput.of_model).
    prep = PrepOutput(config.data) if config.data else PrepOutput.of_model(config.model)
    if "noc" not in task_class(prep.table.task).evaluators:
      raise ValueError(f"NoC is no evaluation of task {prep.table.task!r} ({prep.path})")
    source = config.resolution == "source" or (
      config.resolution == "auto"
      and prep.has_records(source_records.SPLIT)
      and (not config.model or _has_export(config.model))
    )
    run = _evaluate_source if source else _evaluate_records
    report, out = run(config, prep, log)
  except (ValueError, FileNotFoundError, ImportError, OSError, KeyError, RecordsError) as e:
    log.error("beam-train evaluate: %s", e)
    return 1
  for line in noc.lines(noc.brief(report)):
    log.info("evaluate: %s", line)
  curve = report.get("model", report["baseline"])["mean_iou_by_clicks"]
  log.info("evaluate: mean IoU by clicks %s", ", ".join(f"{k}: {v:.3f}" for k, v in curve.items()))
  log.info("evaluate: report -> %s", out)
  return 0


def _has_export(model: str) -> bool:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from train.export import latest_export  # pylint: disable=g-import-not-at-top

  try:
    latest_export(model)
  except (FileNotFoundError, tf.errors.OpError):
    return False
  return True


def _evaluate_source(config, prep, log):
  """NoC on the eval images at their own size (`train.source_eval`)."""
  from train import source_eval  # pylint: disable=g-import-not-at-top

  out = config.output or os.path.join(config.model, model_layout.EVAL_DIR)
  log.info(
    "evaluate: %s on every object of the eval images of %s at their own size, up to %d clicks",
    config.model or "the nearest-click baseline",
    prep.path,
    config.max_clicks,
  )
  report = source_eval.evaluate(
    prep,
    out,
    config.model,
    config.max_clicks,
    config.thresholds,
    config.pred_thr,
    config.max_objects,
    config.min_area,
    config.flip,
  )
  if report["skipped_objects"]:
    log.info(
      "evaluate: %d object(s) under --min-area %d pixels left out (noc.json's skipped_objects)",
      len(report["skipped_objects"]),
      config.min_area,
    )
  return report, out


def _evaluate_records(config, prep, log):
  """NoC on the eval records (`train.noc`), with the model dir's Keras model."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from train import models, noc  # pylint: disable=g-import-not-at-top
  from beam_prep.prep_output import PrepOutput  # pylint: disable=g-import-not-at-top

  if prep.manifest.get("eval_only"):
    raise ValueError(
      f"{prep.path} is an evaluation-only output: it is evaluated at the images' "
      f"own size through the model's export, and {config.model} has none "
      "(beam-train export --model-dir MODEL_DIR writes one)"
    )
  model = models.rebuild(config.model)
  ckpt = tf.train.latest_checkpoint(os.path.join(config.model, model_layout.CHECKPOINTS_DIR)) or ""
  step = int(ckpt.rsplit("-", 1)[1]) if "-" in os.path.basename(ckpt) else 0
  out = config.output or os.path.join(config.model, model_layout.EVAL_DIR)
  log.info(
    "evaluate: %s on the eval objects of %s at the records' size, up to %d clicks",
    config.model,
    prep.path,
    config.max_clicks,
  )
  return noc.evaluate(
    model,
    prep,
    out,
    config.max_clicks,
    config.thresholds,
    config.batch_size,
    config.max_objects,
    summary_dir=os.path.join(config.model, model_layout.TENSORBOARD_DIR, model_layout.EVAL_DIR),
    step=step,
    pred_thr=config.pred_thr,
    trained_on=PrepOutput.of_model(config.model),
  ), out


def _predict(argv: List[str]) -> int:
  log = logs.quiet("--verbose" in argv)
  config = kit.parse_command("beam-train predict", PREDICT, PredictConfig, argv, log)
  if config is None:
    return 2
  from train import predict  # pylint: disable=g-import-not-at-top
  from train import signatures as sig  # pylint: disable=g-import-not-at-top
  from train.portable_model import open_model  # pylint: disable=g-import-not-at-top

  try:
    model = open_model(config.model)
    if model.classifies:
      out = predict.classify(model, config.image)
      probs = out[sig.PROBABILITIES][0]
      ranked = sorted(zip(out[sig.CLASSES].tolist(), probs.tolist()), key=lambda t: -t[1])
      log.info(
        "predict: %s (%s)",
        out[sig.LABEL][0].decode(),
        ", ".join(f"{c.decode()} {v:.3f}" for c, v in ranked[:5]),
      )
      return 0
    image, positive, negative = _predict_inputs(config, model, log)
    result = model.segment(image, positive, negative)
  except (ValueError, FileNotFoundError, OSError) as e:
    log.error("beam-train predict: %s", e)
    return 2
  mask_path, overlay_path = predict.write_outputs(config.output, image, result, positive, negative)
  log.info(
    "predict: %d of %d pixels in the mask -> %s (overlay %s)",
    int(result[sig.MASK].sum()),
    result[sig.MASK].size,
    mask_path,
    overlay_path,
  )
  return 0


def _predict_inputs(config, model, log):
  """(image, positive, negative clicks clamped into it) of a segmentation request."""
  from train import predict  # pylint: disable=g-import-not-at-top

  model.require_segmentation()
  if not config.output:
    raise ValueError("--output MASK.png is required for a segmentation model")
  positive = [predict.parse_point(s) for s in config.positive]
  negative = [predict.parse_point(s) for s in config.negative]
  if not positive:
    raise ValueError("at least one --positive X,Y click on the object is required")
  image = predict.load_image(config.image)
  h, w = image.shape[:2]
  positive, moved_p = predict.clamp(positive, w, h)
  negative, moved_n = predict.clamp(negative, w, h)
  if moved_p or moved_n:
    log.info(
      "predict: clicks outside the %dx%d image clamped to its border: %s",
      w,
      h,
      ", ".join(f"{x},{y}" for x, y in moved_p + moved_n),
    )
  return image, positive, negative


def _export(argv: List[str]) -> int:
  log = logs.quiet("--verbose" in argv)
  config = kit.parse_command("beam-train export", EXPORT, ExportConfig, argv, log)
  if config is None:
    return 2
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from train import export, portable  # pylint: disable=g-import-not-at-top

  try:
    formats = portable.parse_formats(config.format)
    path = export.export_trained(
      config.data,
      config.export_base,
      config.model_file,
      config.model_dir,
      config.model_module,
      formats,
    )
  except (ValueError, FileNotFoundError, ImportError, OSError) as e:
    log.error("beam-train export: %s", e)
    return 1
  log.info("export: %s", path)
  for suffix in (portable.SUFFIXES[f] for f in formats if f in portable.SUFFIXES):
    for name in sorted(tf.io.gfile.glob(os.path.join(path, "*" + suffix))):
      log.info("export: %s (%d kB)", name, tf.io.gfile.stat(name).length // 1024)
  return 0


def _serve(argv: List[str]) -> int:
  p = kit.command_parser("beam-train serve", SERVE, ServeConfig)
  log = logs.quiet("--verbose" in argv)
  missing = [m for m in ("flask", "waitress") if importlib.util.find_spec(m) is None]
  if missing:
    log.error(
      "beam-train serve: %s not installed: pip install 'beam-prep[train]'", ", ".join(missing)
    )
    return 2
  from train.serve import app  # pylint: disable=g-import-not-at-top

  try:
    server, _ = app.start(kit.resolve_argv(p, ServeConfig, argv), log)
  except (ValueError, FileNotFoundError, OSError) as e:
    log.error("beam-train serve: %s", e)
    return 2
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


def _engine(argv: List[str]) -> int:
  log = logs.quiet("--verbose" in argv)
  from train import engine  # pylint: disable=g-import-not-at-top

  config = kit.parse_command("beam-train engine", ENGINE, engine.EngineConfig, argv, log)
  if config is None:
    return 2
  try:
    engine.run_round(config, log)
  except (RuntimeError, FileNotFoundError, ValueError, OSError) as e:
    log.error("beam-train engine: %s", e)
    return 1
  return 0


COMMANDS = {
  "fit": _fit,
  "evaluate": _evaluate,
  "predict": _predict,
  "export": _export,
  "serve": _serve,
  "engine": _engine,
}


def main(argv: Optional[List[str]] = None) -> None:
  dispatch(__doc__, COMMANDS, argv)
