"""Label Studio's brush masks: the RLE of its `brushlabels` results.

A brush mask travels as the run-length code of its RGBA pixels, row by row
(4 bytes a pixel), in thi.ng's rle-pack format, as a list of byte values:

  32 bits  the number of values (height * width * 4)
  5 bits   the word size - 1 (8-bit values: 7)
  4 x 4    the four run-length field sizes - 1 (in bits)
  then runs until every value is read:
    1 bit    1: one value repeated; 0: values one by one
    2 bits   which of the four field sizes the run's length takes
    n bits   the run's length - 1
    then     the repeated value, or that many values (word size bits each)
  and zero bits up to a whole byte.

`encode` writes an object mask as Label Studio's own tools do (the mask's
value in every channel: 255 object, 0 background); `decode` reads any
mask Label Studio sends and keeps a pixel where its alpha is 128 or more.
"""

from typing import List, Sequence

import numpy as np

WORD_BITS = 8
RUN_FIELDS = (3, 4, 8, 16)  # Bits of a run's length - 1 for each size class.
CHANNELS = 4


class BrushError(ValueError):
  """An RLE that is not a mask of the size it claims (the message says why)."""


def _bits(values: np.ndarray, widths: np.ndarray) -> np.ndarray:
  """Each value written big-endian in its width: uint8 bits."""
  field = np.repeat(np.arange(len(values)), widths)
  ends = np.cumsum(widths)
  shift = ends[field] - 1 - np.arange(int(ends[-1]))
  return ((values[field] >> shift) & 1).astype(np.uint8)


def _runs(values: np.ndarray):
  """(lengths, values) of the runs of equal values."""
  starts = np.flatnonzero(np.concatenate(([True], values[1:] != values[:-1])))
  lengths = np.diff(np.append(starts, len(values)))
  return lengths, values[starts]


def encode(mask: np.ndarray) -> List[int]:
  """The RLE (byte values) of a [H, W] mask: non-zero is the object."""
  flat = np.repeat(np.where(np.asarray(mask) > 0, 255, 0).astype(np.int64).ravel(), CHANNELS)
  lengths, values = _runs(flat)
  longest = 1 << RUN_FIELDS[-1]
  pieces = -(-lengths // longest)  # Runs longer than the longest field are split.
  lengths = np.minimum(np.repeat(lengths, pieces) - longest * _within(pieces), longest)
  values = np.repeat(values, pieces)
  size = np.searchsorted(1 << np.asarray(RUN_FIELDS), lengths)  # Smallest class that holds it.
  run_widths = np.asarray(RUN_FIELDS)[size]
  header_v = np.array([len(flat), WORD_BITS - 1, *(f - 1 for f in RUN_FIELDS)], np.int64)
  header_w = np.array([32, 5] + [4] * len(RUN_FIELDS), np.int64)
  fields_v = np.stack([np.ones_like(lengths), size, lengths - 1, values], 1).ravel()
  fields_w = np.stack(
    [np.ones_like(lengths), np.full_like(lengths, 2), run_widths, np.full_like(lengths, WORD_BITS)],
    1,
  ).ravel()
  bits = _bits(np.concatenate([header_v, fields_v]), np.concatenate([header_w, fields_w]))
  return np.packbits(bits).tolist()


def _within(pieces: np.ndarray) -> np.ndarray:
  """0, 1, .. pieces[i] - 1 for each run, concatenated."""
  starts = np.repeat(np.cumsum(pieces) - pieces, pieces)
  return np.arange(int(pieces.sum())) - starts


class _Reader:
  """Reads big-endian fields from a bit string."""

  def __init__(self, data: bytes):
    self.bits = np.unpackbits(np.frombuffer(data, np.uint8))
    self.at = 0

  def read(self, width: int) -> int:
    end = self.at + width
    if end > len(self.bits):
      raise BrushError("the RLE ends before the values it announces")
    value = 0
    for b in self.bits[self.at : end].tolist():
      value = (value << 1) | b
    self.at = end
    return value

  def words(self, count: int, width: int) -> np.ndarray:
    """`count` values of `width` bits each."""
    end = self.at + count * width
    if end > len(self.bits):
      raise BrushError("the RLE ends before the values it announces")
    block = self.bits[self.at : end].reshape(count, width).astype(np.int64)
    self.at = end
    return block @ (1 << np.arange(width - 1, -1, -1))


def _as_bytes(rle: Sequence[int]) -> bytes:
  if not isinstance(rle, (list, tuple)) or not all(
    isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 256 for v in rle
  ):
    raise BrushError("expected a list of byte values (0..255)")
  return bytes(rle)


def decode(rle: Sequence[int], height: int, width: int) -> np.ndarray:
  """bool [height, width]: the pixels whose alpha is 128 or more.

  Raises:
    BrushError: not byte values, not height * width * 4 values, a word size
      over 8 bits, or data that ends early.
  """
  reader = _Reader(_as_bytes(rle))
  num, word = reader.read(32), reader.read(5) + 1
  sizes = [reader.read(4) + 1 for _ in range(4)]
  if num != height * width * CHANNELS:
    raise BrushError(
      f"the RLE holds {num} values, not the {height}x{width} image's {height * width * CHANNELS}"
    )
  if word > WORD_BITS:
    raise BrushError(f"a word size of {word} bits (masks take 8)")
  out = np.zeros(num, np.uint8)
  i = 0
  while i < num:
    repeated = reader.read(1)
    j = min(num, i + 1 + reader.read(sizes[reader.read(2)]))
    if repeated:
      out[i:j] = reader.read(word)
    else:
      out[i:j] = reader.words(j - i, word)
    i = j
  return out.reshape(height, width, CHANNELS)[:, :, 3] >= 128
