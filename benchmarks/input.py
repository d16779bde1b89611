"""Measures images/s of three input pipelines that yield the same model input.

input.on_the_fly_img_s     records without maps; distance maps built in a
                           tf.py_function per example (what the product replaces)
input.precomputed_img_s    our records through our reader (parse + transform)
input.read_ceiling_img_s   the same files read by TFRecordDataset alone
"""

from typing import Dict, List

from benchmarks.common import batches_rate, log


def _interleaved(files: List[str]):
  """The records of `files`, read in parallel as they come."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  return tf.data.Dataset.from_tensor_slices(files).interleave(
    tf.data.TFRecordDataset,
    cycle_length=len(files),
    num_parallel_calls=tf.data.AUTOTUNE,
    deterministic=False,
  )


def _ceiling(files: List[str], batch: int):
  """Batches of the serialized records alone: what reading the files costs."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  ds = _interleaved(files)
  return ds.repeat().batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def _on_the_fly(files: List[str], decoder, batch: int, size: int):
  """The records' image and clicks only; the maps are rebuilt per example by
  the numpy op in a tf.py_function. The output is the very batch our reader
  gives the training step (raw uint8 bytes of image, maps, mask)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from beam_prep import keys  # pylint: disable=g-import-not-at-top
  from beam_prep.ops.distance import distance_maps  # pylint: disable=g-import-not-at-top
  from train.export.saved_model import to_raw_bytes  # pylint: disable=g-import-not-at-top

  def with_maps(serialized):
    raw = decoder.decode(serialized[None])  # One variant of the record, picked.

    def np_maps(pos, neg):
      return distance_maps(pos.numpy().reshape(-1, 2), neg.numpy().reshape(-1, 2), size, size)

    maps = tf.py_function(
      np_maps,
      [
        tf.sparse.to_dense(raw[keys.POSITIVE_CLICKS])[0],
        tf.sparse.to_dense(raw[keys.NEGATIVE_CLICKS])[0],
      ],
      tf.uint8,
    )
    return {
      keys.IMAGE: raw[keys.IMAGE][0],
      keys.MASK: raw[keys.MASK][0],
      keys.DISTANCE_MAPS: to_raw_bytes(tf.reshape(maps, [size, size, 2])),
    }

  ds = _interleaved(files).repeat()
  ds = ds.map(with_maps, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
  return ds.batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def bench_input(prep_dir: str, batch: int, batches: int, repeats: int) -> Dict[str, float]:
  """Images/s of three input pipelines that yield the same model input."""
  from beam_prep import keys  # pylint: disable=g-import-not-at-top
  from train.fit.data import Decoder, InputReader  # pylint: disable=g-import-not-at-top
  from beam_prep.prep_output import PrepOutput  # pylint: disable=g-import-not-at-top
  from train.tasks import make_task  # pylint: disable=g-import-not-at-top

  prep = PrepOutput(prep_dir)
  table = prep.table
  files = prep.files(keys.TRAIN_SPLIT)
  reader = InputReader(prep, make_task(table, prep.tft_output), batch, shuffle_buffer=64)
  decoder = Decoder(table, [keys.IMAGE, keys.MASK, keys.POSITIVE_CLICKS, keys.NEGATIVE_CLICKS])
  size = table.image_size[0]
  pipelines = (
    ("read_ceiling", lambda: _ceiling(files, batch)),
    ("precomputed", lambda: reader.dataset(keys.TRAIN_SPLIT, training=True)),
    ("on_the_fly", lambda: _on_the_fly(files, decoder, batch, size)),
  )
  out = {}
  for name, make in pipelines:
    out[f"input.{name}_img_s"] = batches_rate(iter(make()), batch, batches, repeats)
    log(f"input {name}: {out[f'input.{name}_img_s']:.1f} img/s")
  return out
