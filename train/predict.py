"""`beam-train predict`: one image and its clicks through the exported model.

Writes the mask (PNG of the input's size, 255 object, 0 elsewhere) and, beside
it, `<name>_overlay.png`: the image with the mask tinted and the clicks
marked (green positive, red negative).
"""

import os
from typing import Dict, Sequence, Tuple

import numpy as np
import tensorflow as tf
from PIL import Image, ImageDraw

from train.export import latest_export


def parse_point(text: str) -> Tuple[int, int]:
  """"X,Y" -> (x, y); x is the column, y the row."""
  try:
    x, y = (int(v) for v in text.split(","))
  except ValueError:
    raise ValueError(f"a click is X,Y in pixels (x = column, y = row), got {text!r}") from None
  return x, y


def load_image(path: str) -> np.ndarray:
  with tf.io.gfile.GFile(path, "rb") as f:
    im = Image.open(f)
    im.load()
  return np.asarray(im.convert("RGB"), dtype=np.uint8)


def predict(model: str, image: np.ndarray, positive: Sequence[Tuple[int, int]],
            negative: Sequence[Tuple[int, int]]) -> Dict[str, np.ndarray]:
  """Runs the serving signature of the newest export of `model`."""
  loaded = tf.saved_model.load(latest_export(model))
  fn = loaded.signatures["serving_default"]
  out = fn(image=tf.constant(image, tf.uint8),
           positive_clicks=tf.constant(np.asarray(positive, np.int32).reshape(-1, 2)),
           negative_clicks=tf.constant(np.asarray(negative, np.int32).reshape(-1, 2)))
  return {k: v.numpy() for k, v in out.items()}


def overlay(image: np.ndarray, mask: np.ndarray, positive, negative) -> Image.Image:
  tint = image.astype(np.float32)
  sel = mask > 0
  tint[sel] = 0.5 * tint[sel] + 0.5 * np.array([40, 120, 255], np.float32)
  im = Image.fromarray(np.clip(tint, 0, 255).astype(np.uint8))
  draw = ImageDraw.Draw(im)
  r = max(2, min(image.shape[:2]) // 60)
  for pts, colour in ((positive, (0, 230, 0)), (negative, (240, 0, 0))):
    for x, y in pts:
      draw.ellipse([x - r, y - r, x + r, y + r], fill=colour, outline=(255, 255, 255))
  return im


def write_outputs(output: str, image: np.ndarray, result: Dict[str, np.ndarray],
                  positive, negative) -> Tuple[str, str]:
  """Writes the mask PNG and the overlay; returns both paths."""
  os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
  mask = result["mask"]
  Image.fromarray((mask > 0).astype(np.uint8) * 255).save(output)
  stem, _ = os.path.splitext(output)
  overlay_path = stem + "_overlay.png"
  overlay(image, mask, positive, negative).save(overlay_path)
  return output, overlay_path
