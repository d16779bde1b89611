"""Model inputs the training step makes itself instead of reading them.

The records hold, per click variant, the click encodings their ops computed
(what tf.Transform analyzed, and what serving's twins compute again) and a
previous mask of zeros. The trainer's reader reads neither: inflating those
maps per example was most of its cost (docs/performance.md "Record layout,
measured").
Instead, the step

1. gives the exported transform each such input's value *with no click*
   (its op's twin on no click, no previous mask), a constant;
2. computes each click encoding from the example's clicks with its op's
   twin (the serving graph's computation, tested equal to the op's), and
   looks the transform's output for it up in a table of all 256 values,
   made once by asking the transform.

So the reader parses the image, the mask and the clicks, and the model input
equals the one made from the stored maps, bit for bit
(`tests/train/test_step_inputs.py`). An input is made this way only when
that holds by construction: its op has a twin, it is stored as uint8, no
later op changes the clicks, and the transform maps each pixel by its own
value (`StepInputs` says why any other input is read from the records
instead).

This module imports `train.export.serving_inputs` only.
"""

import dataclasses
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import tensorflow as tf

from beam_prep import keys
from beam_prep.features import FeatureTable
from beam_prep.ops import registry
from train.export.serving_inputs import lookup_tables

CLICK_KEYS = (keys.POSITIVE_CLICKS, keys.NEGATIVE_CLICKS)


@dataclasses.dataclass(frozen=True)
class ClickInput:
  """A model input made from the clicks, as the step updates it.

  offset, channels: where it sits in the model's input.
  scale: what the transform divides its raw values by (None: standardized).
  add: its op's `add_click(raw [B, H, W, C] float32, xy, positive)` (None: none declared).
  lut: the transform's value of each raw value, float32 [256, C]
    (`lookup_tables`), which `add_click` looks its result up in (set by
    `exact`; None until then).
  """

  key: str
  op: str
  offset: int
  channels: int
  scale: Optional[float]
  add: Optional[Callable[..., Any]]
  lut: Optional[np.ndarray] = None


def click_inputs(table: FeatureTable) -> List[ClickInput]:
  """The model inputs made from the clicks (by an op that reads them and
  leaves them as they are: not `flip_variants`, which moves the image with
  them), in the model's channel order."""
  registry.import_ops_modules(table.ops_module)
  specs = {s.name: s for s in registry.parse_chain(table.chain)}
  out, offset = [], 0
  for e in table.model_inputs:
    op = registry.op_entry(e.op)
    if set(CLICK_KEYS) & set(op.reads or ()) and not set(CLICK_KEYS) & set(op.produces):
      scale = None if e.feature.normalize == "standardize" else (e.feature.scale or 1.0)
      out.append(
        ClickInput(
          e.key, e.op, offset, e.feature.channels, scale, registry.build_add_click(specs[e.op])
        )
      )
    offset += e.feature.channels
  return out


def put(x: tf.Tensor, offset: int, channels: int, value: tf.Tensor) -> tf.Tensor:
  """`x` [B, H, W, C] with channels offset:offset + channels replaced by `value`."""
  return tf.concat([x[..., :offset], value, x[..., offset + channels :]], axis=-1)


def exact(
  inputs: List[ClickInput], transform: Callable, table: FeatureTable, transform_keys: List[str]
) -> List[ClickInput]:
  """`inputs`, each with the table of its transform (`lookup_tables`), so that
  `add_click` gives the very value the transform gives the op's map of all
  clicks: the raw value is its model value times `scale`, rounded (checked
  here for every raw value), the op's `add_click` updates it, and the table
  gives the transform of the result (`x * (1 / 255)` is not `x / 255`).

  Raises:
    ValueError: an input's transform is not its raw value over `scale`, to the
      nearest raw value, pixel by pixel.
  """
  luts = lookup_tables(table, transform, transform_keys, [c.key for c in inputs])
  out = []
  for c in inputs:
    lut = luts[c.key]
    if lut is None or not np.array_equal(
      np.round(lut * c.scale), np.repeat(np.arange(256.0)[:, None], c.channels, 1)
    ):
      raise ValueError(
        f"model input {c.key!r}: the transform is not its raw value / "
        f"{c.scale:g}, pixel by pixel, so one more click cannot update it"
      )
    out.append(dataclasses.replace(c, lut=lut))
  return out


def add_click(x: tf.Tensor, inputs: List[ClickInput], xy, positive, valid) -> tf.Tensor:
  """The model input `x` with one more click in each of `inputs`, where
  `valid` [B] (the others keep theirs); `inputs` come from `exact`."""
  for c in inputs:
    value = x[..., c.offset : c.offset + c.channels]
    raw = c.add(tf.round(tf.cast(value, tf.float32) * c.scale), xy, positive)
    at = tf.cast(raw, tf.int32) * c.channels + tf.range(c.channels)
    new = tf.cast(tf.gather(c.lut.reshape(-1), at), x.dtype)
    x = put(x, c.offset, c.channels, tf.where(valid[:, None, None, None], new, value))
  return x


def channel_of(table: FeatureTable, key: str) -> Optional[int]:
  """The channel of one-channel model input `key` in the model's input (None: not an input).

  Raises:
    ValueError: it is normalized (the step writes the model's 0/1 mask into it as is).
  """
  offset = 0
  for e in table.model_inputs:
    if e.key == key:
      if e.feature.channels != 1 or e.feature.normalize != "none":
        raise ValueError(f"model input {key!r} must be one channel, not normalized")
      return offset
    offset += e.feature.channels
  return None


class StepInputs:
  """Which model inputs the step makes (module docstring), and making them.

  Args:
    table: the records' FeatureTable.
    transform: the exported transform (raw feature dict -> transformed).
    transform_keys: the raw features the transform takes.

  Attributes:
    empty: {key: raw bytes of its value with no click}: what the transform
      is given for each input the step makes.
    reads: the raw features the step reads to make them (the clicks).
    read_from_records: {key: why} of the click inputs read from the records.
  """

  def __init__(self, table: FeatureTable, transform: Callable, transform_keys: List[str]):
    self._table = table
    self._chain = registry.parse_chain(table.chain)  # Parsed once: what each check reads.
    self.empty: Dict[str, bytes] = {}
    self.read_from_records: Dict[str, str] = {}
    self._drawn: List[ClickInput] = []
    self._twins: List[Callable] = []  # Per drawn input, its op's twin.
    self._lut: List[np.ndarray] = []  # [256 * C]: the transform of value v, channel c at v * C + c.
    if keys.PREV_MASK in table.keys("model_input"):
      value = self._no_click(keys.PREV_MASK)
      if value is not None:
        self.empty[keys.PREV_MASK] = value.tobytes()
    candidates = self._candidates(table)
    if candidates:
      luts = lookup_tables(table, transform, transform_keys, [c.key for c, _ in candidates])
      for c, value in candidates:
        if luts[c.key] is None:
          self.read_from_records[c.key] = "the transform does not map each pixel by its own value"
          continue
        self._drawn.append(c)
        self._twins.append(self._twin(c.key))
        self._lut.append(luts[c.key].reshape(-1))
        self.empty[c.key] = value.tobytes()
    self.reads: List[str] = list(CLICK_KEYS) if self._drawn else []

  def _candidates(self, table: FeatureTable):
    """[(click input, its value with no click)] the step can make, noting why
    each other one is read."""
    out = []
    for c in click_inputs(table):
      why = self._unusable(c)
      value = None if why else self._no_click(c.key)
      if value is None and not why:
        why = f"the twin of op {c.op!r} cannot make it with no click"
      if why:
        self.read_from_records[c.key] = why
      else:
        out.append((c, value))
    return out

  def _unusable(self, c: ClickInput) -> str:
    """Why click input `c` cannot be made from the records' clicks ("": it can)."""
    table = self._table
    if not set(CLICK_KEYS) <= set(table.keys()):
      return "the records hold no clicks"
    order = [s.name for s in self._chain]
    last = {
      k: max((i for i, name in enumerate(order) if name == table[k].op), default=-1)
      for k in (c.key, *CLICK_KEYS)
    }
    later = [table[k].op for k in CLICK_KEYS if last[k] > last[c.key]]
    return (
      f"it is {table[c.key].feature.dtype}, not uint8"
      if table[c.key].feature.dtype != "uint8"
      else f"op {later[0]!r} changes the clicks after op {c.op!r} encoded them"
      if later
      else f"op {c.op!r} has no twin"
      if self._twin(c.key) is None
      else ""
    )

  def _twin(self, key: str):
    spec = [s for s in self._chain if s.name == self._table[key].op]
    return registry.build_twin(spec[-1]) if spec else None

  def _no_click(self, key: str) -> Optional[np.ndarray]:
    """The op's value of `key` with no click and no previous mask, [H, W, C]
    numpy (None: its op has no twin, or the twin needs more than that)."""
    h, w = self._table.image_size
    twin = self._twin(key)
    if twin is None:
      return None
    with tf.init_scope():
      ex = {
        keys.IMAGE: tf.zeros([h, w, 3], tf.uint8),
        keys.POSITIVE_CLICKS: tf.zeros([0, 2], tf.int64),
        keys.NEGATIVE_CLICKS: tf.zeros([0, 2], tf.int64),
      }
      try:
        value = np.asarray(twin(ex)[key])
      except (KeyError, ValueError, TypeError, tf.errors.OpError):
        return None
    return value.reshape(self._table[key].shape((h, w)))

  def constants(self, raw: Dict[str, Any]) -> Dict[str, tf.Tensor]:
    """[B] raw bytes, with no click, of each input the step makes and `raw` lacks."""
    batch = next(tf.shape(v)[0] for v in raw.values() if isinstance(v, tf.Tensor))
    return {k: tf.fill([batch], tf.constant(v)) for k, v in self.empty.items() if k not in raw}

  def __call__(self, x: tf.Tensor, raw: Dict[str, Any]) -> tf.Tensor:
    """The model input `x` [B, H, W, C], made from `constants`, with each
    input the step makes and `raw` lacks computed from the example's clicks
    in `raw` (one read from the records is kept as it is)."""
    drawn = [i for i, c in enumerate(self._drawn) if c.key not in raw]
    if not drawn:
      return x
    h, w = self._table.image_size
    image = tf.zeros([h, w, 3], tf.uint8)  # Its size is all the twins read of it.
    specs = [tf.TensorSpec(self._table[self._drawn[i].key].shape((h, w)), tf.uint8) for i in drawn]

    def one(clicks):
      ex = {
        keys.IMAGE: image,
        keys.POSITIVE_CLICKS: tf.reshape(clicks[0], [-1, 2]),
        keys.NEGATIVE_CLICKS: tf.reshape(clicks[1], [-1, 2]),
      }
      return [
        tf.reshape(self._twins[i](ex)[self._drawn[i].key], spec.shape)
        for i, spec in zip(drawn, specs)
      ]

    maps = tf.map_fn(
      one, tuple(tf.RaggedTensor.from_sparse(raw[k]) for k in CLICK_KEYS), fn_output_signature=specs
    )
    for i, m in zip(drawn, maps):
      c = self._drawn[i]
      at = tf.cast(m, tf.int32) * c.channels + tf.range(c.channels)
      x = put(x, c.offset, c.channels, tf.cast(tf.gather(self._lut[i], at), x.dtype))
    return x
