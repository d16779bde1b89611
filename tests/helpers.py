"""Small builders of image files for tests."""

import glob
import io
import json
import os

import numpy as np
from PIL import Image


def png(arr, mode=None, **save) -> bytes:
  buf = io.BytesIO()
  Image.fromarray(arr, mode=mode).save(buf, format="PNG", **save)
  return buf.getvalue()


def encoded(im: Image.Image, fmt: str = "PNG") -> bytes:
  buf = io.BytesIO()
  im.save(buf, format=fmt)
  return buf.getvalue()


def scene(size=48, boxes=((6, 6, 30, 30),)):
  """(RGB image, instance mask) with one box-shaped object per entry."""
  img = np.full((size, size, 3), 80, np.uint8)
  inst = np.zeros((size, size), np.uint8)
  for i, (y0, x0, y1, x1) in enumerate(boxes, start=1):
    img[y0:y1, x0:x1] = (200, 40 * i % 255, 30)
    inst[y0:y1, x0:x1] = i
  return img, inst


def run_cli(argv):
  """Runs `beam-prep` in-process; returns its exit code."""
  from pipelines import cli  # pylint: disable=g-import-not-at-top
  try:
    cli.main(argv)
  except SystemExit as e:
    return e.code
  raise AssertionError("beam-prep did not exit")


def manifest(out) -> dict:
  with open(os.path.join(out, "manifest.json")) as f:
    return json.load(f)


def dead_letters(out):
  return [json.loads(l) for f in sorted(glob.glob(os.path.join(out, "errors", "*.jsonl")))
          for l in open(f)]


def records(out, split="*"):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from beam_prep import keys  # pylint: disable=g-import-not-at-top
  files = sorted(glob.glob(keys.record_pattern(out, split)))
  comp = keys.compression_of(files[0]) if files else ""
  return [tf.train.Example.FromString(r.numpy())
          for r in tf.data.TFRecordDataset(files, compression_type=comp)]
