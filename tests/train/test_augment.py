"""The step's augmentation (`beam-train fit --augment`) on the session's records."""

import numpy as np
import pytest
import tensorflow as tf

from beam_prep import keys
from beam_prep.prep_output import PrepOutput
from beam_prep.record_decoder import Decoder
from train.fit import augment
from train.config import TrainConfig
from train.fit.data import Parser
from train.tasks import make_task


def test_augment_names_parse_and_unknown_ones_are_refused():
  assert augment.parse(augment.DEFAULT) == ("flip",)
  assert augment.parse("flip,colour") == ("flip", "colour")
  assert augment.parse("none") == () and augment.parse("") == ()
  assert augment.parse(" colour ") == ("colour",)
  with pytest.raises(ValueError, match=r"--augment: unknown color.*flip, colour"):
    augment.parse("flip,color")
  with pytest.raises(ValueError, match="--augment"):
    TrainConfig(data="d", model_dir="m", augment="rotate")


def test_jitter_stays_in_the_pixel_range_and_is_the_identity_when_never_drawn():
  pixels = tf.constant(np.random.default_rng(0).uniform(0, 255, (64, 8, 8, 3)), tf.float32)
  never = augment.ColourJitter(p=0.0)(pixels)
  np.testing.assert_array_equal(never.numpy(), pixels.numpy())
  always = augment.ColourJitter(p=1.0)(pixels, seed=3).numpy()
  assert always.min() >= 0 and always.max() <= 255
  changed = np.abs(always - pixels.numpy()).mean(axis=(1, 2, 3))
  assert (changed > 0.5).mean() > 0.9  # Each example gets its own draw.
  # Brightness and contrast are one per example, the shift one per channel:
  # away from the clip, a jittered channel is an affine map of the original.
  x, y = pixels.numpy()[0, ..., 0].ravel(), always[0, ..., 0].ravel()
  inside = (y > 0) & (y < 255)
  slope, offset = np.polyfit(x[inside], y[inside], 1)
  np.testing.assert_allclose(y[inside], slope * x[inside] + offset, atol=1e-3)
  assert 0.85 - 1e-6 <= slope <= 1.4 + 1e-6


def _stored_batch(prep_dir, task, n=4):
  """Every variant of the first `n` train records, as stored, and their decoder."""
  prep = PrepOutput(prep_dir)
  decoder = Decoder(prep.table, task.transform_keys)
  records = next(iter(prep.dataset(keys.TRAIN_SPLIT).batch(n)))
  return decoder, decoder.stored(records, training=False)


def test_colour_recovers_the_pixels_through_the_transform_and_jitters_only_the_image(prep_dir):
  prep = PrepOutput(prep_dir)
  task = make_task(prep.table, prep.tft_output)
  transform = prep.tft_output.transform_features_layer()
  colour = augment.Colour(prep.table, transform, task.transform_keys, seed=1)
  decoder, stored = _stored_batch(prep_dir, task)
  raw = decoder.raw(stored)
  t = transform({k: raw[k] for k in task.transform_keys})
  size = prep.table.image_size
  pixels = tf.io.decode_raw(raw[keys.IMAGE], tf.uint8).numpy().reshape(-1, *size, 3)
  np.testing.assert_allclose(
    (t[keys.IMAGE].numpy() - colour.offset) / colour.scale, pixels, atol=1e-3
  )
  jittered = colour(t)
  assert not np.allclose(jittered[keys.IMAGE].numpy(), t[keys.IMAGE].numpy())
  for k in t:
    if k != keys.IMAGE:
      np.testing.assert_array_equal(jittered[k].numpy(), t[k].numpy())
  back = (jittered[keys.IMAGE].numpy() - colour.offset) / colour.scale
  assert back.min() >= -1e-3 and back.max() <= 255 + 1e-3


def test_parser_augments_training_batches_only_and_as_asked(prep_dir):
  prep = PrepOutput(prep_dir)
  task = make_task(prep.table, prep.tft_output)
  _, stored = _stored_batch(prep_dir, task, n=8)
  plain = Parser(prep.tft_output, prep.table, task, augment=())
  jitter = Parser(prep.tft_output, prep.table, task, augment=("colour",))
  base_inputs, base_labels = plain(stored, training=True)
  eval_inputs, _ = jitter(stored, training=False)
  np.testing.assert_array_equal(eval_inputs.numpy(), base_inputs.numpy())
  inputs, labels = jitter(stored, training=True)
  image_channels = prep.table[keys.IMAGE].feature.channels
  assert not np.allclose(inputs[..., :image_channels], base_inputs[..., :image_channels])
  np.testing.assert_array_equal(inputs[..., image_channels:], base_inputs[..., image_channels:])
  np.testing.assert_array_equal(labels[keys.LABEL], base_labels[keys.LABEL])
