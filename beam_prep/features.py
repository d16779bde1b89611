"""Declared features: what an op produces, and the one table every stage reads.

An op declares the features it writes when it is registered:

    from beam_prep import Feature, register_op

    @register_op("edges", produces={"edges": Feature("uint8", channels=1, normalize=255)},
                 twin=edges_tf)
    def edges(): ...

A `Feature` is either *per-pixel* (`channels=C`: an array [H, W, C] at the
records' image size; C == 1 may also be given as [H, W]) or of a *fixed
shape* (`shape=()` a scalar, `shape=(None, 2)` a variable number of pairs).
Its `role` says what the trainer does with it:

| role          | records | tf.Transform graph           | trainer               |
|---------------|---------|------------------------------|-----------------------|
| `model_input` | yes     | normalized, same key         | concatenated, in order|
| `label`       | yes     | turned into labels by task   | loss and metrics      |
| `metadata`    | yes     | not used                     | tracing, evaluation   |

`normalize` (model inputs): `"standardize"` (per-channel mean and standard
deviation over the analyzed split: a full pass), a number `s` (divide by `s`,
e.g. 255), or `"none"`.

`encoding` (per-pixel only) says how a record stores the array: `"raw"`, its
little-endian bytes, or `"zlib"`, those bytes compressed with zlib (lossless;
for maps and masks with large flat regions; docs/performance.md "Record
layout, measured"). Whatever the encoding, the tf.Transform graph and the serving
graph see the raw bytes (`raw_feature_spec`, the *example view*).

`FeatureTable.from_declarations` walks a chain's declarations in order and builds the table: a key
keeps the position of its first declaration, and the last declaration of a key
wins (an op that changes `image` re-declares it). The table is the schema: it
writes and reads `features.json` and gives the records' feature specs.
Examples are written to and read from records by its codec
(`beam_prep.record_codec.RecordCodec`), which names the op to blame when an
example does not match. This module needs only the standard library and
numpy; TensorFlow is imported where a TF object is built.

Record layout (format 3): a record is one *unit* (an object of a
segmentation image, an image of classification) with all the examples it
fanned out into (its click variants). A feature is *stacked* when its last declaration
comes from a stage after the fan-out (`Entry.stacked`, derived by
`PrepConfig.features` from the task's stage levels): the record holds it as
a bytes list with one value per variant held (per-pixel: its stored bytes;
numbers: the raw little-endian bytes of the flattened values; a string
scalar: the string). Every other feature (the image, the mask, the ids) is
stored once, as in the example view. A variant that failed is absent, so a
record holds 1 to `variants` of them. The codec's `encode` writes the
example view of one example (what serving's `serve_examples` and
tf.Transform read), `encode_unit` a record, `decode_examples` a record's
examples. Records are read in one place, `beam_prep.record_decoder` (the
trainer's Decoder): `decode_examples` runs it and turns its output into numpy.
"""

import dataclasses
import functools
import json
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from beam_prep.dead_letters import READ_STAGE  # The stage declaring what every record keeps.

ROLES = ("model_input", "label", "metadata")
# Per-pixel features are stored as the raw little-endian bytes of the array.
PIXEL_DTYPES = ("uint8", "uint16", "int32", "float32")
# Fixed-shape features are stored as tf.train.Example lists.
VALUE_DTYPES = ("int64", "float32", "string")
# How a record stores a per-pixel feature's bytes (see the module docstring).
ENCODINGS = ("raw", "zlib")
FEATURES_FILE = "features.json"
# What records and serving agree on; 2: the whole-image resize keeps the aspect
# ratio; 3: a record holds a unit once with its variants stacked.
FORMAT = 3


class FeatureError(ValueError):
  """A declaration, or an example against its declarations, is wrong.

  Raised for bugs in an op (an undeclared array, a wrong dtype or shape), not
  for bad input data: it stops the job instead of filling the dead letters.
  """


def _normalize_spec(value: Union[str, float, int, None]) -> str:
  if value is None or value == "none":
    return "none"
  if value == "standardize":
    return "standardize"
  if isinstance(value, str) and value.startswith("scale(") and value.endswith(")"):
    value = float(value[len("scale(") : -1])
  if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
    return f"scale({float(value)!r})"
  raise FeatureError(
    f"normalize must be 'standardize', 'none' or a positive number to divide by, got {value!r}"
  )


@dataclasses.dataclass(frozen=True)
class Feature:
  """One declared feature of the records.

  Args:
    dtype: per-pixel: one of `PIXEL_DTYPES`; fixed shape: one of `VALUE_DTYPES`.
    channels: per-pixel channels C: the feature is [H, W, C] at the records'
      image size.
    shape: a fixed shape instead (`()` scalar, `(None, 2)` variable-length
      pairs, `(4,)` a vector); give exactly one of `channels` and `shape`.
    role: "model_input", "label" or "metadata".
    normalize: "standardize", "none", or a positive number to divide by.
    encoding: per-pixel: how records store it, "raw" or "zlib".
  """

  dtype: str
  channels: Optional[int] = None
  shape: Optional[Tuple[Optional[int], ...]] = None
  role: str = "model_input"
  normalize: Union[str, float] = "none"
  encoding: str = "raw"

  def __post_init__(self):
    if (self.channels is None) == (self.shape is None):
      raise FeatureError("give a Feature either channels=C (per-pixel) or shape=(...)")
    if self.role not in ROLES:
      raise FeatureError(f"role must be one of {ROLES}, got {self.role!r}")
    if self.channels is not None:
      if not isinstance(self.channels, int) or self.channels < 1:
        raise FeatureError(f"channels must be a positive int, got {self.channels!r}")
      if self.dtype not in PIXEL_DTYPES:
        raise FeatureError(
          f"a per-pixel feature's dtype must be one of {PIXEL_DTYPES}, got {self.dtype!r}"
        )
    else:
      shape = tuple(None if d in (None, -1) else int(d) for d in self.shape)
      if any(d is None for d in shape[1:]):
        raise FeatureError(f"only the first dimension may be variable, got {self.shape}")
      object.__setattr__(self, "shape", shape)
      if self.dtype not in VALUE_DTYPES:
        raise FeatureError(
          f"a fixed-shape feature's dtype must be one of {VALUE_DTYPES}, got {self.dtype!r}"
        )
    if self.encoding not in ENCODINGS or (self.encoding != "raw" and not self.per_pixel):
      raise FeatureError(
        f"encoding must be one of {ENCODINGS}, and other than 'raw' only for "
        f"a per-pixel feature; got {self.encoding!r}"
      )
    norm = _normalize_spec(self.normalize)
    if norm != "none" and self.role != "model_input":
      raise FeatureError(f"only model inputs are normalized; a {self.role} has normalize='none'")
    if norm != "none" and self.dtype == "string":
      raise FeatureError("a string feature cannot be normalized")
    object.__setattr__(self, "normalize", norm)

  @property
  def per_pixel(self) -> bool:
    return self.channels is not None

  @property
  def stored_dtype(self) -> np.dtype:
    """numpy dtype of a per-pixel feature's stored bytes (little-endian)."""
    return np.dtype(self.dtype).newbyteorder("<")

  @property
  def scale(self) -> Optional[float]:
    """The divisor of a `scale(s)` normalization, else None."""
    if self.normalize.startswith("scale("):
      return float(self.normalize[len("scale(") : -1])
    return None


@dataclasses.dataclass(frozen=True)
class Entry:
  """A feature of a table: its key, declaration, the op that last declared it,
  and whether it differs per variant (stacked in a record)."""

  key: str
  feature: Feature
  op: str
  stacked: bool = False

  def shape(self, image_size: Tuple[int, int]) -> List[Optional[int]]:
    if self.feature.per_pixel:
      return [image_size[0], image_size[1], self.feature.channels]
    return list(self.feature.shape)

  def stored_bytes(self, image_size: Tuple[int, int]) -> int:
    """Bytes a per-pixel feature's record value holds."""
    return int(np.prod(self.shape(image_size))) * self.feature.stored_dtype.itemsize

  @property
  def variable_length(self) -> bool:
    return not self.feature.per_pixel and bool(self.feature.shape) and self.feature.shape[0] is None


class FeatureTable:
  """The features of one run, in declared order: what the records hold.

  Args:
    entries: the features, in order.
    image_size: (height, width) of every per-pixel feature.
    task: "segmentation" or "classification".
    chain: the op chain that produced them (for the record).
    ops_module: module(s) that register the chain's user ops.
  """

  def __init__(
    self,
    entries: Sequence[Entry],
    image_size: Tuple[int, int],
    task: str,
    chain: str = "",
    ops_module: str = "",
    variants: int = 1,
  ):
    self.entries = list(entries)
    self.image_size = (int(image_size[0]), int(image_size[1]))
    self.task = task
    self.chain = chain
    self.ops_module = ops_module
    self.variants = int(variants)
    self._by_key = {e.key: e for e in self.entries}
    if len(self._by_key) != len(self.entries):
      raise FeatureError("a feature key appears twice in the table")
    for e in self.entries:
      if e.stacked and e.feature.dtype == "string" and e.feature.shape != ():
        raise FeatureError(
          f"op {e.op!r}: feature {e.key!r} differs per variant, and a "
          "string feature that does is a scalar (shape=())"
        )

  # ---- building -----------------------------------------------------------

  @classmethod
  def from_declarations(
    cls,
    declarations: Sequence[Tuple],
    image_size: Tuple[int, int],
    task: str,
    chain: str = "",
    read: Optional[Dict[str, Feature]] = None,
    ops_module: str = "",
    variants: int = 1,
  ) -> "FeatureTable":
    """Walks a chain's declarations (see the module docstring).

    Args:
      declarations: (op name, produces) of each op of the chain, in order
        (`registry.declarations`), or (op name, produces, per variant): with
        True, the op runs on variants (after the fan-out), and the features
        it declares last are stacked.
      image_size: (height, width) of the records.
      task: the task name, recorded in the table.
      chain: the chain's text, recorded in the table.
      read: features the reader already gives every example (declared by
        the "read" stage), first in the table.
      ops_module: recorded in the table so the trainer can import user ops.
      variants: examples a unit fans out into (`Task.examples_per_unit`).
    """
    order: List[str] = []
    declared: Dict[str, Entry] = {}
    stages = [(READ_STAGE, read or {})] + list(declarations)
    for op, produces, *per_variant in stages:
      for key, feature in produces.items():
        if key not in declared:
          order.append(key)
        declared[key] = Entry(key, feature, op, bool(per_variant and per_variant[0]))
    return cls([declared[k] for k in order], image_size, task, chain, ops_module, variants)

  @functools.cached_property
  def example_view(self) -> "FeatureTable":
    """The table of one example as tf.Transform and serving see it: nothing
    stacked, every per-pixel feature raw. Its records are the layout of format 2."""
    entries = [
      Entry(e.key, dataclasses.replace(e.feature, encoding="raw"), e.op) for e in self.entries
    ]
    return FeatureTable(entries, self.image_size, self.task, self.chain, self.ops_module)

  @property
  def stacked(self) -> List[Entry]:
    """The features that differ per variant: one value per variant in a record."""
    return [e for e in self.entries if e.stacked]

  # ---- views ----------------------------------------------------------------

  def __iter__(self):
    return iter(self.entries)

  def __contains__(self, key: str) -> bool:
    return key in self._by_key

  def __getitem__(self, key: str) -> Entry:
    try:
      return self._by_key[key]
    except KeyError:
      raise KeyError(
        f"no feature {key!r} in the table; features: {', '.join(self.keys())}"
      ) from None

  def keys(self, role: Optional[str] = None) -> List[str]:
    return [e.key for e in self.entries if role is None or e.feature.role == role]

  def with_role(self, role: str) -> List[Entry]:
    return [e for e in self.entries if e.feature.role == role]

  @property
  def model_inputs(self) -> List[Entry]:
    return self.with_role("model_input")

  @property
  def transform_keys(self) -> List[str]:
    """The raw features the exported tf.Transform graph reads: the model inputs and labels."""
    return self.keys("model_input") + self.keys("label")

  @property
  def input_channels(self) -> int:
    """Channels of the model input: its per-pixel model inputs, concatenated."""
    return sum(e.feature.channels for e in self.model_inputs)

  # ---- features.json --------------------------------------------------------

  def to_dict(self) -> Dict[str, Any]:
    return {
      "format": FORMAT,
      "features": [
        {
          "key": e.key,
          "dtype": e.feature.dtype,
          "shape": e.shape(self.image_size),
          "role": e.feature.role,
          "normalize": e.feature.normalize,
          "encoding": e.feature.encoding,
          "channels": e.feature.channels,
          "op": e.op,
          "stacked": e.stacked,
        }
        for e in self.entries
      ],
      "chain": self.chain,
      "ops_module": self.ops_module,
      "task": self.task,
      "image_size": list(self.image_size),
      "variants": self.variants,
    }

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), indent=2)

  @classmethod
  def from_dict(cls, d: Dict[str, Any]) -> "FeatureTable":
    if d.get("format", 1) != FORMAT:
      raise ValueError(
        f"features.json of format {d.get('format', 1)}, this beam-prep reads format {FORMAT} "
        "(since format 3 a record holds an object once with all its click variants stacked, "
        "and masks and click maps may be stored compressed, so older records do not parse "
        "as today's; since format 2 the resize keeps the aspect ratio and pads, so a model "
        "trained on older records does not match today's serving graph): run beam-prep "
        "again"
      )
    entries = []
    for f in d["features"]:
      kind = (
        {"channels": f["channels"]}
        if f.get("channels") is not None
        else {"shape": tuple(f["shape"])}
      )
      feature = Feature(
        f["dtype"],
        role=f["role"],
        normalize=f["normalize"],
        encoding=f.get("encoding", "raw"),
        **kind,
      )
      entries.append(Entry(f["key"], feature, f.get("op", ""), bool(f.get("stacked"))))
    return cls(
      entries,
      tuple(d["image_size"]),
      d["task"],
      d.get("chain", ""),
      d.get("ops_module", ""),
      d.get("variants", 1),
    )

  @classmethod
  def load(cls, directory: str) -> "FeatureTable":
    """Reads `DIRECTORY/features.json` (local or gs://, through TensorFlow's gfile)."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    path = f"{directory.rstrip('/')}/{FEATURES_FILE}"
    if not tf.io.gfile.exists(path):
      raise FileNotFoundError(
        f"no {FEATURES_FILE} in {directory}: not a beam-prep output, or written by a "
        "version before declared features (rerun beam-prep)"
      )
    with tf.io.gfile.GFile(path) as f:
      try:
        declared = json.load(f)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not JSON: {e}") from None
    return cls.from_dict(declared)

  # ---- the record schema ----------------------------------------------------

  def raw_feature_spec(self, keys: Optional[Iterable[str]] = None) -> Dict[str, Any]:
    """tf.io feature spec of one example in the example view (all features, or
    `keys`): what tf.Transform's graph and `serve_examples` take."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    spec = {}
    for key in self.keys() if keys is None else keys:
      e = self[key]
      if e.feature.per_pixel:
        spec[key] = tf.io.FixedLenFeature([], tf.string)
        continue
      dtype = {"int64": tf.int64, "float32": tf.float32, "string": tf.string}[e.feature.dtype]
      if e.variable_length:
        spec[key] = tf.io.VarLenFeature(dtype)
      else:
        spec[key] = tf.io.FixedLenFeature(list(e.feature.shape), dtype)
    return spec

  def record_feature_spec(self, keys: Optional[Iterable[str]] = None) -> Dict[str, Any]:
    """tf.io feature spec of the records (all features, or `keys`): a stacked
    feature is a ragged bytes list [B, variants held], the others as in the
    example view (per-pixel ones in their stored encoding)."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    keys = self.keys() if keys is None else list(keys)
    spec = self.raw_feature_spec([k for k in keys if not self[k].stacked])
    for k in keys:
      if self[k].stacked:
        spec[k] = tf.io.RaggedFeature(tf.string, row_splits_dtype=tf.int64)
    return spec

  def raw_schema(self, keys: Optional[Iterable[str]] = None):
    from tensorflow_transform.tf_metadata import schema_utils  # pylint: disable=g-import-not-at-top

    return schema_utils.schema_from_feature_spec(self.raw_feature_spec(keys))
