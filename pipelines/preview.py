"""`beam-prep preview`: a picture of what the records hold.

Drawn from the records and their `features.json`, so user features show up
too. Segmentation records: one row per example with the image (clicks drawn:
green positive, red negative), the label mask (grey = ignore), and one panel
per channel of every other per-pixel model input (a dark-to-bright colormap;
distance maps: dark = near a click; disks: bright inside; the channel's
clicks marked with cyan crosses). Classification records: a grid of images
titled with their labels (at most 4 columns). Panels are upscaled with
nearest neighbour to 192 px on their long side, larger when that is needed
for the picture to be at least 512 px on its long side, so it is readable even
from 32 px records or a single example.

Pillow only (clicks drawn by `beam_prep.drawing`, as `beam-train predict` draws
them): the job's last step draws it on a worker, where neither matplotlib nor
the trainer's packages are installed.
"""

import io
import posixpath
from typing import List, Optional

import numpy as np

from beam_prep import drawing, keys
from beam_prep.config import PreviewConfig
from beam_prep.features import FeatureTable


def read_examples(records_dir: str, count: int, table: FeatureTable) -> List[dict]:
  """The first `count` records of the train (then eval) split, as numpy dicts."""
  # TensorFlow only when records are read: workers import this module to draw.
  from beam_prep.prep_output import PrepOutput  # pylint: disable=g-import-not-at-top

  prep = PrepOutput(posixpath.dirname(records_dir.rstrip("/")), table)
  if not (prep.files(keys.TRAIN_SPLIT) or prep.files(keys.EVAL_SPLIT)):
    raise FileNotFoundError(f"no records under {records_dir}")
  out = []
  for split in (keys.TRAIN_SPLIT, keys.EVAL_SPLIT):
    if len(out) < count:
      out += prep.read_numpy(split, limit=count - len(out))
  if not out:
    raise FileNotFoundError(
      f"the record files under {records_dir} hold no record (did every "
      "input fail? see manifest.json and errors/ beside them)"
    )
  return out


def _panels(table: FeatureTable):
  """(title, feature key, channel) of each per-pixel panel after image and mask."""
  out = []
  for e in table.model_inputs:
    if e.key == keys.IMAGE:
      continue
    for c in range(e.feature.channels):
      out.append((f"{e.key}[{c}]", e.key, c))
  return out


def _clicks(ex, key):
  return np.asarray(ex.get(key, np.zeros((0, 2), np.int64))).reshape(-1, 2)


# A dark-to-bright perceptual colormap (close to matplotlib's magma),
# interpolated from a few anchors: 256 RGB rows.
_ANCHORS = np.array(
  [
    [0, 0, 4],
    [40, 11, 84],
    [101, 21, 110],
    [159, 42, 99],
    [212, 72, 66],
    [245, 125, 21],
    [250, 193, 39],
    [252, 253, 191],
  ],
  np.float64,
)
_LUT = (
  np.stack(
    [
      np.interp(np.linspace(0, len(_ANCHORS) - 1, 256), np.arange(len(_ANCHORS)), _ANCHORS[:, c])
      for c in range(3)
    ],
    axis=1,
  )
  .round()
  .astype(np.uint8)
)
PANEL = 192  # Pixels on a panel's long side (at least).
MIN_SIDE = 512  # Pixels on the picture's long side (at least).
GAP, TITLE, SIDE = 6, 20, 150  # Between panels; column titles; row labels (segmentation).
POSITIVE, NEGATIVE = drawing.POSITIVE, drawing.NEGATIVE  # The clicks, as predict draws them.
MARK = (0, 255, 255)


def _font(size: int):
  from PIL import ImageFont  # pylint: disable=g-import-not-at-top

  try:
    return ImageFont.load_default(size=size)
  except TypeError:  # Pillow < 10.1
    return ImageFont.load_default()


def _size(h: int, w: int, side: int):
  """(width, height) of an h x w panel scaled to `side` px on its long side."""
  scale = side / max(h, w)
  return max(1, round(w * scale)), max(1, round(h * scale))


def _scaled(rgb: np.ndarray, side: int):
  """An RGB array as a PIL image, nearest-neighbour, `side` px on its long side."""
  from PIL import Image  # pylint: disable=g-import-not-at-top

  h, w = rgb.shape[:2]
  return Image.fromarray(rgb).resize(_size(h, w, side), Image.NEAREST), side / max(h, w)


def _panel_side(sheet_size) -> int:
  """PANEL, or more if the sheet `sheet_size(side)` would be under MIN_SIDE px."""
  side = PANEL
  while max(sheet_size(side)) < MIN_SIDE:
    side += 8
  return side


def _fit(draw, text: str, font, width: float) -> str:
  """`text`, cut short with "..." so that it is at most `width` px wide."""
  if draw.textlength(text, font=font) <= width:
    return text
  while text and draw.textlength(text + "...", font=font) > width:
    text = text[:-1]
  return text + "..."


def _colormap(channel: np.ndarray) -> np.ndarray:
  lo, hi = min(float(channel.min()), 0.0), max(float(channel.max()), 1.0)
  idx = np.clip((channel.astype(np.float64) - lo) / (hi - lo) * 255, 0, 255).astype(np.uint8)
  return _LUT[idx]


def _crosses(draw, points, scale, r=4):
  for x, y in points:
    cx, cy = (x + 0.5) * scale, (y + 0.5) * scale
    draw.line([cx - r, cy - r, cx + r, cy + r], fill=MARK, width=2)
    draw.line([cx - r, cy + r, cx + r, cy - r], fill=MARK, width=2)


def _mask_row(sheet, draw, ex, r, layout, table_label: str, panels, fonts) -> None:
  """One example of a segmentation preview: its panels and a few lines of text."""
  from PIL import ImageDraw  # pylint: disable=g-import-not-at-top

  side, pw, ph, h, w = layout
  font, small = fonts
  y0 = TITLE + r * (ph + GAP)
  pos, neg = _clicks(ex, keys.POSITIVE_CLICKS), _clicks(ex, keys.NEGATIVE_CLICKS)
  mask = ex[table_label][..., 0]
  grey = np.where(mask == keys.IGNORE, 128, mask * 255).astype(np.uint8)
  images = [ex[keys.IMAGE], np.repeat(grey[..., None], 3, axis=-1)]
  images += [_colormap(ex[key][..., c]) for _, key, c in panels]
  for c, rgb in enumerate(images):
    if c == 0:
      im = drawing.overlay(rgb, positive=pos, negative=neg, scale=side / max(h, w))
    else:
      im, scale = _scaled(rgb, side)
    if c >= 2:
      _, key, ch = panels[c - 2]
      if key in (keys.DISTANCE_MAPS, keys.CLICK_DISKS):
        _crosses(ImageDraw.Draw(im), pos if ch == 0 else neg, scale)
    sheet.paste(im, (SIDE + c * (pw + GAP), y0))
  meta = [
    f"{name} {int(np.ravel(ex[k])[0])}"
    for k, name in (
      (keys.OBJECT_ID, "object"),
      (keys.VARIANT, "variant"),
      (keys.NEGATIVE_STRATEGY, "strategy"),
    )
    if k in ex
  ]
  lines = [
    str(ex.get(keys.IMAGE_ID, "")),
    ", ".join(meta[:2]),
    ", ".join(meta[2:]),
    f"{len(pos)} positive clicks",
    f"{len(neg)} negative clicks",
  ]
  for i, text in enumerate(t for t in lines if t):
    draw.text(
      (4, y0 + 4 + 17 * i),
      _fit(draw, text, font if i == 0 else small, SIDE - 8),
      fill=(30, 30, 30) if i == 0 else (90, 90, 90),
      font=font if i == 0 else small,
    )


def _render_masks(examples: List[dict], table: FeatureTable, label: str, fonts):
  """A segmentation preview: one row per example (image + clicks, mask, encodings)."""
  from PIL import Image, ImageDraw  # pylint: disable=g-import-not-at-top

  panels = _panels(table)
  titles = ["image + clicks", f"{label} (grey: ignore)"] + [t for t, _, _ in panels]
  h, w = examples[0][keys.IMAGE].shape[:2]

  def size_of(side):
    pw, ph = _size(h, w, side)
    return SIDE + len(titles) * (pw + GAP), TITLE + len(examples) * (ph + GAP)

  side = _panel_side(size_of)
  pw, ph = _size(h, w, side)
  sheet = Image.new("RGB", size_of(side), "white")
  draw = ImageDraw.Draw(sheet)
  for c, title in enumerate(titles):
    draw.text(
      (SIDE + c * (pw + GAP) + 2, 3),
      _fit(draw, title, fonts[0], pw - 2),
      fill=(30, 30, 30),
      font=fonts[0],
    )
  for r, ex in enumerate(examples):
    _mask_row(sheet, draw, ex, r, (side, pw, ph, h, w), label, panels, fonts)
  return sheet


def _render_classes(examples: List[dict], label: str, font):
  """A classification preview: a grid of images titled with their class."""
  from PIL import Image, ImageDraw  # pylint: disable=g-import-not-at-top

  cols = min(4, len(examples))
  rows = (len(examples) + cols - 1) // cols
  pw = ph = _panel_side(lambda side: (cols * (side + GAP), rows * (side + TITLE + GAP)))
  sheet = Image.new("RGB", (cols * (pw + GAP), rows * (ph + TITLE + GAP)), "white")
  draw = ImageDraw.Draw(sheet)
  for i, ex in enumerate(examples):
    r, c = divmod(i, cols)
    im, _ = _scaled(ex[keys.IMAGE], pw)
    x0, y0 = c * (pw + GAP), r * (ph + TITLE + GAP)
    draw.text(
      (x0 + 2, y0 + 3), _fit(draw, str(ex[label]), font, pw - 2), fill=(30, 30, 30), font=font
    )
    sheet.paste(im, (x0, y0 + TITLE))
  return sheet


def render(examples: List[dict], table: FeatureTable) -> bytes:
  """PNG bytes of the preview grid (Pillow only: it is drawn on a worker)."""
  label_entry = table.with_role("label")[0]
  fonts = (_font(13), _font(11))
  if label_entry.feature.per_pixel:  # A mask: one row per example with its panels.
    sheet = _render_masks(examples, table, label_entry.key, fonts)
  else:
    sheet = _render_classes(examples, label_entry.key, fonts[0])
  buf = io.BytesIO()
  sheet.save(buf, format="PNG")
  return buf.getvalue()


def save(examples: List[dict], table: FeatureTable, output: str) -> str:
  """Renders `examples` and writes the PNG to `output` (local or gs://)."""
  from apache_beam.io.filesystems import FileSystems  # pylint: disable=g-import-not-at-top

  png = render(examples, table)
  if not keys.is_remote(output):
    import os  # pylint: disable=g-import-not-at-top

    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
  with FileSystems.create(output) as f:
    f.write(png)
  return output


def write_preview(
  records_dir: str,
  output: str,
  count: int = PreviewConfig.count,
  table: Optional[FeatureTable] = None,
) -> str:
  """Reads `count` records and writes the preview PNG to `output` (local or gs://).

  `table` defaults to the features.json beside `records_dir`.
  """
  from beam_prep.prep_output import PrepOutput  # pylint: disable=g-import-not-at-top

  table = PrepOutput(posixpath.dirname(records_dir.rstrip("/")), table).table
  return save(read_examples(records_dir, count, table), table, output)
