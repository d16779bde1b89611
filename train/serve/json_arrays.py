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
# The characters of an integer array's text marked 1, every other byte 0: a
# run of MIN_BYTES ones is then found by `bytes.find`, in linear time and at
# memchr speed across text that holds none (a b64 string of an image).
_ARRAY_CHARS = b"[]0123456789,- \n\r\t"
_MARK = bytes(1 if i in _ARRAY_CHARS else 0 for i in range(256))
_LONG_RUN = b"\x01" * MIN_BYTES
_SPACE = b" \n\r\t"
# The deepest nesting of lists and objects taken: a request's tensors nest a
# few levels (an image three, inside "inputs" and the body two more).
MAX_DEPTH = 32
# A JSON string, escapes included (JSON has no brackets outside strings that
# are not structure).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))


class TooDeep(ValueError):
  """JSON text nested deeper than MAX_DEPTH."""


def depth(text: bytes) -> int:
  """How deep lists and objects nest in JSON text (0: a bare value), in
  linear time: strings removed, then a running count of the brackets."""
  brackets = _STRING.sub(b"", text).translate(None, _NOT_BRACKETS)
  if not brackets:
    return 0
  b = np.frombuffer(brackets, np.uint8)
  opens = (b == ord("[")) | (b == ord("{"))
  steps = opens.view(np.int8) * np.int8(2) - np.int8(1)  # +1 opens, -1 closes
  return int(np.cumsum(steps, dtype=np.int32).max())


def _skeleton_shape(skeleton: bytes) -> Optional[tuple]:
  """The shape of a dense nested list from its brackets and commas alone
  ("[[,],[,]]" -> (2, 2)), or None when the nesting is not that of a dense
  tensor."""
  rank = len(skeleton) - len(skeleton.lstrip(b"["))
  if rank > MAX_DEPTH:
    return None  # Each level below scans the text once.
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


def _runs(body: bytes):
  """(start, end) of each run of at least MIN_BYTES array characters."""
  marked = body.translate(_MARK)
  start = marked.find(_LONG_RUN)
  while start >= 0:  # The first long run from here starts where it is found.
    end = marked.find(b"\x00", start)
    end = len(body) if end < 0 else end
    yield start, end
    start = marked.find(_LONG_RUN, end)


def _spans(body: bytes):
  """(start, end) of each candidate array: in each long run of array
  characters, from its first "[" to its last "]"."""
  for run in _runs(body):
    start, end = body.find(b"[", *run), body.rfind(b"]", *run) + 1
    if 0 <= start and end - start >= MIN_BYTES:
      yield start, end


def check_depth(text: bytes) -> None:
  """Raises TooDeep when `text` nests deeper than MAX_DEPTH."""
  levels = depth(text)
  if levels > MAX_DEPTH:
    raise TooDeep(f"the JSON nests {levels} levels deep; this server takes at most {MAX_DEPTH}")


def loads(body: bytes, arrays: bool = True) -> Any:
  """`json.loads` of `body`, its depth checked first; with `arrays`, large
  integer arrays parsed by numpy (module docstring).

  Raises:
    TooDeep: `body` nests deeper than MAX_DEPTH.
    ValueError: `body` is not JSON (json's own message).
  """
  check_depth(body)
  if not arrays:
    return json.loads(body)
  found: Dict[str, np.ndarray] = {}
  parts, last = [], 0
  for start, end in _spans(body):
    array = int_array(body[start:end])
    if array is None:
      continue
    key = f"\x00array{len(found)}"
    found[key] = array
    parts += [body[last:start], json.dumps(key).encode()]
    last = end
  if not found:
    return json.loads(body)
  parts.append(body[last:])
  try:
    doc = json.loads(b"".join(parts))
  except ValueError:
    return json.loads(body)  # A span was inside a string: the plain parse decides.
  put = []
  doc = _put_back(doc, found, put)
  if len(put) != len(found):
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
