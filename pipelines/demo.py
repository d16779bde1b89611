"""The demo: every stage of the product on the bundled sample data.

    python -m pipelines.demo [--workdir out/demo]

Runs, as a user would type them, `beam-prep sample-data`, `beam-prep
segmentation` (DirectRunner), `beam-train fit` (which exports the serving
model) and `beam-train predict` on an eval image with the clicks its record
was built from, then prints what was written where and the `beam-train
serve` command that opens the demo's model and eval objects in a browser.
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


def _run(cmd, log):
  log(f"$ {' '.join(shlex.quote(c) for c in cmd)}")
  t = time.time()
  subprocess.run(cmd, check=True)
  return time.time() - t


def _eval_clicks(prep_dir: str):
  """image_id and clicks (in the source image's pixels) of the first eval record."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  from pipelines import logs  # pylint: disable=g-import-not-at-top
  logs.quiet()
  from beam_prep import keys  # pylint: disable=g-import-not-at-top
  from train.prep_output import PrepOutput  # pylint: disable=g-import-not-at-top
  prep = PrepOutput(prep_dir)
  records = list(prep.read_numpy(keys.EVAL_SPLIT, [keys.IMAGE_ID, keys.OBJECT_ID, keys.VARIANT,
                                                   keys.POSITIVE_CLICKS, keys.NEGATIVE_CLICKS]))
  # The same record every run, whatever shard Beam put it in.
  ex = min(records, key=lambda r: (r[keys.IMAGE_ID], int(r[keys.OBJECT_ID]),
                                   int(r[keys.VARIANT])))
  return (ex[keys.IMAGE_ID], int(ex[keys.OBJECT_ID]), prep.table.image_size[0],
          ex[keys.POSITIVE_CLICKS], ex[keys.NEGATIVE_CLICKS])


def _to_source(clicks, size, width, height):
  # Centre of the resized pixel, mapped back to the source image.
  x = np.floor((clicks[:, 0] + 0.5) * width / size)
  y = np.floor((clicks[:, 1] + 0.5) * height / size)
  return np.stack([x, y], axis=1).astype(int)


def _predict(beam_train: str, data: str, prep: str, model: str, pred: str, log):
  """`beam-train predict` on an eval object with its record's clicks, moved to
  the source image -> (what was predicted, for the summary, and its seconds)."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  from beam_prep import keys  # pylint: disable=g-import-not-at-top
  from train.clicker import iou as mask_iou  # pylint: disable=g-import-not-at-top
  image_id, object_id, size, pos, neg = _eval_clicks(prep)
  image_path = sorted(glob.glob(os.path.join(data, "images", image_id + ".*")))[0]
  width, height = Image.open(image_path).size
  pos, neg = _to_source(pos, size, width, height), _to_source(neg, size, width, height)
  cmd = [beam_train, "predict", "--model", model, "--image", image_path, "--output", pred]
  cmd += [f"--positive={x},{y}" for x, y in pos] + [f"--negative={x},{y}" for x, y in neg]
  seconds = _run(cmd, log)
  truth = np.asarray(Image.open(os.path.join(data, "masks", image_id + ".png")))
  got = np.asarray(Image.open(pred)) > 0
  iou = float(mask_iou(got[None], (truth == object_id)[None], (truth != keys.IGNORE)[None])[0])
  return {"image_id": image_id, "object_id": object_id, "positive": len(pos),
          "negative": len(neg), "iou": iou}, seconds


def _summary(data: str, prep: str, model: str, pred: str, predicted, times, log) -> None:
  manifest = json.load(open(os.path.join(prep, "manifest.json")))
  metrics = json.load(open(os.path.join(model, "metrics.json")))
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
  log(f"  preview      {prep}/preview.png (what the records hold)")
  ev = metrics["eval"]
  log(f"  model        {model}: {metrics['final_step']} steps, "
      f"{metrics['examples_per_second'] or 0:.1f} examples/s, "
      f"input wait {100 * (metrics['input_wait_fraction'] or 0):.0f}%, eval mean IoU "
      f"{ev.get('mean_iou', float('nan')):.3f} (nearest-click baseline "
      f"{ev.get('baseline_nearest_click_mean_iou', float('nan')):.3f})")
  if "noc" in metrics:
    m, b = metrics["noc"]["model"], metrics["noc"]["baseline"]
    fewer = 100 * (1 - m["noc@85"] / b["noc@85"]) if b["noc@85"] else float("nan")
    log(f"  clicks       NoC@85 {m['noc@85']:.2f} for the model vs {b['noc@85']:.2f} for the "
        f"nearest-click baseline ({fewer:.0f}% fewer clicks); NoC@90 {m['noc@90']:.2f} vs "
        f"{b['noc@90']:.2f}; {metrics['noc']['objects']} eval objects, up to "
        f"{metrics['noc']['max_clicks']} clicks -> {model}/eval/")
  log(f"  export       {metrics['export_dir']}")
  p = predicted
  log(f"  prediction   {pred} (+ _overlay.png): {p['image_id']} object {p['object_id']}, "
      f"{p['positive']} positive + {p['negative']} negative clicks, IoU with the true mask "
      f"{p['iou']:.3f}")
  log("  time         " + ", ".join(f"{k} {v:.0f} s" for k, v in times.items()))
  log("")
  log("click and see (the page at http://127.0.0.1:8501/, TF Serving's REST API beside it):")
  log(f"  {serve_command(model, prep)}")


def serve_command(model: str, prep: str) -> str:
  """The `beam-train serve` command for the demo's model, its eval objects on the page."""
  beam_train = os.path.join(os.path.dirname(sys.executable), "beam-train")
  return " ".join(shlex.quote(c) for c in [beam_train, "serve", "--model", model,
                                           "--data", prep])


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m pipelines.demo")
  parser.add_argument("--workdir", default="out/demo", help="where everything is written")
  parser.add_argument("--count", type=int, default=32, help="sample scenes")
  args = parser.parse_args(argv)
  log = lambda s: print(s, flush=True)  # pylint: disable=unnecessary-lambda-assignment
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
  times["sample data"] = _run([beam_prep, "sample-data", "--output", data,
                               "--count", str(args.count)], log)
  times["preprocess"] = _run([beam_prep, "segmentation", "--input", data, "--output", prep,
                              "--preset", "demo", "--overwrite"], log)
  times["train+export"] = _run([beam_train, "fit", "--data", prep, "--model-dir", model,
                                "--preset", "demo"], log)
  predicted, times["predict"] = _predict(beam_train, data, prep, model, pred, log)
  times["total"] = time.time() - total
  _summary(data, prep, model, pred, predicted, times, log)


if __name__ == "__main__":
  main()
