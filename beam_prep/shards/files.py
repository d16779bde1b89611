"""Shard files: TFRecord framing, names, and files that roll over at a size."""

import struct
from typing import Any, Dict, List

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_prep import keys

RECORDS_KIND = "records"
ERRORS_KIND = "errors"
ERRORS_PREFIX = "errors"
ERRORS_SUFFIX = ".jsonl"
INDEX_KIND = "index"


def record_suffix(gzip: bool) -> str:
  return keys.RECORD_SUFFIX + (keys.GZIP_SUFFIX if gzip else "")


def compression(gzip: bool) -> str:
  return CompressionTypes.GZIP if gzip else CompressionTypes.UNCOMPRESSED


def _masked_crc32c(data: bytes) -> int:
  import google_crc32c  # pylint: disable=g-import-not-at-top

  crc = google_crc32c.value(data)
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord_frame(payload: bytes) -> bytes:
  """One TFRecord: length, masked CRC-32C of the length, payload, its masked CRC."""
  length = struct.pack("<Q", len(payload))
  return (
    length
    + struct.pack("<I", _masked_crc32c(length))
    + payload
    + struct.pack("<I", _masked_crc32c(payload))
  )


class RollingFile:
  """Frames written to `PREFIX-PPPPP` files of at most `limit` bytes each
  (uncompressed; a single larger frame gets a file of its own)."""

  def __init__(self, prefix: str, suffix: str, limit: float, gzip: bool):
    self._prefix, self._suffix, self._limit, self._gzip = prefix, suffix, limit, gzip
    self._file = None
    self._size = self._records = 0
    self.done: List[Dict[str, Any]] = []

  def write(self, frame: bytes) -> None:
    if self._file is not None and self._size + len(frame) > self._limit:
      self.close()
    if self._file is None:
      path = f"{self._prefix}-{len(self.done):05d}{self._suffix}"
      self._file = FileSystems.create(path, compression_type=compression(self._gzip))
      self._path, self._size, self._records = path, 0, 0
    self._file.write(frame)
    self._size += len(frame)
    self._records += 1

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
      self.done.append(
        {"part": len(self.done), "temp": self._path, "records": self._records, "bytes": self._size}
      )
      self._file = None
