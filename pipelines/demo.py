"""The demo: every stage of the product on the bundled sample data.

    python -m pipelines.demo [--workdir out/demo] [--count 32] [--verbose]

Runs, as a user would type them, `beam-prep sample-data`, `beam-prep
segmentation` (DirectRunner), `beam-train fit` (which exports the serving
model), `beam-train evaluate` and `beam-train predict` on the eval images'
largest object with the protocol's first click; then a round of the data
engine: a simulated annotator labels half of the eval scenes' objects
through the served model's page endpoints, `beam-train engine` fine-tunes
the model on those labels, and the other half is labelled before and after
the round.
It prints what was written where and the `beam-train serve` command that
opens the demo's model and eval objects in a browser.
Library logs (TensorFlow's start-up lines among them) are hidden, as in each
command, unless --verbose is given (it is passed on to every command).
"""

import argparse
import glob
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

import numpy as np


SOURCE_EVAL = "eval_source"
# The demo's data engine round: a short fine-tuning on the labels saved (11
# objects, the model's own masks). With the guided filter served, the
# held-out objects took 0.4 and 0.9 more clicks each after 60 steps, 3.8
# more after 150 (2026-11-27, one demo model per run).
ENGINE_STEPS = 60


def _run(cmd, log):
  log(f"$ {' '.join(shlex.quote(c) for c in cmd)}")
  t = time.time()
  subprocess.run(cmd, check=True)
  return time.time() - t


def _eval_objects(prep_dir: str):
  """The eval images' objects at their own size (`simulate.source_objects`),
  read once for the prediction and the data engine round."""
  from train.evaluate import simulate  # pylint: disable=g-import-not-at-top

  return simulate.source_objects(prep_dir)


def _largest(objects):
  """The largest of the eval images' objects (`simulate.source_objects`; the
  first in id order among equals): the kind one click is for; smaller ones
  take more clicks, as the NoC figures say."""
  return max(objects, key=lambda o: int((o["label"] == 1).sum()))  # The first of equals.


def _predict(beam_train: str, data: str, objects, model: str, pred: str, run):
  """`beam-train predict` on the largest eval object with the protocol's
  first click (its innermost pixel, `train.evaluate.clicker`) -> (what was
  predicted, for the summary, and its seconds)."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  from beam_prep import keys  # pylint: disable=g-import-not-at-top
  from beam_prep.layouts.folders import IMAGES_DIR  # pylint: disable=g-import-not-at-top
  from train.evaluate import clicker  # pylint: disable=g-import-not-at-top

  chosen = _largest(objects)
  image_id, label = chosen["image_id"], chosen["label"]
  image_path = sorted(glob.glob(os.path.join(data, IMAGES_DIR, image_id + ".*")))[0]
  (x, y), _ = clicker.next_click_of(np.zeros(label.shape, bool), label, [], [])
  cmd = [
    beam_train,
    "predict",
    "--model",
    model,
    "--image",
    image_path,
    "--output",
    pred,
    f"--positive={x},{y}",
  ]
  seconds = run(cmd)
  got = np.asarray(Image.open(pred)) > 0
  iou = float(clicker.iou(got[None], (label == 1)[None], (label != keys.IGNORE)[None])[0])
  predicted = {"image_id": image_id, "object_id": chosen["object_id"], "click": (x, y)}
  return dict(predicted, iou=iou), seconds


def _engine_round(beam_train: str, wd: str, objects, model: str, run, steps: int):
  """The data engine on the eval scenes: a simulated annotator labels the
  first half of their objects through the served model (the labels saved);
  `beam-train engine` fine-tunes it on them; the other half is labelled
  before and after the round, nothing saved -> (the figures, its seconds)."""
  from train.evaluate import simulate  # pylint: disable=g-import-not-at-top
  from train.serve import app as serve_app  # pylint: disable=g-import-not-at-top
  from train.serve.config import ServeConfig  # pylint: disable=g-import-not-at-top

  labels = os.path.join(wd, "labels")
  shutil.rmtree(labels, ignore_errors=True)
  images = sorted({o["image_id"] for o in objects})
  half = set(images[: len(images) // 2])
  labelled = [o for o in objects if o["image_id"] in half]
  held = [o for o in objects if o["image_id"] not in half]
  t = time.time()
  config = ServeConfig(model=model, port=0, save_dir=labels, poll_seconds=0.5)
  with serve_app.running(config) as (server, versions):
    url = f"http://127.0.0.1:{server.port}"
    before = simulate.label_batch(simulate.Annotator(url, save=False), held)
    saved = simulate.label_batch(simulate.Annotator(url, save=True), labelled)
    version = versions.current.version
    run(
      [
        beam_train,
        "engine",
        "--labels",
        labels,
        "--model",
        model,
        "--steps",
        str(steps),
        "--max-minutes",
        "0",
      ]
    )
    while versions.current.version == version and time.time() - t < 600:
      time.sleep(0.2)
    after = simulate.label_batch(simulate.Annotator(url, save=False), held)
  return {
    "labels": labels,
    "labelled": len(saved),
    "held": len(held),
    "steps": steps,
    "saved_clicks": simulate.clicks_per_object(saved),
    "before": simulate.clicks_per_object(before),
    "after": simulate.clicks_per_object(after),
    "version": versions.current.version,
  }, time.time() - t


def _summary(data: str, prep: str, model: str, pred: str, predicted, engine, times, log) -> None:
  from train import model_layout  # pylint: disable=g-import-not-at-top

  metrics = json.load(open(os.path.join(model, model_layout.METRICS_FILE)))
  _summary_records(data, prep, log)
  _summary_model(model, metrics, log)
  _summary_outputs(model, metrics, prep, pred, predicted, engine, times, log)


def _summary_records(data: str, prep: str, log) -> None:
  from beam_prep import keys  # pylint: disable=g-import-not-at-top

  manifest = json.load(open(os.path.join(prep, keys.MANIFEST_FILE)))
  c = manifest["counts"]
  log("")
  log("demo summary")
  log(f"  sample data  {data}: {c['inputs_read']} images, {c['objects_found']} objects")
  log(
    f"  records      {prep}/records: train {c['examples_written']['train']}, "
    f"eval {c['examples_written']['eval']} examples "
    f"({manifest['config']['variants']} click variants per object, in one record per "
    f"object); "
    f"{c['errors_total']} dead letters in {prep}/errors"
  )
  log(f"  transform    {prep}/transform (tf.Transform: per-channel mean/std)")
  log(f"  preview      {prep}/{keys.PREVIEW_FILE} (what the records hold)")


def _summary_model(model: str, metrics, log) -> None:

  from train import model_layout  # pylint: disable=g-import-not-at-top
  from train.evaluate.noc import NOC_FILE  # pylint: disable=g-import-not-at-top
  from train.tasks import task_class  # pylint: disable=g-import-not-at-top

  ev = metrics["eval"]
  log(
    f"  model        {model}: {metrics['final_step']} steps, "
    f"{metrics['examples_per_second'] or 0:.1f} examples/s, "
    f"input wait {100 * (metrics['input_wait_fraction'] or 0):.0f}%, eval "
    + (task_class(metrics["task"]).eval_line(ev) if ev.get("examples") else "skipped")
  )
  source = json.load(open(os.path.join(model, SOURCE_EVAL, NOC_FILE)))
  log(
    _clicks_line(
      "clicks",
      source["model"],
      source["baseline"],
      len(source["objects"]),
      source["model"]["max_clicks"],
      f"{model}/{SOURCE_EVAL}/ (each eval image at "
      "its own size, through the serving graph: the field's protocol)",
    )
  )
  by_clicks = [
    (
      k,
      source["model"]["mean_iou_by_clicks"].get(str(k)),
      source["baseline"]["mean_iou_by_clicks"].get(str(k)),
    )
    for k in (1, 3, 5)
  ]
  log(
    "               mean IoU after "
    + ", ".join(
      f"{k} click{'s' * (k > 1)} {m:.2f} (baseline {b:.2f})"
      for k, m, b in by_clicks
      if m is not None and b is not None
    )
  )
  if "noc" in metrics:
    n = metrics["noc"]
    log(
      _clicks_line(
        "  on records",
        n["model"],
        n["baseline"],
        n["objects"],
        n["max_clicks"],
        f"{model}/{model_layout.EVAL_DIR}/ (the eval records, at the records' size)",
      )
    )


def _summary_outputs(
  model: str, metrics, prep: str, pred: str, predicted, engine, times, log
) -> None:
  log(f"  export       {metrics['export_dir']}")
  p = predicted
  log(
    f"  prediction   {pred} (+ _overlay.png): {p['image_id']} object {p['object_id']} (the "
    f"eval images' largest), one click at {p['click']} (the protocol's first: its innermost "
    f"pixel), IoU with the true mask {p['iou']:.3f}"
  )
  e = engine
  log(
    f"  data engine  {e['labelled']} objects labelled through the page's endpoints "
    f"({e['saved_clicks']:.1f} clicks each, the model's masks saved in {e['labels']}); "
    f"beam-train engine fine-tuned on them ({e['steps']} steps) and version {e['version']} "
    f"was served: {e['held']} other objects took {e['before']:.1f} clicks each before the "
    f"round, {e['after']:.1f} after (to IoU 0.90, at most 20)"
  )
  log("  time         " + ", ".join(f"{k} {v:.0f} s" for k, v in times.items()))
  log("")
  log("click and see (the page at http://127.0.0.1:8501/, TF Serving's REST API beside it):")
  log(f"  {serve_command(model, prep)}")


def _clicks_line(what: str, m, b, objects: int, max_clicks: int, where: str) -> str:
  """NoC of the model vs the baseline's at each threshold of the protocol."""
  from train.evaluate import protocol  # pylint: disable=g-import-not-at-top
  from train.evaluate.noc import noc_key, threshold_name  # pylint: disable=g-import-not-at-top

  said = []
  for t in protocol.NOC_IOU_THRESHOLDS:
    k = noc_key(t)
    fewer = 100 * (1 - m[k] / b[k]) if b[k] else float("nan")
    said.append(f"NoC@{threshold_name(t)} {m[k]:.2f} vs {b[k]:.2f} ({fewer:.0f}% fewer clicks)")
  return (
    f"  {what:<12} {'; '.join(said)}, the model vs the nearest-click baseline; "
    f"{objects} objects, up to {max_clicks} clicks -> {where}"
  )


def serve_command(model: str, prep: str) -> str:
  """The `beam-train serve` command for the demo's model, its eval objects on the page."""
  beam_train = os.path.join(os.path.dirname(sys.executable), "beam-train")
  return " ".join(shlex.quote(c) for c in [beam_train, "serve", "--model", model, "--data", prep])


def main(argv=None):
  from beam_prep.config import SampleDataConfig  # pylint: disable=g-import-not-at-top

  parser = argparse.ArgumentParser(prog="python -m pipelines.demo")
  parser.add_argument("--workdir", default="out/demo", help="where everything is written")
  parser.add_argument("--count", type=int, default=SampleDataConfig.count, help="sample scenes")
  parser.add_argument("--verbose", action="store_true", help="show library logs")
  args = parser.parse_args(argv)
  from pipelines import logs  # pylint: disable=g-import-not-at-top

  logs.quiet(args.verbose)  # Before this process imports TensorFlow (the summary reads records).
  log = lambda s: print(s, flush=True)  # pylint: disable=unnecessary-lambda-assignment
  run = lambda cmd: _run(cmd + ["--verbose"] * args.verbose, log)  # pylint: disable=unnecessary-lambda-assignment
  wd = args.workdir
  data, prep, model = (os.path.join(wd, d) for d in ("data", "prep", "model"))
  pred = os.path.join(wd, "prediction", "mask.png")
  bin_dir = os.path.dirname(sys.executable)
  beam_prep, beam_train = os.path.join(bin_dir, "beam-prep"), os.path.join(bin_dir, "beam-train")
  total = time.time()
  # A fresh model each run: the records are rebuilt, so resuming an older
  # model directory would train on different data.
  for stale in (model, os.path.dirname(pred)):
    shutil.rmtree(stale, ignore_errors=True)
  times = {}
  times["sample data"] = run(
    [beam_prep, "sample-data", "--output", data, "--count", str(args.count)]
  )
  times["preprocess"] = run(
    [
      beam_prep,
      "segmentation",
      "--input",
      data,
      "--output",
      prep,
      "--preset",
      "demo",
      "--overwrite",
    ]
  )
  times["train+export"] = run(
    [beam_train, "fit", "--data", prep, "--model-dir", model, "--preset", "demo"]
  )
  times["evaluate"] = run(
    [
      beam_train,
      "evaluate",
      "--data",
      prep,
      "--model",
      model,
      "--output",
      os.path.join(model, SOURCE_EVAL),
    ]
  )
  objects = _eval_objects(prep)
  predicted, times["predict"] = _predict(beam_train, data, objects, model, pred, run)
  engine, times["data engine"] = _engine_round(beam_train, wd, objects, model, run, ENGINE_STEPS)
  times["total"] = time.time() - total
  _summary(data, prep, model, pred, predicted, engine, times, log)


if __name__ == "__main__":
  main()
