"""Measures sampling clicks and building both distance maps against the reference.

clicks.ms_per_sample       one object, one variant, 512x512: sampling + both maps
clicks.reference_ms_per_sample   a full distance transform after every click
"""

from typing import Dict

import numpy as np

from benchmarks.common import log, median_rate


def bench_clicks(repeats: int) -> Dict[str, float]:
  """Sampling + both maps for one (object, variant) at 512x512, vs the reference."""
  from scipy import ndimage  # pylint: disable=g-import-not-at-top
  from beam_prep import keys  # pylint: disable=g-import-not-at-top
  from beam_prep.ops.clicks import sample_clicks  # pylint: disable=g-import-not-at-top
  from beam_prep.ops.distance import distance_maps  # pylint: disable=g-import-not-at-top
  from beam_prep.sample_data import make_scene  # pylint: disable=g-import-not-at-top

  objects = []
  for i in range(4):
    _, inst = make_scene(7, i, (512, 512))
    for oid in sorted(set(np.unique(inst).tolist()) - {0, 255}):
      mask = np.where(inst == oid, 1, np.where(inst == keys.IGNORE, keys.IGNORE, 0))
      objects.append(
        {
          "image_id": f"s{i}",
          "object_id": oid,
          "mask": mask.astype(np.uint8),
          "instance_mask": inst,
        }
      )
  op = sample_clicks(variants=1)

  def ours():
    for ex in objects:
      try:
        s = op(ex)[0]
      except Exception:  # pylint: disable=broad-except
        continue  # objects too small for clicks cost the same in both
      distance_maps(s["positive_clicks"], s["negative_clicks"], 512, 512)
    return len(objects)

  samples = []
  for ex in objects:
    try:
      samples.append(op(ex)[0])
    except Exception:  # pylint: disable=broad-except
      pass

  def reference():
    # Public reimplementations: after every click, a full exact distance
    # transform of the click image, for each of the two maps.
    for s in samples:
      for kind in ("positive_clicks", "negative_clicks"):
        grid = np.ones((512, 512), bool)
        for x, y in s[kind]:
          grid[y, x] = False
          ndimage.distance_transform_edt(grid)
    return len(samples)

  ours()  # warm-up
  ms = 1000.0 / median_rate(ours, repeats)
  ref = 1000.0 / median_rate(reference, max(1, repeats // 2))
  log(f"clicks: {ms:.1f} ms/sample, reference {ref:.1f} ms")
  return {
    "clicks.ms_per_sample": ms,
    "clicks.reference_ms_per_sample": ref,
    "clicks.objects": len(objects),
  }
