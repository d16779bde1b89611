"""The training step's on-the-fly augmentation (`beam-train fit --augment`).

  flip    a random left-right flip of the inputs and the task's per-pixel
          labels together (p 0.5)
  colour  the field's colour jitter of the image (RITM's recipe): brightness
          and contrast (-0.25..0.25 of the full range, contrast -0.15..0.4,
          p 0.75), then an RGB shift of up to 10 levels per channel (p 0.75),
          clipped to the pixel range

Both run in the step's graph on the transformed batch. Scale is not here: it
is the Beam job's crop jitter. The colour jitter is defined on pixel values
(0-255), and the image reaches the step transformed (standardized by the
tf.Transform graph), so `Colour` asks that graph, once, what it does to an
all-0, an all-128 and an all-255 image: for a transform affine in the pixel
values (the default preprocessing is; the middle image checks it),
`pixels = (x - offset) / scale` exactly.
"""

import dataclasses
from typing import Any, Callable, Dict, Tuple

import numpy as np

from beam_prep import keys

# TensorFlow is imported where it is used: `beam-train fit --help` and the
# config's check of --augment import this module.

AUGMENTATIONS = ("flip", "colour")
# The field's recipe has both; its budget is hundreds of epochs. Measured on
# COCO-MVal at 800 steps (docs/performance.md, "Real photographs"), the colour jitter cost
# the full recipe's NoC@85 10.2 -> 14.7, so it is the `field` preset's, not
# the default.
DEFAULT = "flip"


def parse(spec: str) -> Tuple[str, ...]:
  """`--augment` ('flip,colour', 'flip', 'none', '') -> the augmentations, in order.

  Raises:
    ValueError: an unknown name.
  """
  names = tuple(n.strip() for n in spec.split(",") if n.strip() and n.strip() != "none")
  unknown = [n for n in names if n not in AUGMENTATIONS]
  if unknown:
    raise ValueError(
      f"--augment: unknown {', '.join(unknown)}; give a comma-separated "
      f"subset of {', '.join(AUGMENTATIONS)}, or none"
    )
  return names


@dataclasses.dataclass(frozen=True)
class ColourJitter:
  """The field's colour jitter, in pixel levels of 0..`top`."""

  brightness: Tuple[float, float] = (-0.25, 0.25)  # times `top`, added
  contrast: Tuple[float, float] = (-0.15, 0.4)  # 1 + this, multiplied
  shift: float = 10.0  # per channel, added
  p: float = 0.75  # of each of the two
  top: float = 255.0

  def __call__(self, pixels, seed: int = 0):
    """float [B, H, W, C] pixel values -> the same, jittered per example."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    b = tf.shape(pixels)[0]

    def draw(shape, low, high, salt):
      return tf.random.uniform(shape, low, high, seed=seed + salt)

    def chosen(salt):
      return draw([b, 1, 1, 1], 0.0, 1.0, salt) < self.p

    alpha = 1.0 + draw([b, 1, 1, 1], *self.contrast, 1)
    beta = self.top * draw([b, 1, 1, 1], *self.brightness, 2)
    pixels = tf.where(chosen(3), pixels * alpha + beta, pixels)
    shift = draw([b, 1, 1, tf.shape(pixels)[-1]], -self.shift, self.shift, 4)
    pixels = tf.where(chosen(5), pixels + shift, pixels)
    return tf.clip_by_value(pixels, 0.0, self.top)


class Colour:
  """`ColourJitter` on the transformed image of a batch.

  Raises (at construction):
    ValueError: the table has no `image` model input, or its transform is not
      affine in the pixel values.
  """

  def __init__(
    self,
    table,
    transform: Callable,
    transform_keys,
    jitter: ColourJitter = ColourJitter(),
    seed: int = 0,
  ):
    if keys.IMAGE not in table.keys("model_input"):
      raise ValueError(
        "--augment colour jitters the 'image' model input, which these "
        "records do not have; give --augment flip or none"
      )
    from train.export.serving_inputs import probe_inputs  # pylint: disable=g-import-not-at-top

    points = {
      v: transform(probe_inputs(table, transform_keys, 1, {keys.IMAGE: [v]}))[keys.IMAGE].numpy()[0]
      for v in (0, 128, 255)
    }
    self.offset = points[0][0, 0].astype(np.float32)
    self.scale = ((points[255][0, 0] - self.offset) / jitter.top).astype(np.float32)
    affine = np.allclose(points[128], self.offset + 128 * self.scale, rtol=1e-3, atol=1e-3)
    if not affine or np.any(self.scale == 0):
      raise ValueError(
        "--augment colour needs a transform affine in the image's pixel "
        "values (the default preprocessing's standardization is); this one "
        "is not: give --augment flip or none"
      )
    self.jitter = jitter
    self.seed = seed

  def __call__(self, transformed: Dict[str, Any]) -> Dict[str, Any]:
    pixels = (transformed[keys.IMAGE] - self.offset) / self.scale
    image = self.jitter(pixels, self.seed) * self.scale + self.offset
    return dict(transformed, **{keys.IMAGE: image})


def flip(inputs, labels: Dict[str, Any], task, seed: int = 0):
  """A random left-right flip per example of the inputs and the task's labels."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  flipped = tf.random.uniform([tf.shape(inputs)[0], 1, 1, 1], seed=seed) < 0.5
  return tf.where(flipped, tf.reverse(inputs, axis=[2]), inputs), task.flip_labels(labels, flipped)
