"""A deterministic sample data set of cluttered scenes with instance masks.

Layout written (the `images/` + `masks/` layout `ReadExamples` takes):

    OUTPUT/images/scene_0000.png   RGB scene (every fourth one a JPEG)
    OUTPUT/masks/scene_0000.png    palette PNG, pixel = instance id:
                                   0 background, 1..N objects, 255 ignore

Each scene holds 2 to 4 objects of different shapes (ellipse, box, triangle,
star, ring), colours and textures (solid, stripes, checks, speckles) on a
textured background with clutter that is *not* an object. Objects may touch
or overlap; the mask holds what is visible. As in Pascal VOC's
SegmentationObject, a thin band along every object's outline is 255
("ignore"). The same seed gives the same bytes.
"""

import os
from typing import Dict, Tuple

import numpy as np
from PIL import Image, ImageDraw

from beam_prep import keys
from beam_prep.config import SampleDataConfig

SIZE = (SampleDataConfig.width, SampleDataConfig.height)  # A scene's (width, height).

SHAPES = ("ellipse", "box", "triangle", "star", "ring")
TEXTURES = ("solid", "stripes", "checks", "speckles")


def voc_palette() -> list:
  """Pascal VOC's colour map: 256 RGB entries, 255 drawn light."""
  pal = []
  for i in range(256):
    r = g = b = 0
    c = i
    for j in range(8):
      r |= ((c >> 0) & 1) << (7 - j)
      g |= ((c >> 1) & 1) << (7 - j)
      b |= ((c >> 2) & 1) << (7 - j)
      c >>= 3
    pal += [r, g, b]
  pal[255 * 3 :] = [224, 224, 192]
  return pal


def _texture(rng, kind: str, h: int, w: int, colour: np.ndarray) -> np.ndarray:
  yy, xx = np.mgrid[0:h, 0:w]
  base = np.broadcast_to(colour, (h, w, 3)).astype(np.float32)
  other = 255.0 - colour * 0.6
  if kind == "stripes":
    period = rng.integers(4, 9)
    angle = rng.uniform(0, np.pi)
    sel = (np.cos(angle) * xx + np.sin(angle) * yy) % period < period / 2
  elif kind == "checks":
    period = rng.integers(4, 10)
    sel = ((yy // period) + (xx // period)) % 2 == 0
  elif kind == "speckles":
    sel = rng.random((h, w)) < 0.15
  else:
    sel = np.zeros((h, w), bool)
  out = base.copy()
  out[sel] = other
  return out


def _shape_mask(rng, kind: str, h: int, w: int, centre, radius) -> np.ndarray:
  im = Image.new("L", (w, h), 0)
  draw = ImageDraw.Draw(im)
  cx, cy = centre
  rx, ry = radius
  if kind == "ellipse":
    draw.ellipse([cx - rx, cy - ry, cx + rx, cy + ry], fill=1)
  elif kind == "box":
    draw.rectangle([cx - rx, cy - ry, cx + rx, cy + ry], fill=1)
  elif kind == "triangle":
    a = rng.uniform(0, 2 * np.pi)
    pts = [
      (cx + rx * np.cos(a + k * 2 * np.pi / 3), cy + ry * np.sin(a + k * 2 * np.pi / 3))
      for k in range(3)
    ]
    draw.polygon(pts, fill=1)
  elif kind == "star":
    a = rng.uniform(0, 2 * np.pi)
    pts = []
    for k in range(10):
      r = 1.0 if k % 2 == 0 else 0.5
      pts.append((cx + r * rx * np.cos(a + k * np.pi / 5), cy + r * ry * np.sin(a + k * np.pi / 5)))
    draw.polygon(pts, fill=1)
  elif kind == "ring":
    draw.ellipse([cx - rx, cy - ry, cx + rx, cy + ry], fill=1)
    draw.ellipse([cx - rx * 0.45, cy - ry * 0.45, cx + rx * 0.45, cy + ry * 0.45], fill=0)
  return np.asarray(im, dtype=bool)


def _background(rng, h: int, w: int) -> np.ndarray:
  """A gradient, low-frequency blobs and pixel noise (float RGB)."""
  yy, xx = np.mgrid[0:h, 0:w]
  c0, c1 = rng.uniform(40, 200, 3), rng.uniform(40, 200, 3)
  t = (xx / w)[..., None]
  image = c0 * (1 - t) + c1 * t
  for _ in range(6):
    by, bx, br = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(8, 30)
    blob = np.exp(-((yy - by) ** 2 + (xx - bx) ** 2) / (2 * br * br))
    image += blob[..., None] * rng.uniform(-60, 60, 3)
  return image + rng.normal(0, 8, image.shape)


def _clutter(rng, image: np.ndarray) -> None:
  """Thin lines that belong to no object, drawn into `image`."""
  h, w = image.shape[:2]
  clutter = Image.new("RGB", (w, h))
  cdraw = ImageDraw.Draw(clutter)
  cmask = Image.new("L", (w, h), 0)
  mdraw = ImageDraw.Draw(cmask)
  for _ in range(int(rng.integers(4, 9))):
    pts = [tuple(rng.uniform(0, [w, h])) for _ in range(2)]
    colour = tuple(int(v) for v in rng.uniform(0, 255, 3))
    width = int(rng.integers(1, 3))
    cdraw.line(pts, fill=colour, width=width)
    mdraw.line(pts, fill=255, width=width)
  sel = np.asarray(cmask) > 0
  image[sel] = np.asarray(clutter, dtype=np.float64)[sel]


def _centre(rng, centres, r: float, w: int, h: int):
  """Where the next object goes: touching an earlier one, or anywhere."""
  if centres and rng.random() < 0.4:
    px, py, pr = centres[int(rng.integers(len(centres)))]
    a = rng.uniform(0, 2 * np.pi)
    dist = (pr + r) * rng.uniform(0.6, 1.0)
    centre = (px + dist * np.cos(a), py + dist * np.sin(a))
  else:
    centre = (rng.uniform(0.2, 0.8) * w, rng.uniform(0.2, 0.8) * h)
  return float(np.clip(centre[0], r, w - r)), float(np.clip(centre[1], r, h - r))


def _objects(rng, image: np.ndarray) -> np.ndarray:
  """Draws 2-4 textured objects into `image`; returns their instance ids."""
  h, w = image.shape[:2]
  instance = np.zeros((h, w), np.uint8)
  n_objects = int(rng.integers(2, 5))
  centres = []
  for obj_id in range(1, n_objects + 1):
    kind = SHAPES[int(rng.integers(len(SHAPES)))]
    texture = TEXTURES[int(rng.integers(len(TEXTURES)))]
    r = rng.uniform(0.12, 0.24) * min(w, h)
    radius = (r * rng.uniform(0.8, 1.25), r * rng.uniform(0.8, 1.25))
    centre = _centre(rng, centres, r, w, h)
    centres.append((centre[0], centre[1], r))
    shape = _shape_mask(rng, kind, h, w, centre, radius)
    tex = _texture(rng, texture, h, w, rng.uniform(0, 255, 3))
    image[shape] = tex[shape]
    instance[shape] = obj_id
  # Objects hidden entirely by later ones leave no id: renumber 1..N.
  present = [i for i in range(1, n_objects + 1) if (instance == i).any()]
  remap = np.zeros(256, np.uint8)
  for new, old in enumerate(present, start=1):
    remap[old] = new
  return remap[instance]


def _ignore_band(instance: np.ndarray) -> np.ndarray:
  """VOC-style ignore band: background pixels next to an object, and the
  seam between two objects, become 255."""
  h, w = instance.shape
  padded = np.pad(instance, 1, mode="edge")
  neighbours = [
    padded[1 + dy : 1 + dy + h, 1 + dx : 1 + dx + w]
    for dy, dx in ((-1, 0), (1, 0), (0, -1), (0, 1))
  ]
  differs = np.zeros((h, w), bool)
  for n in neighbours:
    differs |= n != instance
  band = differs & ((instance == 0) | (np.maximum.reduce(neighbours) > instance))
  out = instance.copy()
  out[band] = 255
  return out


def make_scene(
  seed: int, index: int, size: Tuple[int, int] = SIZE
) -> Tuple[np.ndarray, np.ndarray]:
  """One scene: (uint8 RGB [H, W, 3], uint8 instance mask [H, W]).

  Args:
    seed: data-set seed.
    index: scene index; (seed, index) fixes the scene.
    size: (width, height).
  """
  rng = np.random.default_rng([seed, index])
  w, h = size
  image = _background(rng, h, w)
  _clutter(rng, image)
  instance = _ignore_band(_objects(rng, image))
  return np.clip(np.rint(image), 0, 255).astype(np.uint8), instance


def write_sample_data(
  output_dir: str,
  count: int = SampleDataConfig.count,
  seed: int = SampleDataConfig.seed,
  size: Tuple[int, int] = SIZE,
) -> Dict[str, int]:
  """Writes `count` scenes under `output_dir`; returns counts of what it wrote.

  Raises:
    ValueError: if count < 1.
  """
  from beam_prep.layouts.folders import IMAGES_DIR, MASK_SUFFIX, MASKS_DIR  # pylint: disable=g-import-not-at-top

  if count < 1:
    raise ValueError(f"count must be at least 1, got {count}")
  img_dir = os.path.join(output_dir, IMAGES_DIR)
  mask_dir = os.path.join(output_dir, MASKS_DIR)
  os.makedirs(img_dir, exist_ok=True)
  os.makedirs(mask_dir, exist_ok=True)
  palette = voc_palette()
  objects = 0
  for i in range(count):
    image, instance = make_scene(seed, i, size)
    name = f"scene_{i:04d}"
    if i % 4 == 3:
      Image.fromarray(image).save(os.path.join(img_dir, name + ".jpg"), quality=92)
    else:
      Image.fromarray(image).save(os.path.join(img_dir, name + ".png"))
    mask = Image.fromarray(instance, mode="P")
    mask.putpalette(palette)
    mask.save(os.path.join(mask_dir, name + MASK_SUFFIX))
    objects += len(set(np.unique(instance).tolist()) - {keys.BACKGROUND, keys.IGNORE})
  return {"images": count, "objects": objects}
