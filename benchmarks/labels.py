"""Measures a save into the label store as the labels it holds grow.

  labels.save_ms_p50/p95     saving one new image (one object) into a store
                             that already holds `labels_fill` images, through
                             `train.serve.store.Labels.save` as the page does
                             (rows, image file, instance mask; the COCO
                             document is left to the writer thread)
  labels.save_ms_p50_empty   the same into an empty store
  labels.save_full_vs_empty  the p50s' ratio: a save must not grow with the store
  labels.document_ms         writing instances.json of the full store (the writer
                             thread does it beside the saves, after them)

The store is filled through the same `save`, one image at a time.
"""

import os
import statistics
import tempfile
import time
from typing import Any, Dict

import numpy as np

from benchmarks.common import log

SIZE = 64  # The images' side: the rows and files, not the pixels, are measured.


def _item(seed: int) -> Dict[str, Any]:
  from beam_prep.drawing import png  # pylint: disable=g-import-not-at-top
  from train.serve import exports  # pylint: disable=g-import-not-at-top

  image = np.random.default_rng(seed).integers(0, 255, (SIZE, SIZE, 3), dtype=np.uint8)
  return {
    "image": image,
    "name": f"image{seed}.png",
    "data": png(image),
    "digest": exports.digest(image),
  }


def _objects(seed: int):
  mask = np.zeros((SIZE, SIZE), bool)
  mask[seed % 32 : seed % 32 + 20, 10:40] = True
  return [{"mask": mask, "clicks": {"positive": [[20, seed % 32 + 5]], "negative": []}}]


def _save_ms(labels, first: int, repeats: int):
  """Milliseconds of `repeats` saves of new images (their items made beforehand)."""
  items = [(_item(s), _objects(s)) for s in range(first, first + repeats)]
  out = []
  for item, objects in items:
    t = time.perf_counter()
    labels.save(item, objects, model_version=1)
    out.append(1000 * (time.perf_counter() - t))
  return out


def bench_labels(workdir: str, fill: int, repeats: int) -> Dict[str, float]:
  """A save's milliseconds into an empty store and into one of `fill` images."""
  from train.serve.store import Labels  # pylint: disable=g-import-not-at-top

  root = tempfile.mkdtemp(prefix="labels_", dir=workdir)
  labels = Labels(os.path.join(root, "empty"))
  empty = _save_ms(labels, 10**6, repeats)
  labels.close()
  labels = Labels(os.path.join(root, "full"))
  for seed in range(fill):
    labels.save(_item(seed), _objects(seed), model_version=1)
  full = sorted(_save_ms(labels, 10**6, repeats))
  _save_ms(labels, 2 * 10**6, 1)  # A change the document does not hold yet.
  t = time.perf_counter()
  labels.flush()
  document_ms = 1000 * (time.perf_counter() - t)
  count = labels.count() - 1
  labels.close()
  figures = {
    "labels.fill": count - repeats,
    "labels.save_ms_p50": statistics.median(full),
    "labels.save_ms_p95": full[min(len(full) - 1, int(0.95 * len(full)))],
    "labels.save_ms_p50_empty": statistics.median(empty),
    "labels.document_ms": document_ms,
  }
  figures["labels.save_full_vs_empty"] = (
    figures["labels.save_ms_p50"] / figures["labels.save_ms_p50_empty"]
  )
  log(
    f"labels: a save into {count - repeats} images {figures['labels.save_ms_p50']:.1f} ms "
    f"(p95 {figures['labels.save_ms_p95']:.1f}), into none "
    f"{figures['labels.save_ms_p50_empty']:.1f} ms; its document {document_ms:.0f} ms"
  )
  return figures
