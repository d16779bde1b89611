"""The portable files against the SavedModel: parity and latency.

    python -m benchmarks --portable EXPORT --portable-data PREP [--portable-model MODEL]
                         [--portable-objects 40] [--portable-clicks 24] [--json FILE]

EXPORT is an export written with `beam-train export --format all` (an export
folder, or a model dir: its newest export); MODEL, the SavedModel its files
are compared with (default: EXPORT's own). PREP's eval images at their own
size (its source records) are the held-out photographs.

Parity: each object is clicked by the protocol's clicker
(`train.evaluate.clicker.next_click_of`) for --portable-clicks clicks with the
SavedModel's `serve_iterative`, each click given its previous mask; the
TFLite and ONNX `serve_iterative` files get the very same inputs at every
click. Per format: the share of mask pixels equal to the SavedModel's, the
largest distance from the threshold of a pixel that differs, and the largest
probability difference.

Latency: one click (three clicks and a previous mask) on a 480x854 photograph,
per runtime (SavedModel in TensorFlow, TFLite in LiteRT, ONNX Runtime), with
one thread and with every core, each in a process of its own: the median of
`LATENCY_CALLS` calls after `LATENCY_WARMUP`.
"""

import argparse
import multiprocessing
import os
import time
from typing import Any, Dict, List

import numpy as np

from benchmarks.common import log, refuse, run_and_write

PROG = "python -m benchmarks --portable"
FORMATS = ("tflite", "onnx")
RUNTIMES = ("savedmodel",) + FORMATS
LATENCY_SIZE = (480, 854)  # (height, width)
LATENCY_CALLS = 20
LATENCY_WARMUP = 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
  """The `--portable` flags of `python -m benchmarks`."""
  parser.add_argument(
    "--portable", metavar="EXPORT", help="TFLite and ONNX files against the SavedModel"
  )
  parser.add_argument("--portable-data", metavar="PREP", help="--portable: held-out photographs")
  parser.add_argument(
    "--portable-model", metavar="MODEL", help="--portable: the SavedModel (default: EXPORT's)"
  )
  parser.add_argument(
    "--portable-objects",
    type=int,
    default=40,
    metavar="N",
    help="--portable: the first N objects of PREP (default: %(default)s)",
  )
  parser.add_argument(
    "--portable-clicks",
    type=int,
    default=24,
    metavar="N",
    help="--portable: the protocol's clicks per object, up to N (default: %(default)s)",
  )


def _files(export: str) -> Dict[str, str]:
  from train.export import portable, signatures as sig  # pylint: disable=g-import-not-at-top

  return {f: os.path.join(export, portable.file_name(sig.SERVE_ITERATIVE, f)) for f in FORMATS}


def _compare(want: Dict[str, np.ndarray], got: Dict[str, np.ndarray]):
  """(pixels, differing pixels, max |p - threshold| where they differ, max |dp|)."""
  from train.export import portable  # pylint: disable=g-import-not-at-top

  equal, near = portable.parity(want, got)
  dp = float(np.max(np.abs(want["probabilities"] - got["probabilities"])))
  size = want["mask"].size
  return size, int(round((1 - equal) * size)), near, dp


def _object(models, image, label, clicks: int) -> Dict[str, List]:
  """Per format, the `_compare` of each click of one object."""
  from train.evaluate import clicker  # pylint: disable=g-import-not-at-top

  positive, negative, previous = [], [], np.zeros(label.shape, np.uint8)
  rows = {f: [] for f in FORMATS}
  for _ in range(clicks):
    xy, kind = clicker.next_click_of(previous > 0, label, positive, negative)
    if xy is None:
      break
    (positive if kind == clicker.POSITIVE else negative).append(list(xy))
    want = models["savedmodel"].segment(image, positive, negative, previous)
    for f in FORMATS:
      got = models[f].segment(image, positive, negative, previous)
      rows[f].append(_compare(want, got))
    previous = want["mask"]
  return rows


def parity(export: str, saved: str, found: List[Dict[str, Any]], clicks: int) -> Dict[str, Any]:
  """`_object`'s comparisons over held-out objects `found`
  (`train.evaluate.simulate.source_objects`): the files of `export` against the
  SavedModel `saved`."""
  from train.export.portable_model import PortableModel  # pylint: disable=g-import-not-at-top
  from train.export.served import ServedModel  # pylint: disable=g-import-not-at-top

  models = {"savedmodel": ServedModel(saved)}
  models.update({f: PortableModel(p) for f, p in _files(export).items()})
  rows = {f: [] for f in FORMATS}
  sizes = set()
  for o in found:
    sizes.add(o["image"].shape[:2])
    for f, r in _object(models, o["image"], o["label"], clicks).items():
      rows[f].extend(r)
  log(f"portable: {len(found)} objects, {len(rows[FORMATS[0]])} clicks, {len(sizes)} image sizes")
  return {
    "objects": len(found),
    "clicks": len(rows[FORMATS[0]]),
    "max_clicks": clicks,
    "image_sizes": len(sizes),
    "formats": {
      f: {
        "pixels": sum(r[0] for r in rs),
        "differing_pixels": sum(r[1] for r in rs),
        "equal_pixels": 1 - sum(r[1] for r in rs) / sum(r[0] for r in rs),
        "max_threshold_distance": max(r[2] for r in rs),
        "max_probability_difference": max(r[3] for r in rs),
      }
      for f, rs in rows.items()
    },
  }


def _latency_request(image: np.ndarray):
  """A 480x854 version of `image`, three clicks and a previous mask."""
  from PIL import Image  # pylint: disable=g-import-not-at-top

  h, w = LATENCY_SIZE
  big = np.asarray(Image.fromarray(image).resize((w, h), Image.BILINEAR))
  previous = np.zeros((h, w), np.uint8)
  previous[h // 4 : h // 2, w // 4 : w // 2] = 1
  return big, [[w // 3, h // 3], [w // 3 + 20, h // 3 + 10]], [[10, 10]], previous


def _time_one(runtime: str, path: str, threads: int, request, out) -> None:
  """In a process of its own: the median seconds of one call of `runtime`."""
  if runtime == "savedmodel":
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    if threads:
      tf.config.threading.set_intra_op_parallelism_threads(threads)
      tf.config.threading.set_inter_op_parallelism_threads(threads)
    from train.export.served import ServedModel  # pylint: disable=g-import-not-at-top

    model = ServedModel(path)
  else:
    from train.export.portable_model import PortableModel  # pylint: disable=g-import-not-at-top

    model = PortableModel(path, threads)
  times = []
  for i in range(LATENCY_WARMUP + LATENCY_CALLS):
    t = time.perf_counter()
    model.segment(*request)
    if i >= LATENCY_WARMUP:
      times.append(time.perf_counter() - t)
  out.put(float(np.median(times)))


def latency(export: str, saved: str, image: np.ndarray) -> List[Dict[str, Any]]:
  """Per runtime and thread count, the median ms of one click (`_time_one`)."""
  paths = {"savedmodel": saved, **_files(export)}
  request = _latency_request(image)
  ctx = multiprocessing.get_context("spawn")
  rows = []
  for threads in (1, 0):
    for runtime in RUNTIMES:
      queue = ctx.Queue()
      child = ctx.Process(target=_time_one, args=(runtime, paths[runtime], threads, request, queue))
      child.start()
      seconds = queue.get()
      child.join()
      rows.append({"runtime": runtime, "threads": threads or os.cpu_count(), "ms": seconds * 1e3})
      log(f"portable: {runtime}, {rows[-1]['threads']} thread(s): {rows[-1]['ms']:.1f} ms")
  return rows


def table(result: Dict[str, Any]) -> str:
  lines = [
    f"Parity: {result['objects']} held-out objects, {result['clicks']} clicks (up to "
    f"{result['max_clicks']} each), {result['image_sizes']} image sizes",
    "",
    "| format | equal mask pixels | differing pixels' largest distance from the threshold "
    "| largest probability difference |",
    "|---|---|---|---|",
  ]
  for f, r in result["formats"].items():
    lines.append(
      f"| {f} | {r['equal_pixels']:.7%} ({r['differing_pixels']} of {r['pixels']} differ) "
      f"| {r['max_threshold_distance']:.2g} | {r['max_probability_difference']:.2e} |"
    )
  h, w = LATENCY_SIZE
  lines += ["", f"Latency of one click at {h}x{w} (median ms)", "", "| runtime | threads | ms |"]
  lines.append("|---|---|---|")
  lines += [f"| {r['runtime']} | {r['threads']} | {r['ms']:.1f} |" for r in result["latency"]]
  return "\n".join(lines)


def _refusal(args: argparse.Namespace) -> str:
  """Why the flags cannot run ("" when they can)."""
  if not args.portable_data:
    return "--portable-data PREP is required"
  if not os.path.isdir(args.portable_data):
    return f"{args.portable_data}: no such folder"
  missing = [p for p in _files(args.portable).values() if not os.path.isfile(p)]
  if missing:
    return f"no {missing[0]}: export with beam-train export --format all"
  return ""


def main(args: argparse.Namespace) -> int:
  from train.export.saved_model import latest_export  # pylint: disable=g-import-not-at-top
  from train.evaluate.simulate import source_objects  # pylint: disable=g-import-not-at-top

  try:
    if not all(os.path.isfile(p) for p in _files(args.portable).values()):
      args.portable = latest_export(args.portable)  # A model dir: its newest export.
    saved = latest_export(args.portable_model or args.portable)
  except FileNotFoundError as e:
    return refuse(PROG, str(e))
  why = _refusal(args)
  if why:
    return refuse(PROG, why)

  def run():
    found = source_objects(args.portable_data)[: args.portable_objects]
    result = parity(args.portable, saved, found, args.portable_clicks)
    result["latency"] = latency(args.portable, saved, found[0]["image"])
    return result

  return run_and_write(run, args.json or "out/bench_portable.json", table)
