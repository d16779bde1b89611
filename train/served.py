"""`ServedModel`: the one client of an exported model.

It finds the export (a model dir's newest `export/<version>/`, or that
folder itself), loads it once, and calls its signatures by the names
`train.signatures` declares. `beam-train predict`, `beam-train evaluate`
(`train.source_eval`), the page, the REST server (`train.serve.model`) and
the benchmarks all ask the model through it.

Calling a signature is safe from several threads at once.
"""

import re
from typing import Dict, Mapping, Optional

import numpy as np
import tensorflow as tf

from train import signatures as sig
from train.export import latest_export


class InvalidInput(ValueError):
  """The graph refused a request's inputs; the message is the graph's reason."""


def graph_message(e: Exception) -> str:
  """The reason in a graph error: an assertion's message, or its first line."""
  message = getattr(e, "message", str(e)).strip()
  asserted = re.search(r"assertion failed: \[([^\]]*)\]", message)
  if asserted:
    return asserted.group(1).strip()
  lines = [l for l in message.splitlines() if l.strip() and "Graph execution" not in l]
  return lines[0].strip() if lines else message


def _clicks(points):
  """Clicks as [N, 2]: a tensor as it is, a list of (x, y) pairs (or none) reshaped."""
  return points if tf.is_tensor(points) else np.reshape(np.asarray(points), (-1, 2))


class ServedModel:
  """One loaded export.

  Args:
    model: a model dir (its newest export) or one export folder.

  Raises:
    FileNotFoundError: no SavedModel there (`latest_export`'s message).
  """

  def __init__(self, model: str):
    self.path = latest_export(model)
    self._loaded = tf.saved_model.load(self.path)  # Holds the variables the signatures use.
    self._functions = dict(self._loaded.signatures)
    self.signatures: Dict[str, Dict[str, tf.TensorSpec]] = {
        k: dict(fn.structured_input_signature[1]) for k, fn in self._functions.items()}

  def takes(self, signature: str, *names: str) -> bool:
    """Whether the export has `signature` and it takes inputs `names`."""
    return sig.takes(self.signatures.get(signature, {}), *names)

  @property
  def segments(self) -> bool:
    """Whether `serving_default` takes an image and clicks (a segmentation model)."""
    return self.takes(sig.SERVING_DEFAULT, *sig.CLICK_INPUTS)

  @property
  def classifies(self) -> bool:
    """Whether `serving_default` takes encoded images (a classification model)."""
    return self.takes(sig.SERVING_DEFAULT, sig.IMAGE_BYTES)

  def require_segmentation(self) -> None:
    """Raises ValueError unless this is a segmentation model."""
    if not self.segments:
      raise ValueError(f"{self.path}: {sig.SERVING_DEFAULT} does not take an image and clicks "
                       "(not a segmentation model)")

  def call(self, signature: str, inputs: Mapping[str, object]) -> Dict[str, tf.Tensor]:
    """Runs one signature on tensors or arrays (cast to its input dtypes).

    Raises:
      InvalidInput: the graph refused the inputs (its reason).
    """
    specs = self.signatures[signature]
    try:
      return self._functions[signature](**{k: tf.cast(v, specs[k].dtype) if tf.is_tensor(v)
                                           else tf.constant(v, dtype=specs[k].dtype)
                                           for k, v in inputs.items()})
    except (tf.errors.InvalidArgumentError, ValueError, TypeError) as e:
      raise InvalidInput(graph_message(e)) from None

  def predict(self, signature: str, inputs: Mapping[str, object]) -> Dict[str, np.ndarray]:
    """`call`, with numpy outputs."""
    return {k: v.numpy() for k, v in self.call(signature, inputs).items()}

  def segment_inputs(self, image, positive, negative, previous=None):
    """(signature, inputs) for one image and its clicks: `serve_iterative`
    with the previous mask when one is given and the export has it,
    `serving_default` otherwise."""
    inputs = {sig.IMAGE: image, sig.POSITIVE_CLICKS: _clicks(positive),
              sig.NEGATIVE_CLICKS: _clicks(negative)}
    if previous is not None and self.takes(sig.SERVE_ITERATIVE, sig.PREVIOUS_MASK):
      return sig.SERVE_ITERATIVE, dict(inputs, **{sig.PREVIOUS_MASK: previous})
    return sig.SERVING_DEFAULT, inputs

  def segment(self, image, positive, negative,
              previous: Optional[object] = None) -> Dict[str, np.ndarray]:
    """A segmentation model's outputs for one image and its clicks (numpy)."""
    return self.predict(*self.segment_inputs(image, positive, negative, previous))

  def probabilities(self, image, positive, negative, previous=None) -> tf.Tensor:
    """float32 [H, W]: the object probabilities for one image and its clicks (a tensor)."""
    return self.call(*self.segment_inputs(image, positive, negative, previous))[
        sig.PROBABILITIES]

  def classify(self, image_bytes) -> Dict[str, np.ndarray]:
    """A classification model's outputs for encoded images [B]."""
    return self.predict(sig.SERVING_DEFAULT, {sig.IMAGE_BYTES: image_bytes})
