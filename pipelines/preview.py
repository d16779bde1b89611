"""`beam-prep preview`: a picture of what the records hold.

Segmentation records: one row per example with the image (clicks drawn:
green positive, red negative), the object mask (grey = ignore), and the
positive and negative distance maps (dark = near a click). Classification
records: a grid of images titled with their labels.
"""

import io
from typing import List

import numpy as np

from beam_prep import keys


def read_examples(records_dir: str, count: int) -> List[dict]:
  """The first `count` records of the train (then eval) split, decoded."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  files = []
  for split in (keys.TRAIN_SPLIT, keys.EVAL_SPLIT):
    files += sorted(tf.io.gfile.glob(f"{records_dir.rstrip('/')}/{split}-*{keys.RECORD_SUFFIX}*"))
  if not files:
    raise FileNotFoundError(f"no records under {records_dir}")
  out = []
  for path in files:
    comp = "GZIP" if path.endswith(".gz") else ""
    for raw in tf.data.TFRecordDataset(path, compression_type=comp).take(count - len(out)):
      out.append(_decode(tf.train.Example.FromString(raw.numpy())))
    if len(out) >= count:
      break
  return out


def _decode(example) -> dict:
  f = example.features.feature
  h, w = f[keys.HEIGHT].int64_list.value[0], f[keys.WIDTH].int64_list.value[0]
  ex = {
      "image_id": f[keys.IMAGE_ID].bytes_list.value[0].decode(),
      "image": np.frombuffer(f[keys.IMAGE].bytes_list.value[0], np.uint8).reshape(h, w, 3),
  }
  if keys.DISTANCE_MAPS in f:
    ex["maps"] = np.frombuffer(f[keys.DISTANCE_MAPS].bytes_list.value[0],
                               np.uint8).reshape(h, w, 2)
    ex["mask"] = np.frombuffer(f[keys.MASK].bytes_list.value[0], np.uint8).reshape(h, w)
    ex["positive"] = np.array(f[keys.POSITIVE_CLICKS].int64_list.value).reshape(-1, 2)
    ex["negative"] = np.array(f[keys.NEGATIVE_CLICKS].int64_list.value).reshape(-1, 2)
    ex["object_id"] = f[keys.OBJECT_ID].int64_list.value[0]
    ex["variant"] = f[keys.VARIANT].int64_list.value[0]
    ex["strategy"] = f[keys.NEGATIVE_STRATEGY].int64_list.value[0]
  else:
    ex["label"] = f[keys.LABEL].bytes_list.value[0].decode()
  return ex


def render(examples: List[dict]) -> bytes:
  """PNG bytes of the preview grid."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  if "maps" in examples[0]:
    rows, cols = len(examples), 4
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 2.4, rows * 2.4 + 0.4), squeeze=False)
    titles = ("image + clicks", "object mask", "positive distance", "negative distance")
    for r, ex in enumerate(examples):
      ax = axes[r]
      ax[0].imshow(ex["image"])
      for pts, colour in ((ex["positive"], "#00e000"), (ex["negative"], "#ff2020")):
        if len(pts):
          ax[0].scatter(pts[:, 0], pts[:, 1], s=22, c=colour, edgecolors="white", linewidths=0.8)
      mask = np.where(ex["mask"] == keys.IGNORE, 128, ex["mask"] * 255).astype(np.uint8)
      ax[1].imshow(mask, cmap="gray", vmin=0, vmax=255)
      ax[2].imshow(ex["maps"][..., 0], cmap="magma", vmin=0, vmax=255)
      ax[3].imshow(ex["maps"][..., 1], cmap="magma", vmin=0, vmax=255)
      for pts, a in ((ex["positive"], ax[2]), (ex["negative"], ax[3])):
        if len(pts):
          a.scatter(pts[:, 0], pts[:, 1], s=10, c="cyan", marker="x", linewidths=0.8)
      ax[0].set_ylabel(f"{ex['image_id']}\nobj {ex['object_id']} v{ex['variant']} "
                       f"s{ex['strategy']}", fontsize=7)
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
        a.imshow(examples[i]["image"])
        a.set_title(examples[i]["label"], fontsize=8)
      else:
        a.axis("off")
  fig.tight_layout()
  buf = io.BytesIO()
  fig.savefig(buf, format="png", dpi=80)
  plt.close(fig)
  return buf.getvalue()


def write_preview(records_dir: str, output: str, count: int = 6) -> str:
  """Reads `count` records and writes the preview PNG to `output` (local or gs://)."""
  from apache_beam.io.filesystems import FileSystems  # pylint: disable=g-import-not-at-top
  png = render(read_examples(records_dir, count))
  if "://" not in output:
    import os  # pylint: disable=g-import-not-at-top
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
  with FileSystems.create(output) as f:
    f.write(png)
  return output
