"""The input path: Decoder (schema), Parser (train/eval branches), InputReader.

Nothing here hard-codes the record schema: the Decoder parses with the raw
feature spec of the tf.Transform output, and the Parser applies the exported
transform graph, the same one the serving model carries. No Python runs per
example: parsing, transform and augmentation are graph ops inside tf.data.

Segmentation keeps the data uint8 as long as possible: the reader yields the
parsed raw features (uint8 bytes of image, maps and mask), and the Parser
(the exported transform graph: decode, cast, standardize) runs inside the
training step, on the device, so the host only parses and copies bytes.
Classification (whose transform holds a vocabulary table) applies the
Parser in tf.data.

Parser output per batch, `(inputs, labels)`:
  segmentation    inputs  float32 [B, H, W, 5]: standardized RGB + two
                          distance maps in [0, 1]
                  labels  {"label": float32 [B, H, W, 1], "label_weight": same}
  classification  inputs  float32 [B, H, W, 3]
                  labels  {"label": int64 [B]}
"""

import os
from typing import Dict, List, Optional

import tensorflow as tf
import tensorflow_transform as tft

from beam_prep import keys

SEGMENTATION = "segmentation"
CLASSIFICATION = "classification"


def task_of(tft_output: tft.TFTransformOutput) -> str:
  """Which kind of records a transform output belongs to."""
  spec = tft_output.transformed_feature_spec()
  return SEGMENTATION if keys.DISTANCE_MAPS in spec else CLASSIFICATION


# The raw features each task's transform graph reads; the rest of a record
# (ids, clicks) is for tracing a record back, not for training.
TRANSFORM_INPUTS = {
    SEGMENTATION: (keys.IMAGE, keys.DISTANCE_MAPS, keys.MASK),
    CLASSIFICATION: (keys.IMAGE, keys.LABEL),
}


class Decoder:
  """Serialized records -> raw feature tensors, by the transform output's spec.

  Args:
    tft_output: the transform output whose raw feature spec is used.
    only_transform_inputs: parse only the features the transform reads.
  """

  def __init__(self, tft_output: tft.TFTransformOutput, only_transform_inputs: bool = False):
    spec = tft_output.raw_feature_spec()
    if only_transform_inputs:
      spec = {k: spec[k] for k in TRANSFORM_INPUTS[task_of(tft_output)]}
    self._spec = spec

  @property
  def feature_spec(self):
    return dict(self._spec)

  def decode(self, serialized: tf.Tensor) -> Dict[str, tf.Tensor]:
    """Parses a batch [B] of serialized tf.Examples."""
    return tf.io.parse_example(serialized, self._spec)


def model_inputs(transformed: Dict[str, tf.Tensor]) -> tf.Tensor:
  """The model's input from transformed features (5 channels with maps)."""
  if keys.DISTANCE_MAPS in transformed:
    return tf.concat([transformed[keys.IMAGE], transformed[keys.DISTANCE_MAPS]], axis=-1)
  return transformed[keys.IMAGE]


class Parser:
  """Raw features -> `(inputs, labels)`, with a train and an eval branch.

  The train branch adds the only augmentation cheap enough to do on the fly: a
  random left-right flip (of image, maps and labels together). The heavy
  augmentation (click variants) was precomputed by the Beam job.
  """

  def __init__(self, tft_output: tft.TFTransformOutput, seed: int = 0):
    self._transform = tft_output.transform_features_layer()
    self._task = task_of(tft_output)
    self._seed = seed

  def __call__(self, raw: Dict[str, tf.Tensor], training: bool):
    t = self._transform(raw)
    inputs = model_inputs(t)
    flip = None
    if training:
      flip = tf.random.uniform([tf.shape(inputs)[0], 1, 1, 1], seed=self._seed) < 0.5
      inputs = tf.where(flip, tf.reverse(inputs, axis=[2]), inputs)
    if self._task == CLASSIFICATION:
      return inputs, {keys.LABEL: t[keys.LABEL]}
    labels = tf.stack([t[keys.LABEL], t[keys.LABEL_WEIGHT]], axis=-1)
    if flip is not None:
      labels = tf.where(flip, tf.reverse(labels, axis=[2]), labels)
    return inputs, {keys.LABEL: labels[..., :1], keys.LABEL_WEIGHT: labels[..., 1:]}


def record_files(data_dir: str, split: str) -> str:
  """Glob of a split's shards in a beam_prep output directory."""
  return os.path.join(data_dir, keys.RECORDS_DIR, f"{split}-*{keys.RECORD_SUFFIX}*")


class InputReader:
  """Owns globbing, sharding by input context, shuffle, batching, prefetch.

  Args:
    data_dir: beam_prep output directory.
    tft_output: its transform output.
    batch_size: examples per replica (per input pipeline).
    shuffle_buffer: shuffle buffer in examples.
    seed: shuffle seed.
    skip_corrupt_records: drop records that fail to read or parse instead of
      stopping.
  """

  def __init__(self, data_dir: str, tft_output: tft.TFTransformOutput, batch_size: int,
               shuffle_buffer: int = 256, seed: int = 0, skip_corrupt_records: bool = False):
    self._data_dir = data_dir
    self._decoder = Decoder(tft_output, only_transform_inputs=True)
    self.parser = Parser(tft_output, seed)
    # Segmentation: transform on the device (see the module docstring).
    self.transform_in_step = task_of(tft_output) == SEGMENTATION
    self._batch_size = batch_size
    self._shuffle_buffer = shuffle_buffer
    self._seed = seed
    self._skip = skip_corrupt_records

  def files(self, split: str) -> List[str]:
    pattern = record_files(self._data_dir, split)
    files = sorted(tf.io.gfile.glob(pattern))
    if not files:
      raise FileNotFoundError(f"no {split} records match {pattern}")
    return files

  def records(self, split: str, training: bool,
              input_context: Optional[tf.distribute.InputContext] = None) -> tf.data.Dataset:
    """Serialized records of a split: this input pipeline's shards, interleaved."""
    files = self.files(split)
    compression = "GZIP" if files[0].endswith(".gz") else ""
    ds = tf.data.Dataset.from_tensor_slices(files)
    if input_context and input_context.num_input_pipelines > 1:
      if len(files) < input_context.num_input_pipelines:
        raise ValueError(f"{len(files)} {split} shards cannot feed "
                         f"{input_context.num_input_pipelines} input pipelines; write more "
                         "shards (beam-prep --num-shards)")
      ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    if training:
      ds = ds.shuffle(len(files), seed=self._seed, reshuffle_each_iteration=True)
    ds = ds.interleave(lambda f: tf.data.TFRecordDataset(f, compression_type=compression),
                       cycle_length=min(len(files), 8), num_parallel_calls=tf.data.AUTOTUNE,
                       deterministic=not training)
    if self._skip:
      ds = ds.ignore_errors()
    return ds

  def dataset(self, split: str, training: bool,
              input_context: Optional[tf.distribute.InputContext] = None) -> tf.data.Dataset:
    """Batches for the step; training: shuffled, repeated, full batches.

    Elements are raw feature dicts when `transform_in_step` (apply
    `self.parser` in the step), else `(inputs, labels)`.
    """
    ds = self.records(split, training, input_context)
    if training:
      ds = ds.shuffle(self._shuffle_buffer, seed=self._seed).repeat()
    # Batch before parsing: one parse_example (and transform) call per batch.
    ds = ds.batch(self._batch_size, drop_remainder=training)
    if self.transform_in_step:
      ds = ds.map(self._decoder.decode, num_parallel_calls=tf.data.AUTOTUNE,
                  deterministic=not training)
    else:
      ds = ds.map(lambda s: self.parser(self._decoder.decode(s), training),
                  num_parallel_calls=tf.data.AUTOTUNE, deterministic=not training)
    return ds.prefetch(tf.data.AUTOTUNE)

  def model_batches(self, split: str, training: bool) -> tf.data.Dataset:
    """`(inputs, labels)` batches, whichever side applies the transform."""
    ds = self.dataset(split, training)
    if self.transform_in_step:
      ds = ds.map(lambda raw: self.parser(raw, training))
    return ds


class RecordsError(Exception):
  """The records cannot be trained on; the message names the shard and why."""


def _first_record(path: str, compression: str):
  return next(iter(tf.data.TFRecordDataset(path, compression_type=compression).take(1)), None)


def check_shards(files: List[str], tft_output: tft.TFTransformOutput) -> None:
  """Checks each shard's first record against the transform output, cheaply.

  Catches a shard from another run (other schema or image size) or an
  unreadable shard before training starts.

  Raises:
    RecordsError: naming the shard and the reason.
  """
  spec = tft_output.raw_feature_spec()
  wanted = {k: spec[k] for k in TRANSFORM_INPUTS[task_of(tft_output)]}
  for k in (keys.HEIGHT, keys.WIDTH):
    wanted[k] = spec[k]
  size = int(tft_output.transformed_feature_spec()[keys.IMAGE].shape[0])
  for path in files:
    compression = "GZIP" if path.endswith(".gz") else ""
    try:
      first = _first_record(path, compression)
    except tf.errors.OpError as e:
      raise RecordsError(f"shard {path} cannot be read: {e.message.strip()} (pass "
                         "--skip-corrupt-records to train without its bad part)") from None
    if first is None:
      continue  # An empty shard (a split smaller than the shard count).
    try:
      parsed = tf.io.parse_single_example(first, wanted)
    except tf.errors.InvalidArgumentError as e:
      raise RecordsError(
          f"shard {path} does not match the raw schema of the transform output "
          f"(a shard from another run?): {e.message.splitlines()[0]}") from None
    h, w = int(parsed[keys.HEIGHT]), int(parsed[keys.WIDTH])
    if (h, w) != (size, size):
      raise RecordsError(f"shard {path} holds {w}x{h} images but the transform output "
                         f"expects {size}x{size} (a shard from another run?)")
    n = h * w * 3
    if len(parsed[keys.IMAGE].numpy()) != n:
      raise RecordsError(f"shard {path}: image bytes do not hold {w}x{h}x3 uint8")


def scan_shards(files: List[str]) -> Dict[str, Dict[str, object]]:
  """Reads every shard fully: readable records and the error, if any, per shard."""
  out = {}
  for path in files:
    compression = "GZIP" if path.endswith(".gz") else ""
    n, error = 0, None
    try:
      for _ in tf.data.TFRecordDataset(path, compression_type=compression):
        n += 1
    except tf.errors.OpError as e:
      error = e.message.strip().splitlines()[0]
    out[path] = {"records": n, "error": error}
  return out
