"""`beam-train evaluate`: NoC of a model (or of the nearest-click baseline) on
the eval images at their own size through the model's export
(`train.evaluate.source_eval`), or on the eval records with the model dir's Keras model
(`train.evaluate.noc`), whichever the data and the model allow.
"""

import os
from typing import List

import tensorflow as tf

from beam_prep import source_records
from beam_prep.prep_output import PrepOutput
from train import model_layout, models
from train.evaluate import noc, source_eval
from train.export.saved_model import latest_export
from train.tasks import task_class


def run(config, log):
  """NoC as `config` (an `EvalConfig`) asks -> (report, its folder)."""
  # The data a model dir recorded is found from any folder (PrepOutput.of_model).
  prep = PrepOutput(config.data) if config.data else PrepOutput.of_model(config.model)
  if "noc" not in task_class(prep.table.task).evaluators:
    raise ValueError(f"NoC is no evaluation of task {prep.table.task!r} ({prep.path})")
  source = config.resolution == "source" or (
    config.resolution == "auto"
    and prep.has_records(source_records.SPLIT)
    and (not config.model or _has_export(config.model))
  )
  return (_at_source if source else _on_records)(config, prep, log)


def said(report, out: str) -> List[str]:
  """What `beam-train evaluate` says of a finished evaluation (`run`'s
  report and folder): its NoC lines, the mean IoU by clicks, the report's place."""
  curve = report.get("model", report["baseline"])["mean_iou_by_clicks"]
  return [
    *noc.lines(noc.brief(report)),
    "mean IoU by clicks " + ", ".join(f"{k}: {v:.3f}" for k, v in curve.items()),
    f"report -> {out}",
  ]


def _has_export(model: str) -> bool:
  try:
    latest_export(model)
  except (FileNotFoundError, tf.errors.OpError):
    return False
  return True


def _at_source(config, prep, log):
  """NoC on the eval images at their own size (`train.evaluate.source_eval`)."""
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


def _on_records(config, prep, log):
  """NoC on the eval records (`train.evaluate.noc`), with the model dir's Keras model."""
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
