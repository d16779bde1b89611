"""The demo: every stage of the product on the bundled sample data.

    python -m pipelines.demo [--workdir out/demo] [--count 32] [--verbose]

Runs, as a user would type them, `beam-prep sample-data`, `beam-prep
segmentation` (DirectRunner), `beam-train fit` (which exports the serving
model) and `beam-train predict` on an eval image with the clicks its record
was built from, then prints what was written where and the `beam-train
serve` command that opens the demo's model and eval objects in a browser.
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


def _run(cmd, log):
  log(f"$ {' '.join(shlex.quote(c) for c in cmd)}")
  t = time.time()
  subprocess.run(cmd, check=True)
  return time.time() - t


def _eval_clicks(prep_dir: str):
  """image_id and clicks (in the source image's pixels) of the first eval record."""
  from beam_prep import keys  # pylint: disable=g-import-not-at-top
  from beam_prep.prep_output import PrepOutput  # pylint: disable=g-import-not-at-top
  prep = PrepOutput(prep_dir)
  wanted = [keys.IMAGE_ID, keys.OBJECT_ID, keys.VARIANT, keys.POSITIVE_CLICKS,
            keys.NEGATIVE_CLICKS] + [k for k in (keys.CROP_BOX,) if k in prep.table]
  records = list(prep.read_numpy(keys.EVAL_SPLIT, wanted))
  # The same record every run, whatever shard Beam put it in.
  ex = min(records, key=lambda r: (r[keys.IMAGE_ID], int(r[keys.OBJECT_ID]),
                                   int(r[keys.VARIANT])))
  return ex, prep.table.image_size[0]


def _to_source(ex, clicks, size, width, height):
  """A record's clicks -> the source image's pixels, through its crop box, or
  (whole-image records) the resize."""
  from beam_prep import keys  # pylint: disable=g-import-not-at-top
  from beam_prep.ops import crop  # pylint: disable=g-import-not-at-top
  if keys.CROP_BOX in ex:
    return crop.clicks_to_source(clicks, ex[keys.CROP_BOX], size)
  scale = max(width, height) / size  # The long side filled the frame.
  return np.floor((clicks + 0.5) * scale).astype(int)


def _predict(beam_train: str, data: str, prep: str, model: str, pred: str, run):
  """`beam-train predict` on an eval object with its record's clicks, moved to
  the source image -> (what was predicted, for the summary, and its seconds)."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  from beam_prep import keys  # pylint: disable=g-import-not-at-top
  from beam_prep.layouts.folders import IMAGES_DIR, MASK_SUFFIX, MASKS_DIR  # pylint: disable=g-import-not-at-top
  from beam_prep.ops.image import object_label  # pylint: disable=g-import-not-at-top
  from train.clicker import iou as mask_iou  # pylint: disable=g-import-not-at-top
  ex, size = _eval_clicks(prep)
  image_id, object_id = ex[keys.IMAGE_ID], int(ex[keys.OBJECT_ID])
  image_path = sorted(glob.glob(os.path.join(data, IMAGES_DIR, image_id + ".*")))[0]
  width, height = Image.open(image_path).size
  pos, neg = (_to_source(ex, ex[k], size, width, height)
              for k in (keys.POSITIVE_CLICKS, keys.NEGATIVE_CLICKS))
  cmd = [beam_train, "predict", "--model", model, "--image", image_path, "--output", pred]
  cmd += [f"--positive={x},{y}" for x, y in pos] + [f"--negative={x},{y}" for x, y in neg]
  seconds = run(cmd)
  truth = np.asarray(Image.open(os.path.join(data, MASKS_DIR, image_id + MASK_SUFFIX)))
  got = np.asarray(Image.open(pred)) > 0
  label = object_label(truth, object_id)
  iou = float(mask_iou(got[None], (label == 1)[None], (label != keys.IGNORE)[None])[0])
  return {"image_id": image_id, "object_id": object_id, "positive": len(pos),
          "negative": len(neg), "iou": iou}, seconds


def _summary(data: str, prep: str, model: str, pred: str, predicted, times, log) -> None:
  from beam_prep import keys  # pylint: disable=g-import-not-at-top
  manifest = json.load(open(os.path.join(prep, keys.MANIFEST_FILE)))
  metrics = json.load(open(os.path.join(model, keys.METRICS_FILE)))
  c = manifest["counts"]
  log("")
  log("demo summary")
  log(f"  sample data  {data}: {c['inputs_read']} images, {c['objects_found']} objects")
  log(f"  records      {prep}/records: train {c['examples_written']['train']}, "
      f"eval {c['examples_written']['eval']} examples "
      f"({manifest['config']['variants']} click variants per object, in one record per "
      f"object); "
      f"{c['errors_total']} dead letters in {prep}/errors")
  log(f"  transform    {prep}/transform (tf.Transform: per-channel mean/std)")
  log(f"  preview      {prep}/{keys.PREVIEW_FILE} (what the records hold)")
  from train.noc import NOC_FILE  # pylint: disable=g-import-not-at-top
  from train.tasks import task_class  # pylint: disable=g-import-not-at-top
  ev = metrics["eval"]
  log(f"  model        {model}: {metrics['final_step']} steps, "
      f"{metrics['examples_per_second'] or 0:.1f} examples/s, "
      f"input wait {100 * (metrics['input_wait_fraction'] or 0):.0f}%, eval "
      + (task_class(metrics["task"]).eval_line(ev) if ev.get("examples") else "skipped"))
  source = json.load(open(os.path.join(model, SOURCE_EVAL, NOC_FILE)))
  log(_clicks_line("clicks", source["model"], source["baseline"], len(source["objects"]),
                   source["model"]["max_clicks"], f"{model}/{SOURCE_EVAL}/ (each eval image at "
                   "its own size, through the serving graph: the field's protocol)"))
  if "noc" in metrics:
    n = metrics["noc"]
    log(_clicks_line("  on records", n["model"], n["baseline"], n["objects"], n["max_clicks"],
                     f"{model}/{keys.EVAL_DIR}/ (the eval records, at the records' size)"))
  log(f"  export       {metrics['export_dir']}")
  p = predicted
  log(f"  prediction   {pred} (+ _overlay.png): {p['image_id']} object {p['object_id']}, "
      f"{p['positive']} positive + {p['negative']} negative clicks, IoU with the true mask "
      f"{p['iou']:.3f}")
  log("  time         " + ", ".join(f"{k} {v:.0f} s" for k, v in times.items()))
  log("")
  log("click and see (the page at http://127.0.0.1:8501/, TF Serving's REST API beside it):")
  log(f"  {serve_command(model, prep)}")


def _clicks_line(what: str, m, b, objects: int, max_clicks: int, where: str) -> str:
  """NoC of the model vs the baseline's at each threshold of the protocol."""
  from beam_prep import keys  # pylint: disable=g-import-not-at-top
  from train.noc import noc_key, threshold_name  # pylint: disable=g-import-not-at-top
  said = []
  for t in keys.NOC_IOU_THRESHOLDS:
    k = noc_key(t)
    fewer = 100 * (1 - m[k] / b[k]) if b[k] else float("nan")
    said.append(f"NoC@{threshold_name(t)} {m[k]:.2f} vs {b[k]:.2f} ({fewer:.0f}% fewer clicks)")
  return (f"  {what:<12} {'; '.join(said)}, the model vs the nearest-click baseline; "
          f"{objects} objects, up to {max_clicks} clicks -> {where}")


def serve_command(model: str, prep: str) -> str:
  """The `beam-train serve` command for the demo's model, its eval objects on the page."""
  beam_train = os.path.join(os.path.dirname(sys.executable), "beam-train")
  return " ".join(shlex.quote(c) for c in [beam_train, "serve", "--model", model,
                                           "--data", prep])


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
  times["sample data"] = run([beam_prep, "sample-data", "--output", data,
                             "--count", str(args.count)])
  times["preprocess"] = run([beam_prep, "segmentation", "--input", data, "--output", prep,
                            "--preset", "demo", "--overwrite"])
  times["train+export"] = run([beam_train, "fit", "--data", prep, "--model-dir", model,
                              "--preset", "demo"])
  times["evaluate"] = run([beam_train, "evaluate", "--data", prep, "--model", model,
                          "--output", os.path.join(model, SOURCE_EVAL)])
  predicted, times["predict"] = _predict(beam_train, data, prep, model, pred, run)
  times["total"] = time.time() - total
  _summary(data, prep, model, pred, predicted, times, log)


if __name__ == "__main__":
  main()
