"""The input path: Decoder (schema), Parser (train/eval branches), InputReader.

Nothing here names a feature: the prep output's `features.json` (a
`beam_prep.features.FeatureTable`) says what the records hold, the Decoder
parses the keys the task needs by its raw feature spec, and the Parser applies
the exported tf.Transform graph, the same one the serving model carries, then
concatenates the declared model inputs in declared order. No Python runs per
example: parsing, transform and augmentation are graph ops.

A record holds one object with all its click variants; the Decoder
(`beam_prep.record_decoder`, the one reader of records, also behind
`RecordCodec.decode_examples`) picks one variant per record and step in the
graph (or, on eval, keeps each). The Parser decompresses what the record
stores compressed and unpacks the stacked clicks (`record_decoder.raw_view`).
The click encodings and the previous mask are not read: the step makes
them from the clicks (`train.fit.step_inputs`), so the reader parses the image,
the mask and the clicks.

Segmentation keeps the data compact as long as possible: the reader yields
the picked records' features as stored (bytes), and the Parser (decompress,
decode, cast, normalize) runs inside the training step, so the reader only
parses and copies bytes; the mask's inflation and the clicks' unpacking cost
about 1 ms a batch of 16 there, where the reader gave half its rate to them.
Classification (whose transform holds a vocabulary table) applies the Parser
in tf.data.

Parser output per batch, `(inputs, labels)`:
  inputs  float32 [B, H, W, C]: the model inputs of features.json, in order
          (C = FeatureTable.input_channels)
  labels  segmentation: {"label": float32 [B, H, W, 1], "label_weight": same},
          plus, on eval batches, the raw click features the baseline uses
          classification: {"label": int64 [B]}
"""

from typing import Dict, List, Optional, Sequence

import tensorflow as tf
import tensorflow_transform as tft

from beam_prep import keys
from beam_prep.features import FeatureTable
from beam_prep.prep_output import PrepOutput
from beam_prep.record_decoder import Decoder, raw_view
from train.fit import augment as augment_
from train import graphs
from train import logs
from train.config import TrainConfig
from train.export.serving_inputs import model_inputs
from train.fit.step_inputs import StepInputs
from train.tasks import make_task


class Parser:
  """Records' features as stored -> `(inputs, labels)`, with a train and an eval branch.

  The train branch adds the augmentation cheap enough to do on the fly
  (`train.fit.augment`: a left-right flip of the inputs and the task's per-pixel
  labels together, and the image's colour jitter), as `augment` names. The
  heavy augmentation (crop jitter, click variants) was precomputed by the
  Beam job. Raw features the transform does not read (e.g. clicks on eval
  batches) pass through into `labels`.
  """

  def __init__(
    self,
    tft_output: tft.TFTransformOutput,
    table: FeatureTable,
    task,
    seed: int = 0,
    augment: Sequence[str] = (),
  ):
    self._transform = tft_output.transform_features_layer()
    self._table = table
    self._task = task
    self._seed = seed
    self._transform_inputs = set(task.transform_keys)
    self.step = StepInputs(table, self._transform, task.transform_keys)
    for key, why in self.step.read_from_records.items():
      logs.get().info("train: %s is read from the records, not made in the step: %s", key, why)
    self._flip = "flip" in augment
    self._colour = None
    if "colour" in augment:
      try:
        self._colour = augment_.Colour(table, self._transform, task.transform_keys, seed=seed)
      except ValueError as e:  # Trains on, without it, and says so.
        logs.get().warning("train: %s", e)

  def read_keys(self, training: bool) -> List[str]:
    """The raw features to read: the transform's, but those the step makes
    (`train.fit.step_inputs`), and what it makes them from; eval: the task's eval keys too."""
    wanted = [k for k in self._task.transform_keys if k not in self.step.empty]
    wanted += self.step.reads + ([] if training else self._task.eval_keys)
    return list(dict.fromkeys(wanted))

  def __call__(self, stored: Dict[str, tf.Tensor], training: bool):
    """Picked or expanded records, as stored (`Decoder.stored`) -> `(inputs, labels)`."""
    raw = raw_view(self._table, stored)
    given = {k: v for k, v in raw.items() if k in self._transform_inputs}
    t = self._transform({**self.step.constants(given), **given})
    if training and self._colour:
      t = self._colour(t)
    inputs = self.step(model_inputs(self._table, t), raw)
    labels = self._task.labels(t)
    if training and self._flip:
      inputs, labels = augment_.flip(inputs, labels, self._task, self._seed)
    for k, v in raw.items():
      if k not in self._transform_inputs:
        labels[k] = v
    return inputs, labels


class InputReader:
  """Owns the shard list, sharding by input context, shuffle, batching, prefetch.

  Args:
    prep: the beam-prep output (its records, features.json and transform).
    task: the training task (`train.tasks`).
    batch_size: examples per replica (per input pipeline).
    shuffle_buffer: shuffle buffer in examples.
    seed: shuffle seed.
    skip_corrupt_records: drop records that fail to read or parse instead of
      stopping.
    augment: the training batches' augmentation (`train.fit.augment`).
  """

  def __init__(
    self,
    prep: PrepOutput,
    task,
    batch_size: int,
    shuffle_buffer: int = TrainConfig.shuffle_buffer,
    seed: int = 0,
    skip_corrupt_records: bool = False,
    augment: Sequence[str] = augment_.parse(augment_.DEFAULT),
  ):
    self.prep = prep
    table = prep.table
    self.parser = Parser(prep.tft_output, table, task, seed, augment)
    self._decoders = {t: Decoder(table, self.parser.read_keys(t), seed) for t in (True, False)}
    # Segmentation: transform on the device (see the module docstring).
    self.transform_in_step = task.transform_in_step
    self._batch_size = batch_size
    self._shuffle_buffer = shuffle_buffer
    self._seed = seed
    self._skip = skip_corrupt_records

  def files(self, split: str) -> List[str]:
    """The split's shards; FileNotFoundError when there is none."""
    files = self.prep.files(split)
    if not files:
      raise FileNotFoundError(
        f"no {split} records match {keys.record_pattern(self.prep.path, split)}"
      )
    return files

  def records(
    self, split: str, training: bool, input_context: Optional[tf.distribute.InputContext] = None
  ) -> tf.data.Dataset:
    """Serialized records of a split: this input pipeline's shards, interleaved."""
    files = self.files(split)
    compression = keys.compression_of(files[0])
    ds = tf.data.Dataset.from_tensor_slices(files)
    if input_context and input_context.num_input_pipelines > 1:
      if len(files) < input_context.num_input_pipelines:
        raise ValueError(
          f"{len(files)} {split} shards cannot feed "
          f"{input_context.num_input_pipelines} input pipelines; write more "
          "shards (a smaller beam-prep --target-shard-mb)"
        )
      ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    if training:
      ds = ds.shuffle(len(files), seed=self._seed, reshuffle_each_iteration=True)
    ds = ds.interleave(
      lambda f: tf.data.TFRecordDataset(f, compression_type=compression),
      cycle_length=min(len(files), 8),
      num_parallel_calls=tf.data.AUTOTUNE,
      deterministic=not training,
    )
    if self._skip:
      ds = ds.ignore_errors()
    return ds

  def dataset(
    self, split: str, training: bool, input_context: Optional[tf.distribute.InputContext] = None
  ) -> tf.data.Dataset:
    """Batches for the step; training: shuffled, repeated, full batches.

    Elements are the picked records' features as stored (`Decoder.stored`)
    when `transform_in_step` (apply `self.parser` in the step), else
    `(inputs, labels)`.
    """
    ds = self.records(split, training, input_context)
    decoder = self._decoders[training]
    if training:
      ds = ds.shuffle(self._shuffle_buffer, seed=self._seed).repeat()
      # Batch before parsing: one parse_example (and transform) call per batch.
      ds = ds.batch(self._batch_size, drop_remainder=True)
      ds = ds.map(
        graphs.dataset_fn(decoder.stored), num_parallel_calls=tf.data.AUTOTUNE, deterministic=False
      )
    else:
      # Every variant is an eval example: records are parsed and expanded,
      # then rebatched into examples.
      ds = ds.batch(self._batch_size).map(
        graphs.dataset_fn(lambda s: decoder.stored(s, training=False))
      )
      ds = ds.unbatch().batch(self._batch_size)
    if not self.transform_in_step:
      ds = ds.map(
        graphs.dataset_fn(lambda raw: self.parser(raw, training)),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=not training,
      )
    return ds.prefetch(tf.data.AUTOTUNE)

  def model_batches(self, split: str, training: bool) -> tf.data.Dataset:
    """`(inputs, labels)` batches, whichever side applies the transform."""
    ds = self.dataset(split, training)
    if self.transform_in_step:
      ds = ds.map(graphs.dataset_fn(lambda raw: self.parser(raw, training)))
    return ds


def dataset(
  data_dir: str,
  split: str = keys.TRAIN_SPLIT,
  batch_size: int = TrainConfig.batch_size,
  training: bool = True,
  shuffle_buffer: int = TrainConfig.shuffle_buffer,
  seed: int = TrainConfig.seed,
  keras_form: bool = True,
  augment: str = TrainConfig.augment,
) -> tf.data.Dataset:
  """The records of a beam-prep output, as the trainer's step receives them.

  Reads `data_dir`'s records with its `features.json` and exported
  tf.Transform graph (the very graph the serving model carries), stacks the
  declared model inputs in declared order, and, when `training`, shuffles,
  repeats (give Keras `steps_per_epoch`) and augments as the trainer does.

  Args:
    data_dir: a complete beam-prep output (with `_SUCCESS`).
    split: "train" or "eval".
    batch_size: examples per batch (training drops the last partial batch).
    training: shuffle, repeat and augment; else one pass in file order.
    shuffle_buffer: examples in the shuffle buffer.
    seed: shuffle (and augmentation) seed.
    augment: `beam-train fit --augment`: flip, colour, both or none.
    keras_form: elements for Keras `model.fit`:
      segmentation `(inputs, label, label_weight)`: label_weight is 0 on
      ignore pixels and is Keras's per-pixel sample weight;
      classification `(inputs, label)`, label the vocabulary index.
      With False, `(inputs, labels)` with the labels dict the trainer's loss
      reads (on eval batches, with the raw clicks the baseline uses).

  Returns:
    A `tf.data.Dataset`; inputs are float32 [B, H, W, C], C being
    `features.json`'s input channels.
  """
  prep = PrepOutput(data_dir)
  prep.check_trainable()
  task = make_task(prep.table, prep.tft_output)
  reader = InputReader(
    prep, task, batch_size, shuffle_buffer, seed, augment=augment_.parse(augment)
  )
  ds = reader.model_batches(split, training)
  if keras_form:
    ds = ds.map(graphs.dataset_fn(task.keras_form), num_parallel_calls=tf.data.AUTOTUNE)
  return ds
