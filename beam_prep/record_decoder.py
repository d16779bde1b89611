"""Reading records: serialized records -> the example view, in one place.

A record holds one unit with its variants stacked (`beam_prep.features`,
format 3); the `Decoder` is the one reader of that layout. The trainer's
input path runs it in its tf.data graph (`train.fit.data`), and
`RecordCodec.decode_examples` runs it eagerly and turns its output into
numpy arrays (`Decoder.numpy`), so a change to the record layout is made
here, once.

It works on the FeatureTable (and its entries) it is given and imports no
other module of `beam_prep`: `beam_prep.features` reaches it, and
`beam_prep.preprocessing` builds on `beam_prep.features`.
"""

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf


def raw_bytes(stored: tf.Tensor, entry) -> tf.Tensor:
  """Stored bytes of a per-pixel feature (its entry's declared `encoding`) ->
  its raw bytes, what `preprocessing.decode_feature` reads; elementwise over
  any shape."""
  if entry.feature.encoding == "zlib":
    return tf.io.decode_compressed(stored, compression_type="ZLIB")
  return stored


class Decoder:
  """Serialized records -> raw feature tensors of examples, for the given keys.

  The Decoder parses a batch of records, then either picks one variant per
  record, uniformly at random in the graph (`pick`: training; only string
  tensors are gathered, so one variant is decompressed, not all), or keeps
  every variant as an example of its own (`expand`: evaluation), and gives
  the example view (`raw`): the very tensors a record of one example parsed
  with `FeatureTable.raw_feature_spec` gives, which the exported tf.Transform
  graph takes.

  Args:
    table: the records' FeatureTable.
    keys_to_parse: the features to parse (default: all).
    seed: seed of the variant picked per record.
  """

  def __init__(self, table, keys_to_parse: Optional[Sequence[str]] = None, seed: int = 0):
    self._table = table
    parsed = table.keys() if keys_to_parse is None else list(keys_to_parse)
    self._spec = table.record_feature_spec(parsed)
    self._stacked = [k for k in parsed if table[k].stacked]
    self._seed = seed

  def parse(self, serialized: tf.Tensor) -> Dict[str, tf.Tensor]:
    """[B] serialized records -> their features; stacked ones ragged [B, variants held]."""
    return tf.io.parse_example(serialized, self._spec)

  def split(
    self, parsed: Dict[str, tf.Tensor]
  ) -> Tuple[Dict[str, tf.Tensor], Dict[str, tf.Tensor], Optional[tf.Tensor]]:
    """Parsed records -> the features stored once ([B] each), the stacked
    ones ([variants held in the batch] each, record after record) and the
    row splits of the variants ([B + 1]: record b holds variants
    splits[b]:splits[b + 1]; None when nothing is stacked)."""
    once = {k: v for k, v in parsed.items() if k not in self._stacked}
    if not self._stacked:
      return once, {}, None
    each = {k: parsed[k].values for k in self._stacked}
    return once, each, parsed[self._stacked[0]].row_splits

  def pick(self, parsed: Dict[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
    """One variant per record, each of those it holds equally likely: [B] per feature."""
    if not self._stacked:
      return parsed
    first = parsed[self._stacked[0]]
    held = first.row_lengths()
    u = tf.random.uniform(tf.shape(held), seed=self._seed)
    chosen = tf.minimum(tf.cast(u * tf.cast(held, tf.float32), tf.int64), held - 1)
    index = first.row_starts() + chosen
    return {k: tf.gather(v.values, index) if k in self._stacked else v for k, v in parsed.items()}

  def expand(self, parsed: Dict[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
    """Every variant of every record, in order: [variants held in the batch] per feature."""
    once, each, splits = self.split(parsed)
    if splits is None:
      return parsed
    owner = tf.ragged.row_splits_to_segment_ids(splits)
    out = {}
    for k in parsed:
      if k in each:
        out[k] = each[k]
      elif isinstance(once[k], tf.SparseTensor):
        out[k] = tf.gather(tf.RaggedTensor.from_sparse(once[k]), owner).to_sparse()
      else:
        out[k] = tf.gather(once[k], owner)
    return out

  def raw(self, stored: Dict[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
    """Picked, expanded or split features -> the example view (`raw_view`)."""
    return raw_view(self._table, stored)

  def stored(self, serialized: tf.Tensor, training: bool = True) -> Dict[str, tf.Tensor]:
    """[B] serialized records -> one picked variant per record (training) or
    every variant (else), as stored: what `raw` turns into the example view."""
    parsed = self.parse(serialized)
    return self.pick(parsed) if training else self.expand(parsed)

  def decode(self, serialized: tf.Tensor, training: bool = True) -> Dict[str, tf.Tensor]:
    """[B] serialized records -> the example view of one picked variant per
    record (training) or of every variant (else)."""
    return self.raw(self.stored(serialized, training))

  def numpy(
    self, serialized: Sequence[bytes]
  ) -> Tuple[Dict[str, List[Any]], Dict[str, List[Any]], np.ndarray]:
    """Serialized records, eagerly -> the example view as numpy values, split
    as `split` does: each feature stored once as one value per record, each
    stacked one as one value per variant held, and the row splits.

    A value is a row of what the example view's spec parses to: raw bytes
    of a per-pixel feature, a numpy array of a fixed shape, the numpy values
    of a variable-length one. When nothing is stacked, the splits are [0, 1, ..., B].

    Raises:
      tf.errors.InvalidArgumentError: a record does not parse, or a value
        does not decode, as the table declares.
    """
    once, each, splits = self.split(self.parse(tf.constant(list(serialized), tf.string)))
    splits = np.arange(len(serialized) + 1) if splits is None else splits.numpy()
    return _rows(self.raw(once)), _rows(self.raw(each)), splits


def raw_view(table, stored: Dict[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
  """Picked, expanded or split features, as stored -> the example view:
  per-pixel features as raw bytes, stacked numbers as the lists or arrays
  their spec parses to. The trainer's step runs it (`train.fit.data.Parser`), so
  its reader only parses and picks."""
  out = {}
  for k, v in stored.items():
    e = table[k]
    if e.feature.per_pixel:
      out[k] = raw_bytes(v, e)
    elif e.stacked and e.feature.dtype != "string":
      out[k] = _stacked_numbers(v, e)
    else:
      out[k] = v
  return out


def _stacked_numbers(values: tf.Tensor, e) -> tf.Tensor:
  """[N] little-endian bytes of each example's values -> what the example
  view's spec parses them to: a SparseTensor [N, values] for a variable length,
  else [N, *shape]."""
  dtype, size = (tf.int64, 8) if e.feature.dtype == "int64" else (tf.float32, 4)
  flat = tf.io.decode_raw(tf.strings.reduce_join(values), dtype, little_endian=True)
  if e.variable_length:
    lengths = tf.cast(tf.strings.length(values) // size, tf.int64)
    # Lengths are not negative, and to_sparse checks that they add up to the values.
    return tf.RaggedTensor.from_row_lengths(flat, lengths, validate=False).to_sparse()
  return tf.reshape(flat, [-1, *e.feature.shape])


def _rows(view: Dict[str, tf.Tensor]) -> Dict[str, List[Any]]:
  """Tensors [N, ...] (dense, or sparse [N, values]) -> their N rows in numpy."""
  out = {}
  for k, v in view.items():
    if isinstance(v, tf.SparseTensor):
      values, rows = v.values.numpy(), v.indices.numpy()[:, 0]
      starts = np.searchsorted(rows, np.arange(int(v.dense_shape[0]) + 1))
      out[k] = [values[a:b] for a, b in zip(starts[:-1], starts[1:])]
    else:
      out[k] = list(v.numpy())
  return out
