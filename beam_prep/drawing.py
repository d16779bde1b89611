"""A mask and clicks drawn on an image: one look for `beam-train predict`'s
overlay, the NoC contact sheet and the records' preview.

Pillow and numpy only: the Beam job draws its preview on workers, which have
neither matplotlib nor the rest of the train extra.

  image     uint8 [H, W, 3]
  mask      bool-like [H, W], tinted MASK_TINT (optional)
  ignore    bool [H, W], darkened (optional)
  clicks    (x, y) = (column, row) pairs, drawn as discs at pixel centres:
            POSITIVE green, NEGATIVE red, with a white rim
"""

import io
from typing import Optional, Sequence, Tuple

import numpy as np
from PIL import Image, ImageDraw

POSITIVE = (0, 230, 0)
NEGATIVE = (240, 0, 0)
MASK_TINT = (40, 120, 255)
# Click discs grow with the picture so they stay visible on a large one.
MIN_RADIUS, PX_PER_RADIUS = 5, 90

Points = Sequence[Tuple[int, int]]


def png(array: np.ndarray, mode: Optional[str] = None) -> bytes:
  """The bytes of a PNG file of a uint8 array ([H, W] or [H, W, 3]), fast to write."""
  buf = io.BytesIO()
  Image.fromarray(array, mode).save(buf, format="PNG", compress_level=1)
  return buf.getvalue()


def tinted(
  image: np.ndarray, mask: Optional[np.ndarray] = None, ignore: Optional[np.ndarray] = None
) -> np.ndarray:
  """uint8 [H, W, 3]: the image with the mask half MASK_TINT, ignore pixels darkened."""
  out = image.astype(np.float32)
  if mask is not None:
    sel = np.asarray(mask) > 0
    out[sel] = 0.5 * out[sel] + 0.5 * np.array(MASK_TINT, np.float32)
  if ignore is not None:
    out[np.asarray(ignore, bool)] *= 0.5
  return np.clip(out, 0, 255).astype(np.uint8)


def overlay(
  image: np.ndarray,
  mask: Optional[np.ndarray] = None,
  positive: Points = (),
  negative: Points = (),
  scale: float = 1.0,
  ignore: Optional[np.ndarray] = None,
) -> Image.Image:
  """The image (mask tinted, ignore darkened) enlarged `scale` times with
  nearest neighbour, so pixels stay sharp, and the clicks drawn on it."""
  h, w = image.shape[:2]
  size = (max(1, round(w * scale)), max(1, round(h * scale)))
  im = Image.fromarray(tinted(image, mask, ignore)).resize(size, Image.NEAREST)
  r = max(MIN_RADIUS, max(size) // PX_PER_RADIUS)
  draw = ImageDraw.Draw(im)
  for points, colour in ((positive, POSITIVE), (negative, NEGATIVE)):
    for x, y in points:
      cx, cy = (x + 0.5) * scale, (y + 0.5) * scale  # the centre of the clicked pixel
      draw.ellipse(
        [cx - r, cy - r, cx + r, cy + r], fill=colour, outline=(255, 255, 255), width=max(1, r // 3)
      )
  return im
