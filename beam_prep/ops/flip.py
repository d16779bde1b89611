"""Mirrored views: every other click variant flipped left-right.

`flip_variants` runs after `sample_clicks`: variants whose index is odd are
mirrored (image, object mask, instance mask and their clicks, x -> W - 1 - x),
so half of the precomputed variants are flipped views. Records carry
`flipped` (0 or 1). At serving time no view is flipped: the twin passes the
example unchanged.
"""

import numpy as np

from beam_prep import keys
from beam_prep.features import Feature
from beam_prep.ops.clicks import CLICKS
from beam_prep.ops.image import IMAGE, MASK
from beam_prep.ops.registry import register_op

_CLICK_KEYS = (keys.POSITIVE_CLICKS, keys.NEGATIVE_CLICKS)


def flip_variants_twin(ex, *args, **kwargs):
  del args, kwargs
  return ex


def mirror(ex, width: int):
  """The example mirrored left-right: its pixels and its clicks."""
  out = dict(ex)
  for k in (keys.IMAGE, keys.MASK, keys.INSTANCE_MASK):
    if ex.get(k) is not None:
      out[k] = np.ascontiguousarray(ex[k][:, ::-1])
  for k in _CLICK_KEYS:
    clicks = np.asarray(ex[k], np.int64).reshape(-1, 2).copy()
    clicks[:, 0] = width - 1 - clicks[:, 0]
    out[k] = clicks
  return out


@register_op(
  "flip_variants",
  reads=(keys.IMAGE, keys.MASK, keys.VARIANT) + _CLICK_KEYS,
  produces={
    keys.IMAGE: IMAGE,
    keys.MASK: MASK,
    keys.FLIPPED: Feature("int64", shape=(), role="metadata"),
    keys.POSITIVE_CLICKS: CLICKS,
    keys.NEGATIVE_CLICKS: CLICKS,
  },
  intermediate=(keys.INSTANCE_MASK,),
  twin=flip_variants_twin,
)
def flip_variants(every: int = 2):
  """Mirrors the variants whose index is `every - 1` modulo `every` (odd ones by default)."""
  if every < 1:
    raise ValueError(f"every must be >= 1, got {every}")

  def fn(ex):
    flipped = int(ex[keys.VARIANT]) % every == every - 1
    out = mirror(ex, ex[keys.IMAGE].shape[1]) if flipped else dict(ex)
    out[keys.FLIPPED] = int(flipped)
    return out

  return fn
