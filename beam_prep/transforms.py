"""Composite PTransforms of the plugin, usable in anyone's Beam pipeline.

    ReadExamples        root (local or gs://)   -> dicts with encoded bytes
                        (layouts: see beam_prep.readers)
    DecodeExamples      encoded dicts           -> one dict per object
    SampleClicks        object dicts            -> one dict per click variant
    ComputeDistanceMaps variant dicts           -> dicts with `distance_maps`
    ApplyOps            any dicts               -> dicts, through a named op chain
    AnalyzeAndTransform serialized tf.Examples  -> transform_fn/ on disk

The job itself does not pass pixels between these: it groups small input
pointers by shard and runs the same op chains inside each shard's writer
(`beam_prep.shards`), so records stream into their files.

Every op stage returns a pair `(examples, errors)`. An error dict names the
source file, the stage, a short `reason` and a `detail` for a person; nothing
that fails is dropped silently.
"""

from typing import Tuple

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from beam_prep import keys, readers
from beam_prep.kernel import Kernel, Tally
from beam_prep.layouts.common import ERRORS_TAG
from beam_prep.ops import registry
from beam_prep.tasks.plan import decode_chain
from beam_prep.tasks.registry import EXAMPLE, Stage

ReadExamples = readers.ReadExamples


class _ApplyOpsFn(beam.DoFn):
  """Applies an op chain to each element (through the kernel); failures go to
  the errors output."""

  def __init__(self, kernel: Kernel):
    self._kernel = kernel

  def setup(self):
    self._kernel.setup()
    self._out = Metrics.counter("beam_prep", "op_outputs")
    self._failed = Metrics.counter("beam_prep", "op_failures")

  def process(self, ex):
    outputs, errors, _ = self._kernel.apply(dict(ex), Tally())
    for error in errors:
      self._failed.inc()
      Metrics.counter("beam_prep", f"error_{error['reason']}").inc()
      yield beam.pvalue.TaggedOutput(ERRORS_TAG, error)
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
    self._kernel = Kernel("", [Stage("ApplyOps", chain, EXAMPLE)], ops_module, None)

  def expand(self, pcoll: beam.PCollection) -> Tuple[beam.PCollection, beam.PCollection]:
    result = pcoll | beam.ParDo(_ApplyOpsFn(self._kernel)).with_outputs(ERRORS_TAG, main="examples")
    return result.examples, result[ERRORS_TAG]


class DecodeExamples(ApplyOps):
  """Decodes, resizes to `size`, and splits each scene into its objects."""

  def __init__(self, size: int, max_pixels: int = keys.MAX_PIXELS):
    super().__init__(decode_chain(size, max_pixels))


class SampleClicks(ApplyOps):
  """Samples `variants` click sets per object (see `beam_prep.ops.clicks`)."""

  def __init__(self, variants: int = 1, seed: int = 0, **click_params):
    super().__init__(
      registry.op_call("sample_clicks", variants=variants, seed=seed, **click_params)
    )


class ComputeDistanceMaps(ApplyOps):
  """Adds the uint8 positive/negative distance maps (see `beam_prep.ops.distance`)."""

  def __init__(self):
    super().__init__("distance_maps")


class AnalyzeAndTransform(beam.PTransform):
  """Full-pass tf.Transform analysis of serialized records; writes the graph.

  Input is a PCollection of serialized tf.Examples of `analysis_spec`
  (default: the records' own spec; the job gives one small summary row per
  train image, `RecordCodec.summary_row`), fed to tf.Transform as Arrow RecordBatches through
  TFXIO (the
  fast path; instance dicts are tf.Transform's test format). Only the
  analysis runs: the records keep the compact raw features, and the trainer
  and the serving model apply the exported graph. Writes
  `DIR/transform_fn/`, `DIR/transformed_metadata/` and the records' raw
  schema (`raw_feature_spec`) in `DIR/metadata/`, where
  `tft.TFTransformOutput(DIR)` finds all three.

  Must be applied inside a `tft_beam.Context`.

  Returns:
    A PCollection whose elements exist once everything is written (use it
    as a side input to run a step after the transform is on disk).
  """

  def __init__(self, preprocessing_fn, transform_dir: str, raw_feature_spec, analysis_spec=None):
    super().__init__()
    self._preprocessing_fn = preprocessing_fn
    self._transform_dir = transform_dir
    self._spec = raw_feature_spec
    self._analysis_spec = analysis_spec or raw_feature_spec

  def expand(self, serialized: beam.PCollection):
    import tensorflow_transform.beam as tft_beam  # pylint: disable=g-import-not-at-top
    from tensorflow_transform.tf_metadata import dataset_metadata  # pylint: disable=g-import-not-at-top
    from tensorflow_transform.tf_metadata import schema_utils  # pylint: disable=g-import-not-at-top
    from tfx_bsl.tfxio import tf_example_record  # pylint: disable=g-import-not-at-top

    schema = schema_utils.schema_from_feature_spec(self._spec)
    tfxio = tf_example_record.TFExampleBeamRecord(
      physical_format="tfrecord",
      schema=schema_utils.schema_from_feature_spec(self._analysis_spec),
      telemetry_descriptors=["beam_prep"],
    )
    record_batches = serialized | "ToRecordBatches" >> tfxio.BeamSource()
    transform_fn = (
      record_batches,
      tfxio.TensorAdapterConfig(),
    ) | "Analyze" >> tft_beam.AnalyzeDataset(self._preprocessing_fn)
    written = transform_fn | "WriteTransformFn" >> tft_beam.WriteTransformFn(self._transform_dir)
    raw = dataset_metadata.DatasetMetadata(schema) | "WriteRawMetadata" >> tft_beam.WriteMetadata(
      FileSystems.join(self._transform_dir, "metadata"), serialized.pipeline
    )
    # One element per write, present once both are on disk (a side input
    # that makes a later step wait for them).
    return (
      written | "TransformWritten" >> beam.Map(lambda _: "transform_fn"),
      raw | "RawSchemaWritten" >> beam.Map(lambda _: "metadata"),
    ) | "Written" >> beam.Flatten()
