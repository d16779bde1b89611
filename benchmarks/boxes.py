"""A box against one click: the IoU each gives on held-out objects.

    python -m benchmarks --boxes PREP --boxes-model MODEL [--boxes-objects 200]
                         [--boxes-pad 0,0.1] [--json FILE]

PREP is a beam-prep output; its eval images at their own size (its source
records, as `beam-train evaluate` measures NoC) are the held-out
photographs. For each of their objects, MODEL's export (a model dir or an
export) is given:

  one click   the protocol's first click (`train.evaluate.clicker.next_click_of` on
              an empty mask: the object's innermost pixel);
  a box       the object's box, widened by each --boxes-pad fraction of its
              sides, as a box prompt (`serve_box`: see
              `train.export.signatures`); to weigh that rule, also the box itself
              as the mask (what the model adds to it), the box's centre click
              without the box's crop and input (the whole image's crop, the
              mask cut to the box), and the box with the first click.

JSON: `objects`, `iou_one_click` (mean), `boxes`: one entry per pad with
`pad`, `iou` (the box prompt, mean), `iou_box_filled`,
`iou_centre_click_cut`, `iou_box_and_click`, `centre_on_object` (the share
of boxes whose centre is on the object).
"""

import argparse
import os
from typing import Any, Dict

import numpy as np

from benchmarks.common import log, refuse, run_and_write

PROG = "python -m benchmarks --boxes"
# Each box's figures, in `_object`'s order.
COLUMNS = ("iou", "iou_box_filled", "iou_centre_click_cut", "iou_box_and_click", "centre_on_object")


def add_arguments(parser: argparse.ArgumentParser) -> None:
  """The `--boxes` flags of `python -m benchmarks`."""
  parser.add_argument(
    "--boxes", metavar="PREP", help="IoU after a box against one click on PREP's eval objects"
  )
  parser.add_argument("--boxes-model", metavar="MODEL", help="--boxes: a model dir or an export")
  parser.add_argument(
    "--boxes-objects",
    type=int,
    default=200,
    metavar="N",
    help="--boxes: the first N objects of PREP (default: %(default)s)",
  )
  parser.add_argument(
    "--boxes-pad", default="0,0.1", metavar="P,..", help="--boxes: box widenings, as fractions"
  )


def _iou(mask: np.ndarray, label: np.ndarray) -> float:
  """The protocol's IoU (`train.evaluate.clicker.label_iou`: 1 object, IGNORE not counted)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from train.evaluate import clicker  # pylint: disable=g-import-not-at-top

  return float(clicker.label_iou(tf.constant(mask[None]), tf.constant(label[None]))[0])


def _box(label: np.ndarray, pad: float):
  """The object's box widened by `pad` of its sides, inside the image."""
  ys, xs = np.nonzero(label == 1)
  h, w = label.shape
  px = int(round((xs.max() - xs.min() + 1) * pad))
  py = int(round((ys.max() - ys.min() + 1) * pad))
  return (
    max(int(xs.min()) - px, 0),
    max(int(ys.min()) - py, 0),
    min(int(xs.max()) + px, w - 1),
    min(int(ys.max()) + py, h - 1),
  )


def _cut(mask: np.ndarray, box) -> np.ndarray:
  x0, y0, x1, y1 = box
  cut = np.zeros_like(mask)
  cut[y0 : y1 + 1, x0 : x1 + 1] = mask[y0 : y1 + 1, x0 : x1 + 1]
  return cut


def _object(model, image, label, pads) -> Dict[str, Any]:
  from train.evaluate import clicker  # pylint: disable=g-import-not-at-top

  xy, _ = clicker.next_click_of(np.zeros(label.shape, bool), label, [], [])
  out = {"one": _iou(model.segment(image, [list(xy)], [])["mask"] > 0, label)}
  for pad in pads:
    box = _box(label, pad)
    centre = ((box[0] + box[2]) // 2, (box[1] + box[3]) // 2)
    clicked = model.segment(image, [list(centre)], [])["mask"] > 0
    out[pad] = (
      _iou(model.segment(image, [], [], box=box)["mask"] > 0, label),
      _iou(_cut(np.ones_like(clicked), box), label),
      _iou(_cut(clicked, box), label),
      _iou(model.segment(image, [list(xy)], [], box=box)["mask"] > 0, label),
      bool(label[centre[1], centre[0]] == 1),
    )
  return out


def run(args: argparse.Namespace) -> Dict[str, Any]:
  from train.export.saved_model import latest_export  # pylint: disable=g-import-not-at-top
  from train.export.served import ServedModel  # pylint: disable=g-import-not-at-top
  from train.evaluate.simulate import source_objects  # pylint: disable=g-import-not-at-top

  pads = [float(p) for p in args.boxes_pad.split(",")]
  objects = source_objects(args.boxes)[: args.boxes_objects]
  model = ServedModel(latest_export(args.boxes_model))
  rows = [_object(model, o["image"], o["label"], pads) for o in objects]
  log(f"boxes: {len(rows)} objects of {args.boxes}")
  return {
    "objects": len(rows),
    "iou_one_click": float(np.mean([r["one"] for r in rows])),
    "boxes": [
      {
        "pad": pad,
        **{k: float(np.mean([r[pad][i] for r in rows])) for i, k in enumerate(COLUMNS)},
      }
      for pad in pads
    ],
  }


def table(result: Dict[str, Any]) -> str:
  lines = [
    f"{result['objects']} held-out objects; IoU after one click: {result['iou_one_click']:.3f}",
    "",
    "| box widened by | IoU, box prompt | the box itself | its centre click, whole image, "
    "cut | box and first click | centre on the object |",
    "|---|---|---|---|---|---|",
  ]
  for b in result["boxes"]:
    cells = [f"{b[k]:.3f}" for k in COLUMNS[:-1]] + [f"{b['centre_on_object']:.0%}"]
    lines.append(f"| {b['pad']:.0%} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def _refusal(args: argparse.Namespace) -> str:
  """Why the flags cannot run ("" when they can)."""
  if not args.boxes_model:
    return "--boxes-model MODEL is required"
  if not os.path.isdir(args.boxes):
    return f"{args.boxes}: no such folder"
  try:
    pads = [float(p) for p in args.boxes_pad.split(",")]
  except ValueError:
    return f"--boxes-pad {args.boxes_pad!r}: comma-separated fractions, as 0,0.1"
  return "" if all(0 <= p <= 1 for p in pads) else "--boxes-pad: fractions in 0..1"


def main(args: argparse.Namespace) -> int:
  why = _refusal(args)
  if why:
    return refuse(PROG, why)
  return run_and_write(lambda: run(args), args.json or "out/bench_boxes.json", table)
