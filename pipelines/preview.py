"""`beam-prep preview`: a picture of what the records hold.

Drawn from the records and their `features.json`, so user features show up
too. Segmentation records: one row per example with the image (clicks drawn:
green positive, red negative), the label mask (grey = ignore), and one panel
per channel of every other per-pixel model input (distance maps: dark = near
a click; disks: white inside). Classification records: a grid of images
titled with their labels.
"""

import io
import posixpath
from typing import List, Optional

import numpy as np

from beam_prep import keys
from beam_prep.features import FeatureTable


def read_examples(records_dir: str, count: int, table: FeatureTable) -> List[dict]:
  """The first `count` records of the train (then eval) split, as numpy dicts."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  root = posixpath.dirname(records_dir.rstrip("/"))
  files = []
  for split in (keys.TRAIN_SPLIT, keys.EVAL_SPLIT):
    files += sorted(tf.io.gfile.glob(keys.record_pattern(root, split)))
  if not files:
    raise FileNotFoundError(f"no records under {records_dir}")
  out = []
  for path in files:
    ds = tf.data.TFRecordDataset(path, compression_type=keys.compression_of(path))
    for raw in ds.take(count - len(out)):
      out.append(table.decode_numpy(raw.numpy()))
    if len(out) >= count:
      break
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


def render(examples: List[dict], table: FeatureTable) -> bytes:
  """PNG bytes of the preview grid."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  label_entry = table.with_role("label")[0]
  if label_entry.feature.per_pixel:  # A mask: one row per example with its panels.
    label = label_entry.key
    panels = _panels(table)
    rows, cols = len(examples), 2 + len(panels)
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 2.4, rows * 2.4 + 0.4), squeeze=False)
    titles = ["image + clicks", f"{label} (grey: ignore)"] + [t for t, _, _ in panels]
    for r, ex in enumerate(examples):
      ax = axes[r]
      ax[0].imshow(ex[keys.IMAGE])
      pos, neg = _clicks(ex, keys.POSITIVE_CLICKS), _clicks(ex, keys.NEGATIVE_CLICKS)
      for pts, colour in ((pos, "#00e000"), (neg, "#ff2020")):
        if len(pts):
          ax[0].scatter(pts[:, 0], pts[:, 1], s=22, c=colour, edgecolors="white", linewidths=0.8)
      mask = ex[label][..., 0]
      mask = np.where(mask == keys.IGNORE, 128, mask * 255).astype(np.uint8)
      ax[1].imshow(mask, cmap="gray", vmin=0, vmax=255)
      for a, (_, key, c) in zip(ax[2:], panels):
        channel = ex[key][..., c].astype(np.float32)
        a.imshow(channel, cmap="magma", vmin=min(channel.min(), 0), vmax=max(channel.max(), 1))
        pts = pos if c == 0 else neg
        if len(pts) and key in (keys.DISTANCE_MAPS, keys.CLICK_DISKS):
          a.scatter(pts[:, 0], pts[:, 1], s=10, c="cyan", marker="x", linewidths=0.8)
      meta = " ".join(f"{k[:3]} {int(np.ravel(ex[k])[0])}" for k in
                      (keys.OBJECT_ID, keys.VARIANT, keys.NEGATIVE_STRATEGY) if k in ex)
      ax[0].set_ylabel(f"{ex.get(keys.IMAGE_ID, '')}\n{meta}", fontsize=7)
      for c in range(cols):
        ax[c].set_xticks([])
        ax[c].set_yticks([])
        if r == 0:
          ax[c].set_title(titles[c], fontsize=8)
  else:
    cols = min(4, len(examples))
    rows = (len(examples) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 2.2, rows * 2.4), squeeze=False)
    for i, a in enumerate(axes.flat):
      a.set_xticks([])
      a.set_yticks([])
      if i < len(examples):
        a.imshow(examples[i][keys.IMAGE])
        a.set_title(examples[i][label_entry.key], fontsize=8)
      else:
        a.axis("off")
  fig.tight_layout()
  buf = io.BytesIO()
  fig.savefig(buf, format="png", dpi=80)
  plt.close(fig)
  return buf.getvalue()


def save(examples: List[dict], table: FeatureTable, output: str) -> str:
  """Renders `examples` and writes the PNG to `output` (local or gs://)."""
  from apache_beam.io.filesystems import FileSystems  # pylint: disable=g-import-not-at-top
  png = render(examples, table)
  if "://" not in output:
    import os  # pylint: disable=g-import-not-at-top
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
  with FileSystems.create(output) as f:
    f.write(png)
  return output


def write_preview(records_dir: str, output: str, count: int = 6,
                  table: Optional[FeatureTable] = None) -> str:
  """Reads `count` records and writes the preview PNG to `output` (local or gs://).

  `table` defaults to the features.json beside `records_dir`.
  """
  if table is None:
    table = FeatureTable.load(posixpath.dirname(records_dir.rstrip("/")))
  return save(read_examples(records_dir, count, table), table, output)
