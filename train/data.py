"""The input path: Decoder (schema), Parser (train/eval branches), InputReader.

Nothing here hard-codes the record schema: the Decoder parses with the raw
feature spec of the tf.Transform output, and the Parser applies the exported
transform graph, the same one the serving model carries. No Python runs per
example: parsing, transform and augmentation are graph ops inside tf.data.

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


class Decoder:
  """Serialized records -> raw feature tensors, by the transform output's spec."""

  def __init__(self, tft_output: tft.TFTransformOutput):
    self._spec = tft_output.raw_feature_spec()

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
    self._decoder = Decoder(tft_output)
    self._parser = Parser(tft_output, seed)
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
    """Batches of `(inputs, labels)`; training: shuffled, repeated, full batches."""
    ds = self.records(split, training, input_context)
    if training:
      ds = ds.shuffle(self._shuffle_buffer, seed=self._seed).repeat()
    # Batch before parsing: one parse_example and one transform call per batch.
    ds = ds.batch(self._batch_size, drop_remainder=training)
    ds = ds.map(lambda s: self._parser(self._decoder.decode(s), training),
                num_parallel_calls=tf.data.AUTOTUNE, deterministic=not training)
    return ds.prefetch(tf.data.AUTOTUNE)
