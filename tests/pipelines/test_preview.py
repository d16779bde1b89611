"""The preview picture, drawn with Pillow only from small in-memory examples."""

import io
import os

import numpy as np
import pytest
from PIL import Image

from beam_prep import keys
from beam_prep.features import Entry, Feature, FeatureTable
from pipelines import preview
from tests.helpers import assert_never_imports

HERE = os.path.dirname(os.path.abspath(__file__))


def _segmentation(size=32, n=2):
  """A table with image, mask, 2-channel distance maps and click disks, and `n` examples."""
  h = w = size
  table = FeatureTable(
    [
      Entry(keys.IMAGE_ID, Feature("string", shape=(), role="metadata"), "read"),
      Entry(keys.IMAGE, Feature("uint8", channels=3), "decode"),
      Entry(keys.OBJECT_ID, Feature("int64", shape=(), role="metadata"), "split_objects"),
      Entry(keys.VARIANT, Feature("int64", shape=(), role="metadata"), "sample_clicks"),
      Entry(keys.MASK, Feature("uint8", channels=1, role="label"), "split_objects"),
      Entry(
        keys.POSITIVE_CLICKS, Feature("int64", shape=(None, 2), role="metadata"), "sample_clicks"
      ),
      Entry(
        keys.NEGATIVE_CLICKS, Feature("int64", shape=(None, 2), role="metadata"), "sample_clicks"
      ),
      Entry(keys.DISTANCE_MAPS, Feature("uint8", channels=2), "distance_maps"),
      Entry(keys.CLICK_DISKS, Feature("uint8", channels=2), "click_disks"),
    ],
    (h, w),
    "segmentation",
  )
  rng = np.random.default_rng(0)
  yy, xx = np.mgrid[:h, :w]
  examples = []
  for i in range(n):
    pos, neg = np.array([[5 + i, 20]]), np.array([[25, 4 + i], [12, 28]])
    mask = np.zeros((h, w, 1), np.uint8)
    mask[8:24, 4:18] = 1
    mask[24:26, 4:18] = keys.IGNORE
    maps = np.stack(
      [np.min([np.hypot(xx - x, yy - y) for x, y in pts], axis=0) for pts in (pos, neg)], axis=-1
    )
    examples.append(
      {
        keys.IMAGE_ID: f"scene_{i:04d}",
        keys.OBJECT_ID: np.array(i + 1),
        keys.VARIANT: np.array(0),
        keys.MASK: mask,
        keys.IMAGE: rng.integers(0, 256, (h, w, 3), dtype=np.uint8),
        keys.POSITIVE_CLICKS: pos,
        keys.NEGATIVE_CLICKS: neg,
        keys.DISTANCE_MAPS: np.minimum(maps, 255).astype(np.uint8),
        keys.CLICK_DISKS: (maps <= 3).astype(np.uint8),
      }
    )
  return table, examples


def _classification(n, size=32):
  table = FeatureTable(
    [
      Entry(keys.IMAGE, Feature("uint8", channels=3), "decode"),
      Entry(keys.LABEL, Feature("string", shape=(), role="label"), "require_label"),
    ],
    (size, size),
    "classification",
  )
  rng = np.random.default_rng(1)
  return table, [
    {
      keys.IMAGE: rng.integers(0, 256, (size, size, 3), dtype=np.uint8),
      keys.LABEL: ("cat", "dog")[i % 2],
    }
    for i in range(n)
  ]


def _rgb(png: bytes) -> np.ndarray:
  assert png.startswith(b"\x89PNG\r\n\x1a\n")
  return np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)


def test_the_preview_module_never_imports_matplotlib():
  """In a fresh interpreter: import the module, render both kinds, check sys.modules."""
  code = (
    "import sys\n"
    f"sys.path.insert(0, {HERE!r})\n"
    "from test_preview import _classification, _segmentation\n"
    "from pipelines.preview import render\n"
    "for table, examples in (_segmentation(), _classification(3)):\n"
    "  assert render(examples, table).startswith(b'\\x89PNG')\n"
  )
  assert_never_imports(code, "matplotlib")


def test_tiny_segmentation_records_make_a_readable_row_per_example():
  table, examples = _segmentation(size=32, n=2)
  im = _rgb(preview.render(examples, table))
  h, w = im.shape[:2]
  assert max(h, w) >= preview.MIN_SIDE
  titles = [t for t, _, _ in preview._panels(table)]  # pylint: disable=protected-access
  assert titles == ["distance_maps[0]", "distance_maps[1]", "click_disks[0]", "click_disks[1]"]
  step, scale = preview.PANEL + preview.GAP, preview.PANEL / 32
  assert (w, h) == (preview.SIDE + 6 * step, preview.TITLE + 2 * step)
  grey = im.mean(axis=-1)
  assert (grey[: preview.TITLE, preview.SIDE :] < 100).any()  # column titles above the first row
  for r, ex in enumerate(examples):
    y0 = preview.TITLE + r * step
    assert (grey[y0 : y0 + preview.PANEL, : preview.SIDE] < 100).any()  # the row's label
    panel = [
      im[y0 : y0 + preview.PANEL, preview.SIDE + c * step :][:, : preview.PANEL] for c in range(6)
    ]
    for c, p in enumerate(panel):
      assert p.std() > 10, f"row {r}, panel {c} looks blank"

    def at(p, xy):  # The panel's pixel at the centre of record pixel (x, y).
      x, y = xy
      return tuple(p[int((y + 0.5) * scale), int((x + 0.5) * scale)])

    pos, neg = ex[keys.POSITIVE_CLICKS], ex[keys.NEGATIVE_CLICKS]
    for xy in pos:
      assert at(panel[0], xy) == preview.POSITIVE
    for xy in neg:
      assert at(panel[0], xy) == preview.NEGATIVE
    # The mask: 0 black, 1 white, ignore mid grey.
    assert at(panel[1], (0, 0)) == (0, 0, 0)
    assert at(panel[1], (10, 15)) == (255, 255, 255)
    assert at(panel[1], (10, 24)) == (128, 128, 128)
    # Cyan crosses: positive clicks on channel 0, negative ones on channel 1.
    for c, clicks, others in ((2, pos, neg), (3, neg, pos), (4, pos, neg), (5, neg, pos)):
      assert all(at(panel[c], xy) == preview.MARK for xy in clicks), c
      assert not any(at(panel[c], xy) == preview.MARK for xy in others), c
    # Distance maps: dark near a click, bright far away.
    assert np.mean(at(panel[2], (31, 0))) > np.mean(at(panel[2], tuple(pos[0] + [1, 1]))) + 100


def test_the_colormap_runs_dark_to_bright_over_the_value_range():
  lum = preview._colormap(np.linspace(0, 1, 256)) @ [0.299, 0.587, 0.114]  # pylint: disable=protected-access
  assert lum[0] < 10 and lum[-1] > 230 and (np.diff(lum) >= -1).all()
  # vmin = min(channel.min(), 0), vmax = max(channel.max(), 1): a 0/1 disk is black/bright,
  # a 0..255 map spans the whole range, and a constant 0 channel stays dark.
  cmap, lut = preview._colormap, preview._LUT  # pylint: disable=protected-access
  np.testing.assert_array_equal(cmap(np.array([0, 1], np.uint8)), lut[[0, 255]])
  np.testing.assert_array_equal(cmap(np.array([0, 255], np.uint8)), lut[[0, 255]])
  np.testing.assert_array_equal(cmap(np.array([-1.0, 0.0, 1.0])), lut[[0, 127, 255]])
  np.testing.assert_array_equal(cmap(np.zeros(3, np.uint8)), lut[[0, 0, 0]])


def test_long_row_labels_are_cut_short_and_leave_the_panels_alone():
  table, examples = _segmentation(n=1)
  short = _rgb(preview.render(examples, table))
  examples[0][keys.IMAGE_ID] = "a/very/long/image/id/" * 10
  long_ = _rgb(preview.render(examples, table))
  np.testing.assert_array_equal(short[:, preview.SIDE :], long_[:, preview.SIDE :])
  assert (short[:, : preview.SIDE] != long_[:, : preview.SIDE]).any()


@pytest.mark.parametrize("n,cols", [(1, 1), (2, 2), (5, 4), (9, 4)])
def test_classification_is_a_titled_grid_of_at_most_four_columns(n, cols):
  table, examples = _classification(n)
  im = _rgb(preview.render(examples, table))
  h, w = im.shape[:2]
  assert max(h, w) >= preview.MIN_SIDE, (n, w, h)
  rows = -(-n // cols)
  pw = w // cols - preview.GAP
  assert pw >= preview.PANEL and w == cols * (pw + preview.GAP)
  assert h == rows * (pw + preview.TITLE + preview.GAP)
  grey = im.mean(axis=-1)
  for i in range(n):
    r, c = divmod(i, cols)
    x0, y0 = c * (pw + preview.GAP), r * (pw + preview.TITLE + preview.GAP)
    assert (grey[y0 : y0 + preview.TITLE, x0 : x0 + pw] < 100).any(), f"example {i} has no title"
    assert im[y0 + preview.TITLE : y0 + preview.TITLE + pw, x0 : x0 + pw].std() > 10


def test_an_older_pillow_without_a_font_size_still_renders(monkeypatch):
  from PIL import ImageFont  # pylint: disable=g-import-not-at-top

  original = ImageFont.load_default

  def load_default(*args, **kwargs):
    if args or kwargs:
      raise TypeError("load_default() takes 0 positional arguments")  # Pillow < 10.1
    return original()

  monkeypatch.setattr(ImageFont, "load_default", load_default)
  table, examples = _segmentation(n=1)
  assert max(_rgb(preview.render(examples, table)).shape[:2]) >= preview.MIN_SIDE
