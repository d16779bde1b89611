"""The previous mask as a model input: records, training rounds, serving."""

import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from beam_prep import keys
from beam_prep.features import FEATURES_FILE
from beam_prep.prep_output import PrepOutput
from tests.helpers import assert_serving_parity, examples
from train.evaluate import clicker
from train.export import saved_model
from train.export.served import ServedModel
from train.tasks import make_task


def _prev_model(table, channel: int) -> tf.keras.Model:
  """A model whose logits are its previous-mask input channel: +10 on it, -10 off it."""
  h, w = table.image_size
  x = tf.keras.Input([h, w, table.input_channels])
  logits = tf.keras.layers.Lambda(lambda t: 20.0 * t[..., channel : channel + 1] - 10.0)(x)
  return tf.keras.Model(x, logits)


def test_records_hold_a_zero_previous_mask_after_the_click_encodings(guided_prep):
  prep = PrepOutput(guided_prep)
  assert prep.table.keys("model_input")[-1] == keys.PREV_MASK
  assert prep.table.input_channels == 3 + 2 + 1
  held = [ex[keys.PREV_MASK] for ex in examples(guided_prep)]
  assert held and all(m.shape == (48, 48, 1) and not m.any() for m in held)


def test_the_step_rounds_feed_the_models_own_mask_back(guided_prep):
  """0 to --mask-rounds rounds: the previous-mask channel is zeros or the model's
  thresholded prediction, the other channels untouched, no gradient through it."""
  prep = PrepOutput(guided_prep)
  task = make_task(prep.table, prep.tft_output, {"mask_rounds": 2})
  c = prep.table.input_channels - 1
  h, w = prep.table.image_size
  x = tf.keras.Input([h, w, c + 1])
  model = tf.keras.Model(
    x,
    tf.keras.layers.Lambda(  # Red high, and not predicted before.
      lambda t: t[..., :1] - 2.0 * t[..., c : c + 1]
    )(x),
  )
  inputs = tf.random.stateless_normal([4, h, w, c + 1], seed=[1, 2])
  inputs = tf.concat([inputs[..., :c], tf.zeros([4, h, w, 1])], axis=-1)
  seen = set()
  for _ in range(30):
    with tf.GradientTape() as tape:
      tape.watch(inputs)
      out = task.iterate(model, inputs, None)
    assert tape.gradient(out, inputs) is None
    np.testing.assert_array_equal(out[..., :c], inputs[..., :c])
    prev = out[..., c:].numpy()
    assert set(np.unique(prev)) <= {0.0, 1.0}
    thr = clicker.logit_threshold()  # As served: probability above 0.49.
    first = (inputs[..., :1].numpy() > thr).astype(np.float32)  # Round 1's mask.
    second = (inputs[..., :1].numpy() - 2.0 * first > thr).astype(np.float32)
    rounds = [i for i, m in enumerate([np.zeros_like(first), first, second]) if (prev == m).all()]
    assert rounds, "the channel is neither zeros nor a round's mask"
    seen.add(rounds[-1])
  assert seen == {0, 1, 2}
  assert (
    make_task(prep.table, prep.tft_output, {"mask_rounds": 0}).iterate(model, inputs, None)
    is inputs
  )


def test_the_served_model_sees_the_previous_mask(guided_prep, tmp_path):
  """serve_iterative gives the model the request's previous mask in the records'
  frame: a model that echoes that channel returns the previous mask."""
  prep = PrepOutput(guided_prep)
  model = _prev_model(prep.table, prep.table.input_channels - 1)
  path = saved_model.export_model(model, prep.tft_output, prep.table, str(tmp_path / "export"))
  served = ServedModel(path)
  rng = np.random.default_rng(0)
  image = rng.integers(0, 255, (90, 120, 3), dtype=np.uint8)
  previous = np.zeros((90, 120), np.uint8)
  previous[30:60, 40:90] = 1
  out = served.segment(image, [(60, 45)], [], previous)
  mask = out["mask"] > 0
  inter, union = (mask & (previous > 0)).sum(), (mask | (previous > 0)).sum()
  assert inter / union > 0.9
  # Without a previous mask the model gets zeros (and finds nothing).
  assert not served.segment(image, [(60, 45)], [])["mask"].any()


def test_serving_parity_with_a_previous_mask_input(guided_prep, tmp_path):
  """What serving computes from a record's image and clicks is what the record
  holds, for a model that takes the previous mask (any weights: training it
  with --mask-rounds is the --xla test of test_trainer.py)."""
  from train import models  # pylint: disable=g-import-not-at-top
  from train.evaluate import source_eval  # pylint: disable=g-import-not-at-top

  prep = PrepOutput(guided_prep)
  model = models.build_model(
    "segmentation_fcn",
    prep.table.input_channels,
    image_size=prep.table.image_size,
    builtin={"width": 4, "depth": 1},
  )
  # Laid out as a fit's model dir: its features.json beside export/.
  shutil.copy(os.path.join(guided_prep, FEATURES_FILE), tmp_path)
  path = saved_model.export_model(model, prep.tft_output, prep.table, str(tmp_path / "export"))
  assert_serving_parity(guided_prep, path, n=3, model=model)
  # noc.json names what the model used besides image and clicks.
  report = source_eval.evaluate(
    prep, str(tmp_path / "eval"), path, max_clicks=2, max_objects=2, flip=True
  )
  assert report["extras"] == {"previous_mask_input": True, "zoom_in": True, "flip_averaging": True}


@pytest.mark.parametrize("op", ["distance_maps", "click_disks"])
def test_one_more_click_equals_the_encoding_of_all_clicks(op):
  """`add_click` (what the step's corrective clicks use) gives exactly what the op's
  twin computes over all the clicks, for either kind, with and without earlier clicks."""
  from beam_prep.ops import registry  # pylint: disable=g-import-not-at-top

  spec = registry.parse_chain(op)[0]
  twin, add = registry.build_twin(spec), registry.build_add_click(spec)
  key = registry.op_entry(op).provides[0]
  rng = np.random.default_rng(7)
  h, w = 37, 52
  image = tf.zeros([h, w, 3], tf.uint8)

  def encoded(pos, neg):
    ex = twin(
      {
        keys.IMAGE: image,
        keys.POSITIVE_CLICKS: tf.constant(pos, tf.int64, [len(pos), 2]),
        keys.NEGATIVE_CLICKS: tf.constant(neg, tf.int64, [len(neg), 2]),
      }
    )
    return tf.cast(ex[key], tf.float32)

  for earlier in (0, 1, 3):
    pos = [[int(rng.integers(w)), int(rng.integers(h))] for _ in range(earlier)]
    neg = [[int(rng.integers(w)), int(rng.integers(h))] for _ in range(earlier // 2)]
    new = [[int(rng.integers(w)), int(rng.integers(h))] for _ in range(2)]
    value = tf.stack([encoded(pos, neg)] * 2)
    got = add(value, tf.constant(new, tf.int64), tf.constant([True, False]))
    np.testing.assert_array_equal(got[0], encoded(pos + [new[0]], neg))
    np.testing.assert_array_equal(got[1], encoded(pos, neg + [new[1]]))


def test_the_training_click_goes_into_the_larger_error():
  """RITM's training click: in the inner half of the larger error region, positive for
  missed object, negative for a false alarm; none when nothing is wrong."""
  truth = np.zeros([3, 20, 30], bool)
  truth[:, 2:18, 2:20] = True
  pred = truth.copy()
  pred[0, 2:18, 2:12] = False  # example 0: a large miss
  pred[1, :, 22:] = True  # example 1: a false alarm strip
  care = np.ones_like(truth)
  for seed in range(5):
    xy, positive, valid = clicker.training_click(
      tf.constant(pred), tf.constant(truth), tf.constant(care), seed=seed
    )
    (x0, y0), (x1, y1) = xy.numpy()[0], xy.numpy()[1]
    assert positive.numpy()[0] and 4 <= x0 <= 9 and 4 <= y0 <= 15  # inner half of 2:12 x 2:18
    assert not positive.numpy()[1] and 24 <= x1 <= 27 and 2 <= y1 <= 17  # its inner half
    assert list(valid.numpy()) == [True, True, False]


def test_corrective_rounds_add_a_click_to_the_encodings(guided_prep):
  """With --corrective-clicks a round adds one disk of the error's kind to the
  click disks; the previous mask channel holds the round's prediction."""
  prep = PrepOutput(guided_prep)
  task = make_task(prep.table, prep.tft_output, {"mask_rounds": 1, "corrective_clicks": True})
  c = prep.table.input_channels - 1
  h, w = prep.table.image_size
  x = tf.keras.Input([h, w, c + 1])
  model = tf.keras.Model(x, tf.keras.layers.Lambda(lambda t: t[..., :1] * 0 - 5.0)(x))  # empty
  inputs = tf.zeros([2, h, w, c + 1])
  label = np.zeros([2, h, w, 1], np.float32)
  label[:, 10:30, 10:30] = 1
  labels = {keys.LABEL: tf.constant(label), keys.LABEL_WEIGHT: tf.ones([2, h, w, 1])}
  changed = None
  for _ in range(20):
    out = task.iterate(model, inputs, labels).numpy()
    if out.any():
      changed = out
      break
  assert changed is not None, "no round was drawn in 20 steps"
  disks = changed[..., 3:5]  # image (3), then click_disks (2), then prev_mask
  assert not changed[..., c:].any()  # the prediction was empty
  for b in range(2):
    assert disks[b, ..., 1].sum() == 0 and 50 < disks[b, ..., 0].sum() < 100  # one disk
    ys, xs = np.nonzero(disks[b, ..., 0])
    assert 10 <= ys.mean() < 30 and 10 <= xs.mean() < 30  # inside the missed object
