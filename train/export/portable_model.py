"""`PortableModel`: a TFLite or ONNX file of `train.export.portable`, called as
`ServedModel` is, and `open_model`, which opens either.

A TFLite file runs in LiteRT, an ONNX file in onnxruntime
(`train.export.portable.runner`). Neither format keeps the graph's assertions, so a request is
checked here first, with the SavedModel's messages (`train.export.signatures`).
One call at a time: calls from several threads wait for each other.
"""

import os
import threading
from typing import Dict, Mapping

import numpy as np

from train.export import portable
from train.export import signatures as sig
from train.export.served import InvalidInput, ServedModel, as_clicks


def open_model(path: str, threads: int = 0):
  """A `PortableModel` for a .tflite or .onnx file, else a `ServedModel`
  (a model dir or an export folder)."""
  if path.lower().endswith(tuple(portable.SUFFIXES.values())):
    return PortableModel(path, threads)
  return ServedModel(path)


class PortableModel:
  """One portable file (`serving_default` or `serve_iterative`).

  Args:
    path: a .tflite or .onnx file.
    threads: threads of the runtime (0: its default, every core).

  Raises:
    FileNotFoundError: no file there.
    ValueError: not a portable file of a segmentation model.
  """

  segments, classifies, takes_box = True, False, False

  def __init__(self, path: str, threads: int = 0):
    if not os.path.isfile(path):
      raise FileNotFoundError(f"no model file at {path}")
    self.path = path
    try:
      self._run, self.inputs = portable.runner(path, threads)
    except Exception as e:  # pylint: disable=broad-except
      # The runtimes' own errors too (onnxruntime's InvalidProtobuf for a cut file, ...).
      raise ValueError(f"cannot load {path}: {type(e).__name__}: {e}") from None
    if not set(sig.CLICK_INPUTS) <= set(self.inputs):
      raise ValueError(f"{path}: takes {self.inputs}, not an image and clicks")
    self._lock = threading.Lock()

  def require_segmentation(self) -> None:
    """A portable file is a segmentation model (`__init__` checked)."""

  def run(self, inputs: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """The file's outputs for `inputs` (by name, of the signature's dtypes)."""
    with self._lock:
      return {k: np.asarray(v) for k, v in self._run(inputs).items()}

  def segment(self, image, positive, negative, previous=None, box=None) -> Dict[str, np.ndarray]:
    """Outputs for one image and its clicks, as `ServedModel.segment`.

    Raises:
      InvalidInput: a box, or a request the SavedModel would refuse (its message).
    """
    if box is not None:
      raise InvalidInput(f"{sig.BOX}: {self.path} takes no box; the SavedModel's serve_box does")
    image = np.asarray(image, np.uint8)
    inputs = {
      sig.IMAGE: image,
      sig.POSITIVE_CLICKS: np.asarray(as_clicks(positive), np.int32).reshape(-1, 2),
      sig.NEGATIVE_CLICKS: np.asarray(as_clicks(negative), np.int32).reshape(-1, 2),
    }
    if sig.PREVIOUS_MASK in self.inputs:
      shape = image.shape[:2]
      inputs[sig.PREVIOUS_MASK] = (
        np.zeros(shape, np.uint8) if previous is None else np.asarray(previous, np.uint8)
      )
    elif previous is not None and np.any(previous):
      raise InvalidInput(
        f"{sig.PREVIOUS_MASK}: {self.path} takes none; {sig.SERVE_ITERATIVE}'s file does"
      )
    _check(inputs)
    return self.run(inputs)

  def probabilities(self, image, positive, negative, previous=None, box=None) -> np.ndarray:
    """float32 [H, W]: the object probabilities for one image and its clicks."""
    return self.segment(image, positive, negative, previous, box)[sig.PROBABILITIES]


def _check(inputs: Mapping[str, np.ndarray]) -> None:
  """Raises InvalidInput for a request the SavedModel's assertions refuse."""
  image = inputs[sig.IMAGE]
  if image.ndim != 3 or image.shape[2] != 3:
    raise InvalidInput(f"{sig.IMAGE}: must be [height, width, 3], got {list(image.shape)}")
  if image.shape[0] * image.shape[1] == 0:
    raise InvalidInput(sig.EMPTY_IMAGE)
  if not len(inputs[sig.POSITIVE_CLICKS]):
    raise InvalidInput(sig.NO_POSITIVE_CLICK)
  previous = inputs.get(sig.PREVIOUS_MASK)
  if previous is not None and previous.shape != image.shape[:2]:
    raise InvalidInput(sig.PREVIOUS_MASK_SIZE)
