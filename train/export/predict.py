"""`beam-train predict`: one image and its clicks through the exported model.

Writes the mask (PNG of the input's size, 255 object, 0 elsewhere) and, beside
it, `<name>_overlay.png`: the image with the mask tinted and the clicks
marked (green positive, red negative), at least 512 px on its long side.
"""

import os
from typing import Dict, Tuple

import numpy as np
import tensorflow as tf
from PIL import Image

from beam_prep import drawing, keys
from train.export import signatures as sig
from train.export.served import InvalidInput, clamp, decode_image


def parse_point(text: str) -> Tuple[int, int]:
  """ "X,Y" -> (x, y); x is the column, y the row."""
  try:
    x, y = (int(v) for v in text.split(","))
  except ValueError:
    raise ValueError(f"a click is X,Y in pixels (x = column, y = row), got {text!r}") from None
  return x, y


def load_image(path: str, max_pixels: int = keys.MAX_PIXELS) -> np.ndarray:
  """Reads and decodes an image file (`decode_image`), or raises
  FileNotFoundError / ValueError naming the file."""
  if not tf.io.gfile.exists(path):
    raise FileNotFoundError(f"no image at {path}")
  with tf.io.gfile.GFile(path, "rb") as f:
    return decode_image(f.read(), path, max_pixels)


def classify(model, path: str) -> Dict[str, np.ndarray]:
  """A classification `ServedModel`'s outputs for the image file at `path`.

  Raises:
    FileNotFoundError / ValueError: naming the file and the reason.
  """
  if not tf.io.gfile.exists(path):
    raise FileNotFoundError(f"no image at {path}")
  with tf.io.gfile.GFile(path, "rb") as f:
    data = f.read()
  try:
    return model.classify([data])
  except InvalidInput as e:
    raise ValueError(f"cannot read image {path}: {e}") from None


# The overlay's long side at least (small images are enlarged, pixels kept sharp).
OVERLAY_MIN_SIDE = 512


def class_lines(out: Dict[str, np.ndarray], top: int = 5):
  """`classify`'s answer as lines: the label, then the `top` classes' probabilities."""
  probs = out[sig.PROBABILITIES][0]
  ranked = sorted(zip(out[sig.CLASSES].tolist(), probs.tolist()), key=lambda t: -t[1])
  yield "%s (%s)" % (
    out[sig.LABEL][0].decode(),
    ", ".join(f"{c.decode()} {v:.3f}" for c, v in ranked[:top]),
  )


def read_request(config) -> Tuple[np.ndarray, list, list]:
  """(image, positive, negative clicks) of `config` (a `PredictConfig`), read
  before any model is loaded, so that a wrong file or click is said at once.

  Raises:
    FileNotFoundError / ValueError: naming the file or the click.
  """
  positive = [parse_point(s) for s in config.positive]
  negative = [parse_point(s) for s in config.negative]
  return load_image(config.image), positive, negative


def segment_inputs(config, model, request, log):
  """(image, positive, negative clicks clamped into it) of a segmentation
  request (`read_request`) of `config` (a `PredictConfig`)."""
  model.require_segmentation()
  if not config.output:
    raise ValueError("--output MASK.png is required for a segmentation model")
  image, positive, negative = request
  if not positive:
    raise ValueError("at least one --positive X,Y click on the object is required")
  h, w = image.shape[:2]
  positive, moved_p = clamp(positive, w, h)
  negative, moved_n = clamp(negative, w, h)
  if moved_p or moved_n:
    log.info(
      "predict: clicks outside the %dx%d image clamped to its border: %s",
      w,
      h,
      ", ".join(f"{x},{y}" for x, y in moved_p + moved_n),
    )
  return image, positive, negative


def write_outputs(
  output: str, image: np.ndarray, result: Dict[str, np.ndarray], positive, negative
) -> Tuple[str, str]:
  """Writes the mask PNG and the overlay; returns both paths."""
  os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
  mask = result[sig.MASK]
  Image.fromarray((mask > 0).astype(np.uint8) * 255).save(output)
  stem, _ = os.path.splitext(output)
  overlay_path = stem + "_overlay.png"
  h, w = image.shape[:2]
  scale = max(1, -(-OVERLAY_MIN_SIDE // max(h, w)))  # a whole factor: sharp pixels
  drawing.overlay(image, mask, positive, negative, scale).save(overlay_path)
  return output, overlay_path
