"""JSON with large integer arrays, parsed at numpy speed.

A 512x512 RGB image sent as TensorFlow Serving's JSON is 786,432 integers in
nested lists (about 3 MB); `json.loads` and `numpy.asarray` of the lists take
well over 100 ms of CPU for it. `loads` finds each large array of integers in
the text, checks its nesting (every list of one level the same length,
numbers only at the innermost level: the text of a dense tensor), reads the
numbers with numpy's C parser, puts an int64 ndarray in its place and parses
the rest of the document with `json`.

Anything the fast path does not take (floats, strings, empty or ragged lists,
a space inside a number) is left to `json.loads`, so the result, and the
error for malformed JSON, are those of the standard parser; only the type of
a large integer array differs (an ndarray instead of nested lists), and a
number written with a leading zero ("07"), which JSON forbids, is read as 7.
"""

import json
import re
import warnings
from typing import Any, Dict, Optional

import numpy as np

# Arrays of at least this many bytes take the fast path; smaller ones are
# cheaper to parse with json.
MIN_BYTES = 2048
_SPAN = re.compile(rb"\[[\[\]0-9,\- \n\r\t]{%d,}\]" % (MIN_BYTES - 2))
_SPACE = b" \n\r\t"


def _skeleton_shape(skeleton: bytes) -> Optional[tuple]:
  """The shape of a dense nested list from its brackets and commas alone
  ("[[,],[,]]" -> (2, 2)), or None when the nesting is not that of a dense
  tensor."""
  rank = len(skeleton) - len(skeleton.lstrip(b"["))
  dims, block = [], b""
  for j in range(1, rank + 1):
    end = skeleton.find(b"]" * j)  # closes the first list j levels up from the numbers
    if end < 0:
      return None
    length = end + j - (rank - j)
    n, rest = divmod(length - 1, len(block) + 1)
    if rest or n < 1:
      return None
    block = b"[" + b",".join([block] * n) + b"]"
    dims.append(n)
  return tuple(reversed(dims)) if block == skeleton else None


def int_array(text: bytes) -> Optional[np.ndarray]:
  """Nested JSON lists of integers -> int64 ndarray, or None when `text` is
  anything else (json.loads then decides what it is)."""
  shape = _skeleton_shape(text.translate(None, b"-0123456789" + _SPACE))
  if shape is None:
    return None
  # numpy's text parser skips whitespace around the commas; "1 2" stops it
  # early, and the count below refuses the array.
  numbers = text.translate(None, b"[]")
  if b",," in numbers or b"-," in numbers or numbers.rstrip(_SPACE).endswith(b"-"):
    return None
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")  # A stop before the end: the count below refuses it.
      values = np.fromstring(numbers, dtype=np.int64, sep=",")
  except ValueError:
    return None  # "1-2"
  if values.size != int(np.prod(shape)) or numbers.count(b"-") > np.count_nonzero(values < 0):
    return None
  return values.reshape(shape)


def loads(body: bytes) -> Any:
  """`json.loads` of `body`, large integer arrays parsed by numpy (module docstring).

  Raises:
    ValueError: `body` is not JSON (json's own message).
  """
  arrays: Dict[str, np.ndarray] = {}
  parts, last = [], 0
  for m in _SPAN.finditer(body):
    array = int_array(m.group())
    if array is None:
      continue
    key = f"\x00array{len(arrays)}"
    arrays[key] = array
    parts += [body[last:m.start()], json.dumps(key).encode()]
    last = m.end()
  if not arrays:
    return json.loads(body)
  parts.append(body[last:])
  try:
    doc = json.loads(b"".join(parts))
  except ValueError:
    return json.loads(body)  # A span was inside a string: the plain parse decides.
  found = []
  doc = _put_back(doc, arrays, found)
  if len(found) != len(arrays):
    return json.loads(body)
  return doc


def _put_back(value, arrays, found):
  if isinstance(value, str) and value in arrays:
    found.append(value)
    return arrays[value]
  if isinstance(value, dict):
    return {k: _put_back(v, arrays, found) for k, v in value.items()}
  if isinstance(value, list):
    return [_put_back(v, arrays, found) for v in value]
  return value
