"""`ServedModel`: the one client of an exported model.

It finds the export (a model dir's newest `export/<version>/`, or that
folder itself), loads it once, and calls its signatures by the names
`train.export.signatures` declares. `beam-train predict`, `beam-train evaluate`
(`train.evaluate.source_eval`), the page, the REST server (`train.serve.model`) and
the benchmarks all ask the model through it.

A request's image is decoded (`decode_image`) and its clicks clamped into
it (`clamp`) here, the same for each of them. Calling a signature is safe
from several threads at once.
"""

import re
from typing import Dict, Mapping, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from beam_prep import keys
from beam_prep.ops.image import decode_file
from beam_prep.ops.registry import ExampleError
from train.export import signatures as sig
from train.export.saved_model import latest_export


class InvalidInput(ValueError):
  """The graph refused a request's inputs; the message is the graph's reason."""


def decode_image(data: bytes, name: str, max_pixels: int = keys.MAX_PIXELS) -> np.ndarray:
  """Decodes an encoded image to uint8 RGB as displayed, by the Beam job's
  decoder (EXIF orientation applied, decompression bombs refused), or raises
  ValueError naming `name` and the reason."""
  try:
    return decode_file(data, max_pixels)
  except ExampleError as e:
    raise ValueError(f"cannot read image {name}: {e.detail or e.reason}") from None


def clamp(points: Sequence[Tuple[int, int]], width: int, height: int):
  """Points clamped into the image, and those that had to move."""
  out, moved = [], []
  for x, y in points:
    cx, cy = min(max(x, 0), width - 1), min(max(y, 0), height - 1)
    if (cx, cy) != (x, y):
      moved.append((x, y))
    out.append((cx, cy))
  return out, moved


def graph_message(e: Exception) -> str:
  """The reason in a graph error, in one line: an assertion's message, a
  tf.Example parse error naming its feature (`parse_message`), or the
  error's own line (not where it was detected)."""
  message = getattr(e, "message", str(e)).strip()
  # An assertion's data items print as "[...]": the message, then the condition.
  asserted = re.search(r"assertion failed: \[(.*?)\](?: \[|\n|$)", message)
  if asserted:
    return re.sub(r"\\(['\"\\])", r"\1", asserted.group(1)).strip()  # C-escaped
  parsed = parse_message(message)
  if parsed:
    return parsed
  # Not the frame: "Detected at node ...", its stack (indented), "[[{{node ...}}]]".
  lines = [
    re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", line).strip()
    for line in message.splitlines()
    if line.strip()
    and not line[0].isspace()
    and not line.startswith(("Graph execution error", "Detected at node", "<stack traces"))
  ]
  return lines[0] if lines else message


# Where a graph error names the decoder of an encoded image that failed
# (DecodeJpeg, DecodePng, DecodeImage, ...).
_DECODE_NODE = re.compile(r"Detected at node '?[\w/]*Decode[A-Z]\w*")

# ParseExample's reasons (`serve_examples` parses its input with it).
_TYPE = re.compile(
  r"Key: (\w+), Index: (\d+)\.\s+Data types don't match\. "
  r"Expected type: (\w+), Actual type: (\w+)"
)
_MISSING = re.compile(r"Feature: (\w+) \(data type: (\w+)\) is required but could not be found")


def parse_message(message: str) -> Optional[str]:
  """A tf.Example parse error of `serve_examples` said in one line naming the
  feature and why, or None for another error. Bytes where numbers are read
  is what beam-prep's own records give (their per-variant features stacked
  as one bytes value per variant)."""
  wrong = _TYPE.search(message)
  if wrong:
    key, index, want, got = wrong.groups()
    where = (
      f"{sig.EXAMPLES}[{index}]: feature {key!r} holds {got} values where "
      f"{sig.SERVE_EXAMPLES} reads {want}"
    )
    if got != "string":
      return where
    return (
      f"{where}: beam-prep's records stack an object's click variants, one bytes value "
      f"each; {sig.SERVE_EXAMPLES} takes one (object, variant) per tf.Example, as "
      "RecordCodec.encode writes it (RecordCodec.decode_examples gives a record's "
      "examples)"
    )
  missing = _MISSING.search(message)
  if missing:
    return (
      f"{sig.EXAMPLES}: an example has no feature {missing.group(1)!r} "
      f"({missing.group(2)}), which {sig.SERVE_EXAMPLES} reads (is it a serialized "
      "tf.Example in the records' schema?)"
    )
  if "Could not parse example input" in message:
    return _NOT_AN_EXAMPLE
  return None


_NOT_AN_EXAMPLE = f"{sig.EXAMPLES}: a value is not a serialized tf.Example"


def as_clicks(points):
  """Clicks as [N, 2]: a tensor as it is, a list of (x, y) pairs (or none) reshaped."""
  return points if tf.is_tensor(points) else np.reshape(np.asarray(points), (-1, 2))


def _box(box) -> np.ndarray:
  """A box prompt as int32 [4] (x0, y0, x1, y1).

  Raises:
    InvalidInput: it is not four numbers.
  """
  try:
    arr = np.asarray(box, np.float64).reshape(4)
  except (TypeError, ValueError):
    arr = None
  if arr is None or not np.isfinite(arr).all():
    raise InvalidInput(f"{sig.BOX}: must be four numbers [x0, y0, x1, y1], got {box!r}"[:300])
  limit = np.iinfo(np.int32)
  return np.clip(np.round(arr), limit.min, limit.max).astype(np.int32)


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
      k: dict(fn.structured_input_signature[1]) for k, fn in self._functions.items()
    }

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
      raise ValueError(
        f"{self.path}: {sig.SERVING_DEFAULT} does not take an image and clicks "
        "(not a segmentation model)"
      )

  def call(self, signature: str, inputs: Mapping[str, object]) -> Dict[str, tf.Tensor]:
    """Runs one signature on tensors or arrays (cast to its input dtypes).

    Raises:
      InvalidInput: the graph refused the inputs (its reason).
    """
    specs = self.signatures[signature]
    try:
      return self._functions[signature](
        **{
          k: tf.cast(v, specs[k].dtype) if tf.is_tensor(v) else tf.constant(v, dtype=specs[k].dtype)
          for k, v in inputs.items()
        }
      )
    except UnicodeDecodeError:
      # TensorFlow cannot make text of an error that echoes an input's bytes:
      # of the graph's errors, only the parser of `examples` does.
      raise InvalidInput(
        _NOT_AN_EXAMPLE
        if sig.EXAMPLES in specs
        else "the graph refused the inputs (its reason is not text)"
      ) from None
    except (tf.errors.InvalidArgumentError, ValueError, TypeError) as e:
      message = graph_message(e)
      if sig.IMAGE_BYTES in specs and _DECODE_NODE.search(str(e)):
        message = f"{sig.IMAGE_BYTES}: an image file that does not decode whole ({message})"
      raise InvalidInput(message) from None

  def predict(self, signature: str, inputs: Mapping[str, object]) -> Dict[str, np.ndarray]:
    """`call`, with numpy outputs."""
    return {k: v.numpy() for k, v in self.call(signature, inputs).items()}

  def segment_inputs(self, image, positive, negative, previous=None, box=None):
    """(signature, inputs) for one image and its clicks: `serve_iterative`
    with the previous mask when one is given and the export has it,
    `serving_default` otherwise; with a box prompt (x0, y0, x1, y1),
    `serve_box_iterative` or `serve_box`."""
    inputs = {
      sig.IMAGE: image,
      sig.POSITIVE_CLICKS: as_clicks(positive),
      sig.NEGATIVE_CLICKS: as_clicks(negative),
    }
    if box is not None:
      return self._box_inputs(inputs, box, previous)
    if previous is not None and self.takes(sig.SERVE_ITERATIVE, sig.PREVIOUS_MASK):
      return sig.SERVE_ITERATIVE, dict(inputs, **{sig.PREVIOUS_MASK: previous})
    return sig.SERVING_DEFAULT, inputs

  def _box_inputs(self, inputs, box, previous):
    """`segment_inputs` with a box prompt."""
    self.require_box()
    inputs = dict(inputs, **{sig.BOX: _box(box)})
    if previous is not None:
      return sig.SERVE_BOX_ITERATIVE, dict(inputs, **{sig.PREVIOUS_MASK: previous})
    return sig.SERVE_BOX, inputs

  @property
  def takes_box(self) -> bool:
    """Whether the export takes box prompts (`serve_box`)."""
    return self.takes(sig.SERVE_BOX_ITERATIVE, sig.BOX)

  def require_box(self) -> None:
    """Raises InvalidInput unless the export takes box prompts."""
    if not self.takes_box:
      raise InvalidInput(
        f"{sig.BOX}: this model takes no box ({self.path} has no {sig.SERVE_BOX} signature: "
        "it was exported before box prompts; export it again with beam-train export)"
      )

  def encoded_inputs(self, image_bytes: bytes, positive, negative, previous=None, box=None):
    """(signature, inputs) for one encoded image file (PNG, JPEG, ...) and its
    clicks, a batch of one: `serve_iterative_encoded` with the previous mask,
    `serve_box_encoded` with a box prompt, `serve_encoded` otherwise. The
    outputs are PNG files [1] (`mask_bytes`, `probabilities_bytes`)."""
    inputs = {
      sig.IMAGE_BYTES: [image_bytes],
      sig.POSITIVE_CLICKS: as_clicks(positive)[None],
      sig.NEGATIVE_CLICKS: as_clicks(negative)[None],
    }
    if box is not None and previous is not None:
      raise ValueError(f"the encoded signatures take a {sig.BOX} or a previous mask, not both")
    if box is not None:
      self.require_box()
      return sig.SERVE_BOX_ENCODED, dict(inputs, **{sig.BOX: _box(box)[None]})
    if previous is not None:
      return sig.SERVE_ITERATIVE_ENCODED, dict(inputs, **{sig.PREVIOUS_MASK: previous[None]})
    return sig.SERVE_ENCODED, inputs

  def segment(self, image, positive, negative, previous=None, box=None) -> Dict[str, np.ndarray]:
    """A segmentation model's outputs for one image and its clicks (numpy)."""
    return self.predict(*self.segment_inputs(image, positive, negative, previous, box))

  def probabilities(self, image, positive, negative, previous=None, box=None) -> tf.Tensor:
    """float32 [H, W]: the object probabilities for one image and its clicks (a tensor)."""
    return self.call(*self.segment_inputs(image, positive, negative, previous, box))[
      sig.PROBABILITIES
    ]

  def classify(self, image_bytes) -> Dict[str, np.ndarray]:
    """A classification model's outputs for encoded images [B]."""
    return self.predict(sig.SERVING_DEFAULT, {sig.IMAGE_BYTES: image_bytes})
