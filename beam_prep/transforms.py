"""Composite PTransforms of the plugin, usable in anyone's Beam pipeline.

    ReadExamples        root (local or gs://)   -> dicts with encoded bytes
                        (layouts: see beam_prep.readers)
    DecodeExamples      encoded dicts           -> one dict per object
    SampleClicks        object dicts            -> one dict per click variant
    ComputeDistanceMaps variant dicts           -> dicts with `distance_maps`
    ApplyOps            any dicts               -> dicts, through a named op chain
    EncodeExamples      finished dicts          -> (split, key, serialized tf.Example),
                        by the run's FeatureTable
    WriteExamples       serialized tf.Examples  -> sharded TFRecord files
    AnalyzeAndTransform serialized tf.Examples  -> transform_fn/ on disk
    WriteDeadLetters    error dicts             -> errors/*.jsonl

Every op stage returns a pair `(examples, errors)`. An error dict names the
source file, the stage, a short `reason` and a `detail` for a person; nothing
that fails is dropped silently.
"""

import hashlib
import json
import struct
import zlib
from typing import Tuple

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from beam_prep import keys, readers, tasks
from beam_prep.ops import registry

ERRORS_TAG = readers.ERRORS_TAG
error_record = readers.error_record
ReadExamples = readers.ReadExamples


class _ApplyOpsFn(beam.DoFn):
  """Applies an op chain to each element; failures go to the errors output."""

  def __init__(self, chain: str, ops_module: str = ""):
    self._chain = chain
    self._ops_module = ops_module
    self._fn = None

  def setup(self):
    registry.import_ops_modules(self._ops_module)
    self._fn = registry.build_chain(self._chain)
    self._out = Metrics.counter("beam_prep", "op_outputs")
    self._failed = Metrics.counter("beam_prep", "op_failures")

  def process(self, ex):
    outputs, failures = self._fn(ex)
    for f in failures:
      self._failed.inc()
      Metrics.counter("beam_prep", f"error_{f.reason}").inc()
      yield beam.pvalue.TaggedOutput(
          ERRORS_TAG, error_record(f.stage, f.reason, f.detail, f.example))
    for out in outputs:
      self._out.inc()
      yield out


class ApplyOps(beam.PTransform):
  """Applies a registered op chain (e.g. "resize(128)|my_op(k=2)").

  Args:
    chain: the chain string; it is parsed and its ops are looked up when the
      pipeline is built, so a typo fails before anything runs.
    ops_module: a module the workers import first (where user ops register).

  Returns:
    `(examples, errors)`.
  """

  def __init__(self, chain: str, ops_module: str = ""):
    super().__init__()
    registry.import_ops_modules(ops_module)
    registry.build_chain(chain)  # Validates names and arguments now.
    self._chain = chain
    self._ops_module = ops_module

  def expand(self, pcoll: beam.PCollection) -> Tuple[beam.PCollection, beam.PCollection]:
    result = pcoll | beam.ParDo(_ApplyOpsFn(self._chain, self._ops_module)).with_outputs(
        ERRORS_TAG, main="examples")
    return result.examples, result[ERRORS_TAG]


class DecodeExamples(ApplyOps):
  """Decodes, resizes to `size`, and splits each scene into its objects."""

  def __init__(self, size: int, max_pixels: int = 64_000_000):
    super().__init__(tasks.decode_chain(size, max_pixels))


class SampleClicks(ApplyOps):
  """Samples `variants` click sets per object (see `beam_prep.ops.clicks`)."""

  def __init__(self, variants: int = 1, seed: int = 0, **click_params):
    super().__init__(registry.op_call("sample_clicks", variants=variants, seed=seed,
                                      **click_params))


class ComputeDistanceMaps(ApplyOps):
  """Adds the uint8 positive/negative distance maps (see `beam_prep.ops.distance`)."""

  def __init__(self):
    super().__init__("distance_maps")


def _stable_hash(text: str) -> int:
  """A hash that is the same in every process, runner and Python version."""
  return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


def split_of(image_id: str, eval_percent: int) -> str:
  """Train or eval, by a stable hash of the image id (all objects and
  variants of one image land in the same split)."""
  return keys.EVAL_SPLIT if _stable_hash(image_id) % 100 < eval_percent else keys.TRAIN_SPLIT


def sort_key(ex) -> str:
  """The order of records within a shard: image, object, variant."""
  parts = [ex["image_id"]]
  for k in ("object_id", "variant"):
    if k in ex:
      parts.append(f"{int(ex[k]):05d}")
  return "/".join(parts)


class EncodeExamples(beam.PTransform):
  """Finished example dicts -> `(split, sort key, serialized tf.Example)`.

  The record holds exactly the features of `table` (`FeatureTable.encode`:
  an undeclared or misshapen feature stops the job with the op's name). The
  split is the example's own `split` when its layout fixed one (Pascal VOC's
  lists, a manifest column), else a stable hash of the image id.

  Args:
    eval_percent: share of image ids hashed into the eval split.
    table: the run's FeatureTable.
  """

  def __init__(self, eval_percent: int, table):
    super().__init__()
    self._eval_percent = eval_percent
    self._table = table

  def expand(self, pcoll: beam.PCollection) -> beam.PCollection:
    eval_percent, table = self._eval_percent, self._table
    return pcoll | beam.Map(
        lambda ex: (ex.get("split") or split_of(ex["image_id"], eval_percent), sort_key(ex),
                    table.encode(ex)))


def _masked_crc32c(data: bytes) -> int:
  import google_crc32c  # pylint: disable=g-import-not-at-top
  crc = google_crc32c.value(data)
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord_frame(payload: bytes) -> bytes:
  """One TFRecord: length, masked CRC-32C of the length, payload, its masked CRC."""
  length = struct.pack("<Q", len(payload))
  return (length + struct.pack("<I", _masked_crc32c(length)) + payload
          + struct.pack("<I", _masked_crc32c(payload)))


def shard_of(key: str, num_shards: int) -> int:
  """A record's shard: a stable hash of its key (same on every runner)."""
  return _stable_hash(key) % num_shards


class _WriteShardFn(beam.DoFn):
  """Writes one shard: its records sorted by key, to a hidden temp file that
  is renamed into place only when complete."""

  def __init__(self, prefix: str, suffix: str, num_shards: int, kind: str, gzip: bool):
    self._prefix, self._suffix, self._n = prefix, suffix, num_shards
    self._kind, self._gzip = kind, gzip

  def process(self, kv):
    from apache_beam.io.filesystem import CompressionTypes  # pylint: disable=g-import-not-at-top
    shard, items = kv
    items = sorted(i for i in items if i is not None)
    items = [(k, zlib.decompress(v)) for k, v in items]
    path = f"{self._prefix}-{shard:05d}-of-{self._n:05d}{self._suffix}"
    folder, name = path.rsplit("/", 1)
    tmp = f"{folder}/.tmp-{name}"
    comp = CompressionTypes.GZIP if self._gzip else CompressionTypes.UNCOMPRESSED
    with FileSystems.create(tmp, compression_type=comp) as f:
      for _, payload in items:
        if self._kind == "tfrecord":
          f.write(tfrecord_frame(payload))
        else:
          f.write(payload + b"\n")
    if FileSystems.exists(path):
      FileSystems.delete([path])
    FileSystems.rename([tmp], [path])
    Metrics.counter("beam_prep", "records_written").inc(len(items))
    yield path


class _WriteSortedShards(beam.PTransform):
  """(key, payload) pairs -> `num_shards` files, deterministic to the byte.

  Shard = stable hash of the key; order within a shard = key order. A rerun
  over the same inputs writes the same bytes, whatever the runner, worker
  count or bundle order. Each shard is sorted on one worker, so it must fit
  in a worker's memory: choose enough shards (a few hundred MB each at most).
  """

  def __init__(self, prefix: str, suffix: str, num_shards: int, kind: str, gzip: bool = False):
    super().__init__()
    self._args = (prefix, suffix, num_shards, kind, gzip)
    self._n = num_shards

  def expand(self, pcoll: beam.PCollection) -> beam.PCollection:
    n = self._n
    # Payloads cross the shuffle compressed (fast zlib): masks and distance
    # maps shrink several-fold, which is less shuffle on Dataflow and less
    # memory on the DirectRunner, which holds a grouped stage's input.
    keyed = pcoll | "ToShard" >> beam.Map(
        lambda kv: (shard_of(kv[0], n), (kv[0], zlib.compress(kv[1], 1))))
    every = pcoll.pipeline | "AllShards" >> beam.Create([(i, None) for i in range(n)])
    return ((keyed, every) | "WithEmpty" >> beam.Flatten()
            | "GroupShards" >> beam.GroupByKey()
            | "WriteShards" >> beam.ParDo(_WriteShardFn(*self._args)))


class WriteExamples(beam.PTransform):
  """Writes `(sort key, serialized tf.Example)` pairs to
  `DIR/records/SPLIT-SSSSS-of-NNNNN.tfrecord[.gz]`, deterministically.

  Returns the PCollection of written file paths.
  """

  def __init__(self, output_dir: str, split: str, num_shards: int, compression: str = ""):
    super().__init__()
    self._prefix = FileSystems.join(output_dir, keys.RECORDS_DIR, split)
    self._num_shards = num_shards
    self._gzip = compression == "gzip"

  def expand(self, pcoll: beam.PCollection) -> beam.PCollection:
    suffix = keys.RECORD_SUFFIX + (keys.GZIP_SUFFIX if self._gzip else "")
    return pcoll | _WriteSortedShards(self._prefix, suffix, self._num_shards, "tfrecord",
                                      self._gzip)


class AnalyzeAndTransform(beam.PTransform):
  """Full-pass tf.Transform analysis of serialized records; writes the graph.

  Input is the PCollection of serialized tf.Examples (the records as
  written), fed to tf.Transform as Arrow RecordBatches through TFXIO (the
  fast path; instance dicts are tf.Transform's test format). Only the
  analysis runs: the records keep the compact raw features, and the trainer
  and the serving model apply the exported graph. Writes
  `DIR/transform_fn/`, `DIR/transformed_metadata/` and the raw schema in
  `DIR/metadata/`, where `tft.TFTransformOutput(DIR)` finds all three.

  Must be applied inside a `tft_beam.Context`.
  """

  def __init__(self, preprocessing_fn, transform_dir: str, raw_feature_spec):
    super().__init__()
    self._preprocessing_fn = preprocessing_fn
    self._transform_dir = transform_dir
    self._spec = raw_feature_spec

  def expand(self, serialized: beam.PCollection):
    import tensorflow_transform.beam as tft_beam  # pylint: disable=g-import-not-at-top
    from tensorflow_transform.tf_metadata import dataset_metadata  # pylint: disable=g-import-not-at-top
    from tensorflow_transform.tf_metadata import schema_utils  # pylint: disable=g-import-not-at-top
    from tfx_bsl.tfxio import tf_example_record  # pylint: disable=g-import-not-at-top

    schema = schema_utils.schema_from_feature_spec(self._spec)
    tfxio = tf_example_record.TFExampleBeamRecord(
        physical_format="tfrecord", schema=schema, telemetry_descriptors=["beam_prep"])
    record_batches = serialized | "ToRecordBatches" >> tfxio.BeamSource()
    transform_fn = ((record_batches, tfxio.TensorAdapterConfig())
                    | "Analyze" >> tft_beam.AnalyzeDataset(self._preprocessing_fn))
    _ = transform_fn | "WriteTransformFn" >> tft_beam.WriteTransformFn(self._transform_dir)
    _ = (dataset_metadata.DatasetMetadata(schema)
         | "WriteRawMetadata" >> tft_beam.WriteMetadata(
             FileSystems.join(self._transform_dir, "metadata"), serialized.pipeline))
    return transform_fn


class WriteDeadLetters(beam.PTransform):
  """Writes error dicts as sorted JSON lines to `DIR/errors/errors-00000-of-00001.jsonl`."""

  def __init__(self, output_dir: str):
    super().__init__()
    self._prefix = FileSystems.join(output_dir, keys.ERRORS_DIR, "errors")

  def expand(self, errors: beam.PCollection) -> beam.PCollection:
    def line(e):
      text = json.dumps(e, sort_keys=True)
      return text, text.encode("utf-8")
    return (errors
            | "ToJson" >> beam.Map(line)
            | "Write" >> _WriteSortedShards(self._prefix, ".jsonl", 1, "text"))
