"""The page's practice mode: eval objects with their true masks, scored and
clicked as `beam-train evaluate` does (the field's protocol).

Opened from a prep output's eval split (`beam-train serve --data`), an
object shows its IoU with the truth after each click, and the page can ask
for the protocol's next click. This module is where the page meets
`train.evaluate`: the protocol's threshold, click budget and IoU target, the
eval objects, the IoU and the next click; the page itself calls the served
model and this module only.
"""

from typing import List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from train.evaluate import clicker, protocol

# The protocol's mask threshold, click budget and the IoU the page aims at.
THRESHOLD = clicker.PRED_THR
MAX_CLICKS = protocol.NOC_MAX_CLICKS
IOU_TARGET = max(protocol.NOC_IOU_THRESHOLDS)


def eval_objects(prep_dir: str, max_objects: int) -> Tuple[np.ndarray, np.ndarray, List[str]]:
  """(images, true masks, names) of a prep output's eval objects (`noc.eval_objects`)."""
  from beam_prep.prep_output import PrepOutput  # pylint: disable=g-import-not-at-top
  from train.evaluate.noc import eval_objects as objects  # pylint: disable=g-import-not-at-top

  return objects(PrepOutput(prep_dir), max_objects)


def iou(mask: np.ndarray, truth: np.ndarray) -> float:
  """The protocol's IoU of a mask with a true mask (its ignore pixels left out)."""
  return float(clicker.label_iou(tf.constant(mask[None]), tf.constant(truth[None]))[0])


def next_click(
  mask: np.ndarray, truth: np.ndarray, positive: Sequence, negative: Sequence
) -> Tuple[Optional[Tuple[int, int]], Optional[str]]:
  """The protocol's next click on the current mask: ((x, y), "positive" or
  "negative"), or (None, None) when it would not click (nothing left to fix)."""
  xy, kind = clicker.next_click_of(mask, truth, list(positive), list(negative))
  if xy is None:
    return None, None
  return tuple(xy), "positive" if kind == clicker.POSITIVE else "negative"
