"""TensorFlow Serving's REST predict format: JSON in, tensors, JSON out.

Request (`POST /v1/models/NAME[/versions/V]:predict`), as TF Serving reads it
(`tensorflow_serving/util/json_tensor.cc`):

  {"signature_name": "serving_default",        optional
   "inputs": {"image": [[[r, g, b], ...], ...], "positive_clicks": [[x, y]],
              "negative_clicks": []}}         columnar: one tensor per input
  {"signature_name": "serve_encoded",
   "instances": [{"image_bytes": {"b64": "<a PNG or JPEG file>"},
                  "positive_clicks": [[x, y]], "negative_clicks": []}]}
                                               row: instance i is row i of
                                               every input (a batch dimension
                                               is added in front)

Columnar answers `{"outputs": {name: tensor}}`, row `{"predictions": [{name:
row i}, ...]}` (a bare value instead of the object when the signature has one
input or one output, as TF Serving does). Integers are JSON numbers, float32
values the shortest text that reads back to the same float32, strings text,
or `{"b64": ...}` for inputs of a string tensor and outputs named `*_bytes`.

The row format and an unbatched signature: TF Serving stacks the instances
into a new first dimension, so one instance of `serving_default` becomes an
image [1, H, W, 3] that the graph refuses ("input must be 4-dimensional"):
that signature takes the columnar form only, on TF Serving and here. This
server refuses such a request before running the model, with a 400 that
names the input and says to send "inputs". The row format is for the batched
signatures, `serve_encoded`, `serve_iterative_encoded` and `serve_examples`
(which take the columnar form too, a batch in each input).

Checked before the model runs, each a 400 `{"error": ...}` naming the field:
not JSON, not an object, both or neither of "inputs"/"instances", an unknown
signature, a missing or unknown input, a value of the wrong type (a float or
a bool for an integer tensor), ragged lists, a rank or fixed dimension the
signature does not take, and integers outside the dtype's range (TF Serving
wraps those silently). One leniency copied from TF Serving: an empty list
(`[]`, `[[]]`) for an input of higher rank is an empty tensor of the
signature's inner dimensions (`"negative_clicks": []`, zero rows; in an
instance, zero rows of that instance), which TF Serving's graph accepts too.

Limits of this server, checked before the values are converted or the model
runs, each a 400 naming its flag: JSON nested deeper than
`json_arrays.MAX_DEPTH`, more clicks in a request (the rows of the inputs
`train.export.signatures.CLICKS` names, over all instances) than --max-clicks, an
image of more pixels than --max-pixels (an encoded `image_bytes` by the size
its header declares, before it is decoded; a file of a format the graph does
not decode is refused there too).
"""

import base64
import binascii
import json
from typing import Any, Dict, Mapping, Sequence, Tuple

import numpy as np
import orjson
import tensorflow as tf

from beam_prep.ops.image import declared_pixels
from train.export import signatures as sig
from train.serve.json_arrays import TooDeep, loads


class RequestError(Exception):
  """A request the server refuses; `status` is the HTTP status (400: the
  request is wrong, 404: no such model or version)."""

  def __init__(self, message: str, status: int = 400):
    super().__init__(message)
    self.status = status


def _as_string_tensor(name: str, value) -> np.ndarray:
  """Nested lists of str or {"b64": ...} -> an object array of bytes."""

  def one(v):
    if isinstance(v, str):
      try:
        return v.encode("utf-8")
      except UnicodeEncodeError:
        raise RequestError(f"{name}: a string that is no UTF-8 text (a lone surrogate)") from None
    if isinstance(v, dict) and set(v) == {"b64"} and isinstance(v["b64"], str):
      try:
        return base64.b64decode(v["b64"], validate=True)
      except (binascii.Error, ValueError):
        raise RequestError(f"{name}: the b64 value is not base64") from None
    raise RequestError(
      f'{name}: expected strings or {{"b64": ...}} objects, got {type(v).__name__}'
    )

  def walk(v):
    return [walk(x) for x in v] if isinstance(v, list) else one(v)

  try:
    arr = np.array(walk(value), dtype=object)
  except ValueError:
    raise RequestError(f"{name}: the lists are ragged (a tensor needs equal lengths)") from None
  return arr


def _as_numeric_tensor(name: str, value, dtype: tf.DType) -> np.ndarray:
  """Nested lists (or an int64 ndarray from the fast parser) -> numpy of `dtype`."""
  try:
    arr = value if isinstance(value, np.ndarray) else np.array(value)
  except ValueError:
    raise RequestError(f"{name}: the lists are ragged (a tensor needs equal lengths)") from None
  want = dtype.as_numpy_dtype
  if arr.size == 0:
    return arr.astype(want)
  kind = arr.dtype.kind
  if dtype.is_bool:
    ok = kind == "b"
  elif dtype.is_integer:
    ok = kind in "iu"
  else:
    ok = kind in "iuf"
  if not ok and dtype.is_integer and kind in "fO" and _integers_only(value):
    info = np.iinfo(want)  # Integers no numpy type holds together: past int64.
    raise RequestError(
      f"{name}: values must be within {info.min}..{info.max} for {dtype.name}, got larger ones"
    )
  if not ok:
    what = {
      "b": "booleans",
      "f": "numbers with a fraction",
      "U": "strings",
      "O": "mixed values or objects",
    }.get(kind, arr.dtype.name)
    raise RequestError(f"{name}: expected {dtype.name} values, got {what}")
  if dtype.is_integer:
    info = np.iinfo(want)
    if arr.min() < info.min or arr.max() > info.max:
      raise RequestError(
        f"{name}: values must be within {info.min}..{info.max} for "
        f"{dtype.name}, got {arr.min()}..{arr.max()}"
      )
  return arr.astype(want, copy=False)


def _integers_only(value: Any) -> bool:
  if isinstance(value, list):
    return all(_integers_only(v) for v in value)
  return isinstance(value, int) and not isinstance(value, bool)


def to_tensor(name: str, value: Any, spec: tf.TensorSpec) -> np.ndarray:
  """One input's JSON value -> numpy array of the spec's dtype and a shape the
  spec takes, or RequestError naming the input."""
  if spec.dtype == tf.string:
    arr = _as_string_tensor(name, value)
  else:
    arr = _as_numeric_tensor(name, value, spec.dtype)
  arr = _empty_as(arr, spec)
  dims = spec.shape.as_list() if spec.shape.rank is not None else None
  if dims is not None and not spec.shape.is_compatible_with(arr.shape):
    raise RequestError(
      f"{name}: shape {list(arr.shape)} does not fit the signature's "
      f"{[-1 if d is None else d for d in dims]} ({spec.dtype.name})"
    )
  return arr


def _empty_as(arr: np.ndarray, spec: tf.TensorSpec) -> np.ndarray:
  """An empty array of fewer dimensions than the spec ("[]", "[[]]") as the
  spec's: the missing inner dimensions are the spec's (0 where it has none),
  so `"negative_clicks": []` is zero clicks [0, 2]."""
  rank = spec.shape.rank
  if arr.size or rank is None or arr.ndim >= rank:
    return arr
  return arr.reshape(list(arr.shape) + [d or 0 for d in spec.shape.as_list()[arr.ndim :]])


def _columnar(inputs: Any, specs: Mapping[str, tf.TensorSpec]) -> Dict[str, Any]:
  """The "inputs" value -> {input name: JSON value}."""
  is_b64 = isinstance(inputs, dict) and set(inputs) == {"b64"}
  if not isinstance(inputs, dict) or is_b64:
    if len(specs) > 1:
      raise RequestError(
        f"inputs: a plain value, but the signature takes {len(specs)} named "
        f"inputs ({', '.join(sorted(specs))}): send an object"
      )
    return {next(iter(specs)): inputs}
  missing = sorted(set(specs) - set(inputs))
  unknown = sorted(set(inputs) - set(specs))
  if missing:
    raise RequestError(
      f"{missing[0]}: missing named input in 'inputs' (the signature takes "
      f"{', '.join(sorted(specs))})"
    )
  if unknown:
    raise RequestError(
      f"{unknown[0]}: not an input of the signature (it takes {', '.join(sorted(specs))})"
    )
  return dict(inputs)


def _columns(instances: Any, specs: Mapping[str, tf.TensorSpec]) -> Dict[str, Any]:
  """The "instances" value -> {input name: its value in each instance, a list,
  or an ndarray of them stacked (integers the fast parser read)}."""
  plain = isinstance(instances, np.ndarray) and instances.ndim > 0
  if not plain and (not isinstance(instances, list) or not instances):
    raise RequestError("instances: expected a non-empty list")
  named = not plain and isinstance(instances[0], dict) and set(instances[0]) != {"b64"}
  if not named and len(specs) > 1:
    raise RequestError(
      f"instances: plain values, but the signature takes {len(specs)} named "
      f"inputs ({', '.join(sorted(specs))}): send a list of objects"
    )
  if plain:
    return {next(iter(specs)): instances}
  columns: Dict[str, list] = {k: [] for k in specs}
  for i, inst in enumerate(instances):
    if named != (isinstance(inst, dict) and set(inst) != {"b64"}):
      raise RequestError(f"instances[{i}]: every instance must be an object, or none")
    if named and set(inst) != set(specs):
      raise RequestError(
        f"instances[{i}]: keys {sorted(inst)} must be the signature's inputs {sorted(specs)}"
      )
    for k in specs:
      columns[k].append(inst[k] if named else inst)
  return columns


def _stacked(name: str, column: Any, spec: tf.TensorSpec) -> np.ndarray:
  """One input's values of every instance -> one tensor, instances in front."""
  any_shape = tf.TensorSpec(None, spec.dtype)
  if isinstance(column, np.ndarray):
    return to_tensor(name, column, any_shape)
  # An instance's "[]" is empty in the signature's inner dimensions (zero clicks [0, 2]).
  inner = tf.TensorSpec(spec.shape[1:] if spec.shape.rank else None, spec.dtype)
  rows = [
    _empty_as(to_tensor(f"instances[{i}].{name}", v, any_shape), inner)
    for i, v in enumerate(column)
  ]
  if len({r.shape for r in rows}) > 1:
    raise RequestError(
      f"{name}: instances hold different shapes "
      f"({', '.join(str(list(r.shape)) for r in rows[:3])}...)"
    )
  return np.stack(rows)


def _rows(
  instances: Any, specs: Mapping[str, tf.TensorSpec], max_clicks: int = 0
) -> Dict[str, np.ndarray]:
  """The "instances" value -> {input name: tensor with instances stacked in front}."""
  columns = _columns(instances, specs)
  check_clicks(columns, max_clicks)
  out = {k: _stacked(k, columns[k], specs[k]) for k in sorted(specs)}
  # An unbatched signature first (what the whole request did wrong), then each input.
  for k in sorted(specs):
    if specs[k].shape.rank is not None and out[k].ndim != specs[k].shape.rank:
      raise RequestError(_unbatched(k, out[k].shape, specs[k]))
  for k in sorted(specs):
    spec = specs[k]
    if not spec.shape.is_compatible_with(out[k].shape):
      raise RequestError(
        f"{k}: {len(instances)} instances make {list(out[k].shape)}, which does "
        f"not fit the signature's {spec.shape.as_list()}"
      )
  return out


def _unbatched(name: str, shape, spec: tf.TensorSpec) -> str:
  dims = [-1 if d is None else d for d in spec.shape.as_list()]
  return (
    f"{name}: the row format ('instances') adds a batch dimension, making it "
    f"{list(shape)}, but the signature takes {dims} (one example per request): send "
    'it in the columnar form, {"inputs": {...}}'
  )


def _numbers_in(value: Any) -> int:
  """How many numbers a value holds: JSON lists, arrays, tensors."""
  if isinstance(value, list):
    return sum(_numbers_in(v) for v in value)
  shape = getattr(value, "shape", None)
  return int(np.prod(shape)) if shape is not None else 1


def check_clicks(
  columns: Mapping[str, Any], max_clicks: int, inputs: Sequence[str] = sig.CLICKS
) -> None:
  """Refuses a request whose click inputs (`inputs`: the signatures', or the
  page's fields) hold more than `max_clicks` rows together (0: no limit);
  `columns` is {input name: its value in each instance} (`_columns`;
  columnar: a list of one)."""
  names = [k for k in inputs if k in columns]
  count = sum(_numbers_in(columns[k]) for k in names) // 2  # [x, y] each
  if max_clicks and count > max_clicks:
    raise RequestError(
      f"{', '.join(names)}: {count} clicks in one request; this server takes "
      f"at most {max_clicks} (--max-clicks)"
    )


def check_batch(inputs: Mapping[str, np.ndarray], specs: Mapping[str, tf.TensorSpec]) -> None:
  """Refuses the columnar inputs of a batched signature that hold no example,
  or disagree on how many they hold (the model would answer for the fewest)."""
  sizes = {k: len(v) for k, v in inputs.items() if sig.is_batched(k, specs[k])}
  empty = sorted(k for k, n in sizes.items() if not n)
  if empty:
    raise RequestError(f"{empty[0]}: an empty batch (no example to answer)")
  if len(set(sizes.values())) > 1:
    said = ", ".join(f"{k} {n}" for k, n in sorted(sizes.items()))
    raise RequestError(
      f"inputs disagree on the batch size ({said}): each takes one entry per example"
    )


def check_pixels(inputs: Mapping[str, np.ndarray], max_pixels: int) -> None:
  """Refuses an image input of more than `max_pixels` pixels (0: no limit),
  an encoded one (`image_bytes`) by the size its header declares, before
  anything is decoded, and an encoded file the graph does not decode."""
  image = inputs.get(sig.IMAGE)
  pixels = image.size // image.shape[-1] if image is not None and image.ndim else 0
  if max_pixels and pixels > max_pixels:
    raise RequestError(
      f"{sig.IMAGE}: {pixels} pixels; this server takes at most {max_pixels} (--max-pixels)"
    )
  files = inputs.get(sig.IMAGE_BYTES)
  for i, data in enumerate(np.ravel(files) if files is not None else []):
    try:
      pixels = declared_pixels(data)
    except ValueError as e:
      raise RequestError(f"{sig.IMAGE_BYTES}[{i}]: {e}") from None
    if max_pixels and pixels > max_pixels:
      raise RequestError(
        f"{sig.IMAGE_BYTES}[{i}]: {pixels} pixels; this server takes at most "
        f"{max_pixels} (--max-pixels)"
      )


def load_json(body: bytes, arrays: bool = True) -> Any:
  """The request body's JSON (`json_arrays.loads`; with `arrays`, large
  integer arrays as ndarrays), or a RequestError: too deep (the limit named)
  or not JSON."""
  try:
    return loads(body, arrays)
  except TooDeep as e:
    raise RequestError(f"the request body: {e}") from None
  except (ValueError, RecursionError) as e:
    raise RequestError(f"the request body is not JSON: {e}") from None


def parse_predict(
  body: bytes,
  signatures: Mapping[str, Mapping[str, tf.TensorSpec]],
  max_clicks: int = 0,
  max_pixels: int = 0,
) -> Tuple[str, Dict[str, np.ndarray], bool]:
  """A predict request body -> (signature name, inputs, whether it was row format).

  Args:
    signatures: {signature name: {input name: TensorSpec}}.
    max_clicks: the most clicks a request may hold (`check_clicks`; 0: any).
    max_pixels: the most pixels of an image input (`check_pixels`; 0: any).
  """
  doc = load_json(body)
  if not isinstance(doc, dict):
    raise RequestError("the request body must be a JSON object")
  name = doc.get("signature_name", sig.SERVING_DEFAULT) or sig.SERVING_DEFAULT
  if not isinstance(name, str):
    raise RequestError("signature_name: must be a string")
  if name not in signatures:
    raise RequestError(
      f"signature_name: no signature {name!r} (the model has {', '.join(sorted(signatures))})"
    )
  specs = signatures[name]
  if ("inputs" in doc) == ("instances" in doc):
    raise RequestError("the request must hold one of 'inputs' (columnar) or 'instances' (row)")
  if "instances" in doc:
    inputs, row = _rows(doc["instances"], specs, max_clicks), True
  else:
    values = _columnar(doc["inputs"], specs)
    check_clicks({k: [v] for k, v in values.items()}, max_clicks)
    inputs, row = {k: to_tensor(k, v, specs[k]) for k, v in values.items()}, False
    check_batch(inputs, specs)
  check_pixels(inputs, max_pixels)
  return name, inputs, row


def _jsonable(name: str, arr: np.ndarray):
  """A string tensor as text (or {"b64"} for names ending in _bytes); others as is."""
  arr = np.asarray(arr)  # A row of a string output is one bytes object.
  if arr.dtype != object and arr.dtype.kind != "S":
    return np.ascontiguousarray(arr)
  if name.endswith("_bytes"):
    one = lambda b: {"b64": base64.b64encode(b).decode("ascii")}  # pylint: disable=unnecessary-lambda-assignment
  else:
    one = lambda b: b.decode("utf-8", "replace")  # pylint: disable=unnecessary-lambda-assignment
  return np.vectorize(one, otypes=[object])(arr).tolist() if arr.ndim else one(arr.item())


def encode_outputs(outputs: Mapping[str, np.ndarray], row: bool) -> bytes:
  """Outputs -> the response body, {"outputs": ...} or {"predictions": [...]}."""
  names = sorted(outputs)
  if not row:
    value = {k: _jsonable(k, outputs[k]) for k in names}
    return _dumps({"outputs": value if len(names) > 1 else value[names[0]]})
  sizes = {k: (outputs[k].shape[0] if outputs[k].ndim else None) for k in names}
  if None in sizes.values() or len(set(sizes.values())) > 1:
    raise RequestError(
      "the outputs have no common batch dimension "
      f"({', '.join(f'{k} {list(outputs[k].shape)}' for k in names)}), which "
      "the row format needs: send 'inputs' (columnar) instead"
    )
  n = sizes[names[0]]
  rows = [{k: _jsonable(k, outputs[k][i]) for k in names} for i in range(n)]
  if len(names) == 1:
    rows = [r[names[0]] for r in rows]
  return _dumps({"predictions": rows})


def _dumps(value) -> bytes:
  return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)


def error_body(message: str) -> bytes:
  """TF Serving's error answer."""
  return json.dumps({"error": message}).encode()
