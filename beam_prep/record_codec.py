"""The record codec: a `FeatureTable`'s examples to and from records.

`RecordCodec(table)` writes what the table declares (`beam_prep.features`):
`encode` the example view of one example (what tf.Transform and serving's
`serve_examples` read), `encode_unit` a record of a unit with its variants
stacked, and `summary_row` the few hundred bytes of an image that the default
analysis reads instead of its pixels. It reads records back as numpy
(`decode_examples`, `decode_records`) through the trainer's own Decoder
(`beam_prep.record_decoder`). An example that does not match its
declarations is refused with a `FeatureError` naming the op that declared
the feature.
"""

import zlib
from typing import Any, Callable, Dict, List, Sequence, Tuple

import numpy as np

from beam_prep.features import Entry, FeatureError, FeatureTable

# zlib's fastest level: on distance maps it gives 0.52 of the raw bytes against
# 0.47 at level 6, at about half the time (docs/performance.md "Record layout,
# measured").
ZLIB_LEVEL = 1
# Suffixes of the per-image summaries tf.Transform's default analysis reads.
SUMMARY_MEAN = "__mean"
SUMMARY_MEAN_SQUARE = "__mean_square"


class RecordCodec:
  """Examples of `table` to and from serialized tf.train.Example records."""

  def __init__(self, table: FeatureTable):
    self.table = table

  # ---- what tf.Transform's analysis reads ---------------------------------------

  @property
  def summarized(self) -> List[Entry]:
    """Per-pixel model inputs declared "standardize": the analysis reads their
    per-image channel means instead of their pixels."""
    return [
      e
      for e in self.table.model_inputs
      if e.feature.per_pixel and e.feature.normalize == "standardize"
    ]

  @staticmethod
  def summary_keys(entry: Entry) -> Tuple[str, str]:
    """Keys of an entry's per-image channel mean and mean of squares."""
    return f"{entry.key}{SUMMARY_MEAN}", f"{entry.key}{SUMMARY_MEAN_SQUARE}"

  def analysis_feature_spec(self) -> Dict[str, Any]:
    """The records' spec plus the per-image summaries (`summary_row`)."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    spec = self.table.raw_feature_spec()
    for e in self.summarized:
      for key in self.summary_keys(e):
        spec[key] = tf.io.FixedLenFeature([e.feature.channels], tf.float32)
    return spec

  def summary_row(self, ex: Dict[str, Any]) -> bytes:
    """One image as the default analysis reads it: per-pixel features empty,
    each standardized one's per-channel mean and mean of squares, every other
    feature as recorded. A few hundred bytes instead of the record."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    feature = {}
    for e in self.table.entries:
      if e.feature.per_pixel:
        feature[e.key] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[b""]))
      else:
        feature[e.key] = _feature_of(e, _array_for(e, ex, self.table.image_size))
    for e in self.summarized:
      x = (
        _array_for(e, ex, self.table.image_size).reshape(-1, e.feature.channels).astype(np.float64)
      )
      mean_key, square_key = self.summary_keys(e)
      for key, values in ((mean_key, x.mean(axis=0)), (square_key, np.square(x).mean(axis=0))):
        feature[key] = tf.train.Feature(float_list=tf.train.FloatList(value=values.tolist()))
    example = tf.train.Example(features=tf.train.Features(feature=feature))
    return example.SerializeToString(deterministic=True)

  # ---- encoding ---------------------------------------------------------------

  def encode(self, ex: Dict[str, Any]) -> bytes:
    """One finished example -> its example view (format 2), deterministically.

    Raises:
      FeatureError: a declared feature is missing or has the wrong dtype or
        shape; the message names the op that declared it.
    """
    return RecordCodec(self.table.example_view).encode_unit([ex])

  def encode_unit(self, examples: Sequence[Dict[str, Any]]) -> bytes:
    """The finished examples of one unit -> one serialized record, deterministically:
    the stacked features of every example, the others of the first.

    Raises:
      FeatureError: as `encode`, or no example.
    """
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    if not examples:
      raise FeatureError("a record holds at least one example")
    feature = {}
    for e in self.table.entries:
      if e.stacked:
        values = [_stored(e, _array_for(e, ex, self.table.image_size)) for ex in examples]
        feature[e.key] = tf.train.Feature(bytes_list=tf.train.BytesList(value=values))
      else:
        feature[e.key] = _feature_of(e, _array_for(e, examples[0], self.table.image_size))
    example = tf.train.Example(features=tf.train.Features(feature=feature))
    # Map order varies from process to process unless deterministic.
    return example.SerializeToString(deterministic=True)

  def decode_examples(self, serialized: bytes) -> List[Dict[str, Any]]:
    """A serialized record -> its examples, one dict of numpy arrays per variant
    held (str for string scalars); the unstacked features are shared.

    The record is read by the trainer's reader (`beam_prep.record_decoder`),
    then turned into numpy: per-pixel features [H, W, C] in their stored
    dtype, number lists as arrays of their declared shape.

    Raises:
      FeatureError: a per-pixel feature does not hold the bytes its declaration says.
      ValueError: a declared feature is missing (a record of another run), or
        does not parse or decode as declared.
    """
    return self.decode_records([serialized])[0]

  def decode_records(self, serialized: Sequence[bytes]) -> List[List[Dict[str, Any]]]:
    """Serialized records -> the examples of each (`decode_examples`), read in
    one call of the Decoder: per record, much faster than one call each.

    Raises:
      As `decode_examples`, for the first record that does not match.
    """
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    from beam_prep.record_decoder import Decoder  # pylint: disable=g-import-not-at-top

    if not serialized:
      return []
    for s in serialized:
      self._check_holds(tf.train.Example.FromString(s).features.feature)
    try:
      once, each, splits = Decoder(self.table).numpy(serialized)
    except tf.errors.InvalidArgumentError as e:
      raise ValueError(
        f"a record does not decode as features.json declares: {e.message.strip()}"
      ) from None
    convert = {e.key: self._to_numpy(e) for e in self.table.entries}
    records = []
    for b in range(len(serialized)):
      shared = {e.key: convert[e.key](once[e.key][b]) for e in self.table.entries if not e.stacked}
      records.append(
        [
          dict(shared, **{e.key: convert[e.key](each[e.key][i]) for e in self.table.stacked})
          for i in range(splits[b], splits[b + 1])
        ]
      )
    return records

  def decode_numpy(self, serialized: bytes, variant: int = 0) -> Dict[str, Any]:
    """A serialized record -> the dict of numpy arrays of its `variant`-th example."""
    return self.decode_examples(serialized)[variant]

  def _check_holds(self, feature) -> None:
    """Checks that a record (its tf.train.Features map) holds every declared
    feature, and as many variants of each stacked one."""
    for e in self.table.entries:
      if e.key not in feature:
        raise ValueError(f"the record has no feature {e.key!r} (declared by op {e.op!r})")
      if e.feature.per_pixel and e.feature.encoding == "raw" and not e.stacked:
        self._check_bytes(e, len(b"".join(feature[e.key].bytes_list.value)))
    held = {e.key: len(feature[e.key].bytes_list.value) for e in self.table.stacked}
    if len(set(held.values())) > 1:
      raise ValueError(
        f"the record holds different numbers of variants of its stacked features: {held}"
      )

  def _check_bytes(self, e: Entry, held: int) -> None:
    """Raises FeatureError unless `held` is the byte count of one value of per-pixel `e`."""
    want = e.stored_bytes(self.table.image_size)
    if held != want:
      h, w = self.table.image_size
      raise FeatureError(
        f"feature {e.key!r} holds {held} bytes, but features.json declares "
        f"{e.shape(self.table.image_size)} {e.feature.dtype} ({want} bytes) at "
        f"{w}x{h}"
      )

  def _to_numpy(self, e: Entry) -> Callable[[Any], Any]:
    """The function from one example's value of `e` in the example view
    (`Decoder.numpy`: raw bytes of a per-pixel feature, else parsed values) to
    what `decode_examples` gives."""
    if e.feature.per_pixel:
      shape, dtype = e.shape(self.table.image_size), e.feature.stored_dtype

      def pixels(value: bytes) -> np.ndarray:
        self._check_bytes(e, len(value))
        return np.frombuffer(value, dtype).reshape(shape)

      return pixels
    if e.feature.dtype == "string":
      if e.feature.shape == ():
        return lambda value: value.decode("utf-8", "replace")
      return lambda value: [v.decode("utf-8", "replace") for v in value]
    dtype = np.int64 if e.feature.dtype == "int64" else np.float32
    shape = [-1 if d is None else d for d in e.feature.shape]
    return lambda value: np.array(value, dtype).reshape(shape)


def _stored(e: Entry, value) -> bytes:
  """A checked value (`_array_for`) of a stacked feature as one variant's bytes."""
  if e.feature.per_pixel:
    return _pixels(e, value)
  if e.feature.dtype == "string":
    return value[0]
  return np.asarray(value, np.dtype(value.dtype).newbyteorder("<")).tobytes()


def _pixels(e: Entry, value: np.ndarray) -> bytes:
  """A per-pixel feature's stored bytes, in its declared encoding."""
  raw = value.tobytes()
  return zlib.compress(raw, ZLIB_LEVEL) if e.feature.encoding == "zlib" else raw


def _feature_of(e: Entry, value):
  """A checked value (`_array_for`) as a tf.train.Feature."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  if e.feature.per_pixel:
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[_pixels(e, value)]))
  if e.feature.dtype == "string":
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=list(value)))
  if e.feature.dtype == "int64":
    return tf.train.Feature(int64_list=tf.train.Int64List(value=value.tolist()))
  return tf.train.Feature(float_list=tf.train.FloatList(value=value.tolist()))


def _array_for(e: Entry, ex: Dict[str, Any], image_size: Tuple[int, int]):
  """The example's value of entry `e`, checked and flattened for encoding."""
  f = e.feature
  if e.key not in ex or ex[e.key] is None:
    raise FeatureError(
      f"op {e.op!r} declares feature {e.key!r} but the example has no "
      f"{e.key!r} (its keys: {', '.join(sorted(ex))})"
    )
  value = ex[e.key]
  if f.per_pixel:
    if not isinstance(value, np.ndarray):
      raise FeatureError(
        f"op {e.op!r}: feature {e.key!r} must be a numpy array, got {type(value).__name__}"
      )
    want = (image_size[0], image_size[1], f.channels)
    if value.dtype != np.dtype(f.dtype):
      raise FeatureError(
        f"op {e.op!r}: feature {e.key!r} is declared {f.dtype} but the example holds {value.dtype}"
      )
    if value.shape != want and not (f.channels == 1 and value.shape == want[:2]):
      raise FeatureError(
        f"op {e.op!r}: feature {e.key!r} is declared {list(want)} (records "
        f"are {image_size[0]}x{image_size[1]}) but the example holds "
        f"{list(value.shape)}"
      )
    return np.ascontiguousarray(value, dtype=f.stored_dtype)
  if f.dtype == "string":
    values = value if isinstance(value, (list, tuple, np.ndarray)) else [value]
    out = []
    for v in values:
      if isinstance(v, str):
        v = v.encode("utf-8")
      if not isinstance(v, (bytes, np.bytes_)):
        raise FeatureError(
          f"op {e.op!r}: string feature {e.key!r} holds {type(v).__name__}, not str or bytes"
        )
      out.append(bytes(v))
    _check_count(e, len(out), (len(out),))
    return out
  arr = np.asarray(value)
  kind_ok = (
    (np.issubdtype(arr.dtype, np.integer) or arr.dtype == bool)
    if f.dtype == "int64"
    else np.issubdtype(arr.dtype, np.number)
  )
  if not kind_ok:
    raise FeatureError(
      f"op {e.op!r}: feature {e.key!r} is declared {f.dtype} but the example holds {arr.dtype}"
    )
  _check_count(e, arr.size, arr.shape)
  return arr.reshape(-1).astype(np.int64 if f.dtype == "int64" else np.float32)


def _check_count(e: Entry, size: int, shape) -> None:
  dims = e.feature.shape
  if e.variable_length:
    per_row = int(np.prod(dims[1:])) if len(dims) > 1 else 1
    ok = size % per_row == 0 and (len(shape) <= 1 or tuple(shape[1:]) == tuple(dims[1:]))
  else:
    ok = size == int(np.prod(dims)) if dims else size == 1
  if not ok:
    raise FeatureError(
      f"op {e.op!r}: feature {e.key!r} is declared with shape "
      f"{list(dims)} but the example holds shape {list(shape)}"
    )
