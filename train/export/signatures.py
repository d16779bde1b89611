"""The exported model's signatures: names, inputs and outputs, declared once.

The servers (`train.export.servers`) trace their `tf.function`s with these specs,
and every client (`train.export.served.ServedModel`: predict, evaluate, the page,
the REST server, the benchmarks) names inputs and outputs from here. An
input's name is the raw feature it stands for (`beam_prep.keys`), except
`examples`, TFX's name for serialized tf.Examples. `_SPECS` declares one
example's input; a batched signature takes a batch of them (`specs(...,
batch=True)`: a first dimension of any size).

Segmentation (one image per call, or a batch [B]):
  serving_default          image, positive_clicks, negative_clicks
  serve_iterative          the same and previous_mask
  serve_encoded            [B] image_bytes, positive_clicks, negative_clicks
  serve_iterative_encoded  [B] the same and previous_mask
  serve_box                image, box, positive_clicks, negative_clicks
  serve_box_iterative      the same and previous_mask
  serve_box_encoded        [B] image_bytes, box, positive_clicks, negative_clicks
  serve_examples           [B] examples
  box                      int32 [4]: x0, y0, x1, y1, the object's box in the
                           image's pixels, corners included: the mask is 0
                           outside it; with no positive click, its centre is
                           one; object-crop models crop the box with its
                           context (`ServingSide.prepare_box`).
  outputs                  probabilities float32, mask uint8 (probability > PRED_THR);
                           the encoded signatures: mask_bytes and
                           probabilities_bytes, string [B], one PNG each
Classification:
  serving_default          [B] image_bytes
  outputs                  probabilities, label, classes
"""

import tensorflow as tf

from beam_prep import keys

SERVING_DEFAULT = "serving_default"
SERVE_ITERATIVE = "serve_iterative"
SERVE_EXAMPLES = "serve_examples"
SERVE_ENCODED = "serve_encoded"
SERVE_ITERATIVE_ENCODED = "serve_iterative_encoded"
SERVE_BOX = "serve_box"
SERVE_BOX_ITERATIVE = "serve_box_iterative"
SERVE_BOX_ENCODED = "serve_box_encoded"

# Inputs.
IMAGE = keys.IMAGE
POSITIVE_CLICKS = keys.POSITIVE_CLICKS
NEGATIVE_CLICKS = keys.NEGATIVE_CLICKS
PREVIOUS_MASK = keys.PREVIOUS_MASK
EXAMPLES = "examples"
IMAGE_BYTES = keys.IMAGE_BYTES
BOX = "box"

# Outputs.
PROBABILITIES = "probabilities"
MASK = "mask"
# The encoded signatures' outputs, one PNG file per image (greyscale uint8):
# the mask as 0 / 255, the probabilities as grey levels round(p * 255). Their
# names end in "_bytes", so TF Serving's REST writes them as {"b64": ...}.
MASK_BYTES = "mask_bytes"
PROBABILITIES_BYTES = "probabilities_bytes"
ENCODED_OUTPUTS = (MASK_BYTES, PROBABILITIES_BYTES)
LABEL = "label"
CLASSES = "classes"

# Why a segmentation request is refused (the graph's assertions; the portable
# files' runtime, `train.export.portable_model`, checks the same before a call).
EMPTY_IMAGE = f"{IMAGE}: the image is empty"
NO_POSITIVE_CLICK = f"{POSITIVE_CLICKS}: at least one positive click is required (or a box)"
PREVIOUS_MASK_SIZE = f"{PREVIOUS_MASK}: must have the image's height and width"

_SPECS = {
  IMAGE: tf.TensorSpec([None, None, 3], tf.uint8, name=IMAGE),
  POSITIVE_CLICKS: tf.TensorSpec([None, 2], tf.int32, name=POSITIVE_CLICKS),
  NEGATIVE_CLICKS: tf.TensorSpec([None, 2], tf.int32, name=NEGATIVE_CLICKS),
  PREVIOUS_MASK: tf.TensorSpec([None, None], tf.uint8, name=PREVIOUS_MASK),
  EXAMPLES: tf.TensorSpec([], tf.string, name=EXAMPLES),
  IMAGE_BYTES: tf.TensorSpec([], tf.string, name=IMAGE_BYTES),
  BOX: tf.TensorSpec([4], tf.int32, name=BOX),
}

# The inputs that carry clicks, one [x, y] row each (the server caps their
# rows per request, `beam-train serve --max-clicks`).
CLICKS = (POSITIVE_CLICKS, NEGATIVE_CLICKS)
# The inputs of a segmentation request: one image and its clicks.
CLICK_INPUTS = (IMAGE,) + CLICKS
# The same with the image as an encoded file (PNG, JPEG, ...).
ENCODED_CLICK_INPUTS = (IMAGE_BYTES,) + CLICKS


def specs(*names: str, batch: bool = False):
  """The input signature of a tf.function taking inputs `names`, in order;
  with `batch`, each with a first dimension of any size in front."""
  if not batch:
    return [_SPECS[n] for n in names]
  return [tf.TensorSpec([None] + _SPECS[n].shape.as_list(), _SPECS[n].dtype, name=n) for n in names]


def is_batched(name: str, spec: tf.TensorSpec) -> bool:
  """Whether a signature's input `name` of `spec` takes a batch of examples
  (`specs(..., batch=True)`: one dimension in front of one example's)."""
  one = _SPECS.get(name)
  return one is not None and spec.shape.rank == one.shape.rank + 1


def takes(inputs, *names: str) -> bool:
  """Whether a signature's inputs (names, or a dict by name) hold all of `names`."""
  return set(names) <= set(inputs)
