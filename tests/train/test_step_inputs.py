"""The step makes the click encodings and the previous mask from the clicks:
what the reader reads, and that the model input is the records' bit for bit."""

import numpy as np
import pytest
import tensorflow as tf

from beam_prep import keys
from beam_prep.prep_output import PrepOutput
from beam_prep.record_decoder import Decoder
from train.fit.data import InputReader, Parser
from train.fit import step_inputs
from train.fit.step_inputs import StepInputs
from train.tasks import make_task


def _both_ways(prep_dir, split):
  """(model inputs from the stored maps, from what the trainer reads) of a split's records."""
  prep = PrepOutput(prep_dir)
  task = make_task(prep.table, prep.tft_output)
  parser = Parser(prep.tft_output, prep.table, task)
  stored = Decoder(prep.table, task.transform_keys + task.eval_keys)
  read = Decoder(prep.table, parser.read_keys(training=False))
  records = tf.constant([r.numpy() for r in prep.dataset(split)])
  from_stored, _ = parser(stored.stored(records, training=False), training=False)
  from_read, _ = parser(read.stored(records, training=False), training=False)
  return parser, from_stored.numpy(), from_read.numpy()


@pytest.mark.parametrize("which", ["guided_prep", "prep_dir"])
def test_the_step_makes_the_records_click_inputs_exactly(which, request):
  """Disks with a previous mask, and distance maps (the session's records):
  nothing made from the clicks is read, and the model input is unchanged."""
  prep_dir = request.getfixturevalue(which)
  table = PrepOutput(prep_dir).table
  made = {keys.CLICK_DISKS, keys.PREV_MASK} if which == "guided_prep" else {keys.DISTANCE_MAPS}
  parser, want, got = _both_ways(prep_dir, keys.TRAIN_SPLIT)
  assert set(parser.step.empty) == made and not parser.step.read_from_records
  read = parser.read_keys(training=True)
  assert not made & set(read)
  assert {keys.IMAGE, keys.MASK, keys.POSITIVE_CLICKS, keys.NEGATIVE_CLICKS} <= set(read)
  assert want.shape[0] > 4 and want.shape[-1] == table.input_channels
  np.testing.assert_array_equal(got, want)
  # Not made of nothing: the click channels do change from example to example.
  offset = 3
  assert np.unique(want[..., offset : offset + 2].reshape(want.shape[0], -1), axis=0).shape[0] > 1


def test_training_batches_carry_the_clicks_not_the_maps(guided_prep):
  prep = PrepOutput(guided_prep)
  reader = InputReader(prep, make_task(prep.table, prep.tft_output), batch_size=4)
  batch = next(iter(reader.dataset(keys.TRAIN_SPLIT, training=True)))
  assert keys.CLICK_DISKS not in batch and keys.PREV_MASK not in batch
  # The clicks as stored, one string a variant: the step unpacks them.
  assert batch[keys.POSITIVE_CLICKS].dtype == tf.string
  assert batch[keys.POSITIVE_CLICKS].shape == (4,)
  inputs, _ = reader.parser(batch, training=True)
  assert inputs.shape[0] == 4 and float(tf.reduce_max(inputs[..., 3])) == 1.0


def test_an_input_the_transform_maps_by_more_than_its_pixel_is_read_from_the_records(prep_dir):
  """A transform that maps each pixel by its own value (here doubled) is looked
  up; one that is not (here minus the map's mean: a user's preprocessing_fn
  may) leaves the maps to the records, and the reason is said."""
  prep = PrepOutput(prep_dir)
  task = make_task(prep.table, prep.tft_output)
  layer = prep.tft_output.transform_features_layer()

  def changed(fn):
    def transform(raw):
      out = dict(layer(raw))
      out[keys.DISTANCE_MAPS] = fn(out[keys.DISTANCE_MAPS])
      return out

    return transform

  doubled = StepInputs(prep.table, changed(lambda m: 2.0 * m), task.transform_keys)
  assert set(doubled.empty) == {keys.DISTANCE_MAPS}
  centred = StepInputs(
    prep.table,
    changed(lambda m: m - tf.reduce_mean(m, axis=[1, 2, 3], keepdims=True)),
    task.transform_keys,
  )
  assert not centred.empty and not centred.reads
  assert "own value" in centred.read_from_records[keys.DISTANCE_MAPS]


def test_the_transform_is_asked_once_per_input_while_it_lives(prep_dir):
  """The reader's step inputs and the corrective clicks' exact tables ask the
  same transform layer (each probe costs seconds at fit's start): the second
  gets the first's tables without asking."""
  prep = PrepOutput(prep_dir)
  task = make_task(prep.table, prep.tft_output)
  layer = prep.tft_output.transform_features_layer()
  calls = []

  def transform(raw):
    calls.append(len(next(iter(raw.values()))))
    return layer(raw)

  assert StepInputs(prep.table, transform, task.transform_keys).empty
  asked = len(calls)
  assert sum(calls) == 257, calls  # 256 values and the ramp, once.
  inputs = step_inputs.exact(
    step_inputs.click_inputs(prep.table), transform, prep.table, task.transform_keys
  )
  assert inputs and all(c.lut is not None for c in inputs) and len(calls) == asked


def test_clicks_changed_after_their_encoding_leave_the_maps_to_the_records(prep_dir):
  """A user op after the encoding that moves the clicks: the stored maps are
  not the stored clicks' maps, so nothing is made from them."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  from beam_prep.features import FeatureTable  # pylint: disable=g-import-not-at-top
  from beam_prep.ops import registry  # pylint: disable=g-import-not-at-top

  table = PrepOutput(prep_dir).table
  with registry.temporary_ops():

    @registry.register_op(
      "test_move_clicks",
      reads=(keys.POSITIVE_CLICKS,),
      produces={keys.POSITIVE_CLICKS: table[keys.POSITIVE_CLICKS].feature},
    )
    def _move():
      return lambda ex: ex

    entries = [
      dataclasses.replace(e, op="test_move_clicks") if e.key == keys.POSITIVE_CLICKS else e
      for e in table
    ]
    moved = FeatureTable(
      entries,
      table.image_size,
      table.task,
      table.chain + "|test_move_clicks",
      table.ops_module,
      table.variants,
    )
    step = StepInputs(moved, None, [])
  assert not step.empty and not step.reads
  assert step.read_from_records[keys.DISTANCE_MAPS] == (
    "op 'test_move_clicks' changes the clicks after op 'distance_maps' encoded them"
  )


@pytest.mark.parametrize("which", ["guided_prep", "prep_dir"])
def test_a_corrective_click_gives_the_model_input_of_all_clicks_exactly(which, request):
  """`step_inputs.add_click` with the transform's tables (`exact`, what the
  step's corrective clicks use): a record's model input less its last
  positive click, plus that click, is its model input, bit for bit."""
  prep = PrepOutput(request.getfixturevalue(which))
  task = make_task(prep.table, prep.tft_output)
  parser = Parser(prep.tft_output, prep.table, task)
  transform = prep.tft_output.transform_features_layer()
  inputs = step_inputs.exact(
    step_inputs.click_inputs(prep.table), transform, prep.table, task.transform_keys
  )
  assert inputs and all(c.lut is not None for c in inputs)
  decoder = Decoder(prep.table, parser.read_keys(training=False))
  records = tf.constant([r.numpy() for r in prep.dataset(keys.EVAL_SPLIT).take(4)])
  stored = decoder.stored(records, training=False)
  pos = stored[keys.POSITIVE_CLICKS]
  ends = tf.strings.length(pos) - 16
  last = tf.io.decode_raw(tf.strings.substr(pos, ends, tf.fill(tf.shape(ends), 16)), tf.int64)
  less = dict(stored, **{keys.POSITIVE_CLICKS: tf.strings.substr(pos, tf.zeros_like(ends), ends)})
  want, _ = parser(stored, training=False)
  before, _ = parser(less, training=False)
  n = int(tf.shape(last)[0])
  assert not np.array_equal(before.numpy(), want.numpy())
  got = step_inputs.add_click(before, inputs, last, tf.ones([n], tf.bool), tf.ones([n], tf.bool))
  np.testing.assert_array_equal(got.numpy(), want.numpy())
