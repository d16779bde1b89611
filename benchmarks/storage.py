"""Measures the record layouts: bytes, reader rate and write time per training example.

  storage.<layout>.bytes_per_example      file bytes per (object, variant)
  storage.<layout>.examples_s_per_core    the trainer's Decoder on one core
  storage.<layout>.write_ms_per_example   encoding and writing the records

for the layouts of STORAGE_ROWS, on the train records of a job at
STORAGE_VARIANTS variants (`bench_storage`).
"""

import os
import time
from typing import Any, Dict, List, Sequence

from benchmarks.common import batches_rate, log, run_pipeline
from beam_prep.record_codec import RecordCodec

# The record layouts are measured at 4 variants per object (at the settings' size).
STORAGE_VARIANTS = 4

# The record layouts, in the order of the printed table, and what each is.
STORAGE_ROWS = (
  ("variant", "before: a record per (object, variant), arrays raw"),
  ("object_raw", "a record per object, variants stacked, arrays raw"),
  ("object_mask_zlib", "the same, the mask zlib"),
  ("object", "the job's: the same, mask and click maps zlib"),
  ("object_gzip", "the job's in gzip files (--compression gzip)"),
)


def recoded(table, zlib_keys: Sequence[str]):
  """`table` with only the per-pixel features `zlib_keys` stored compressed."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  from beam_prep.features import Entry, FeatureTable  # pylint: disable=g-import-not-at-top

  entries = [
    Entry(
      e.key,
      dataclasses.replace(e.feature, encoding="zlib" if e.key in zlib_keys else "raw")
      if e.feature.per_pixel
      else e.feature,
      e.op,
      e.stacked,
    )
    for e in table
  ]
  return FeatureTable(
    entries, table.image_size, table.task, table.chain, table.ops_module, table.variants
  )


def rewrite(prep, path: str, table, per_example: bool, gzip: bool = False) -> float:
  """The job's train records rewritten in another layout: a record per unit
  in `table`'s encodings, or (`per_example`) a record per (object, variant),
  the layout before format 3. Returns the seconds spent encoding and writing
  (decoding the job's records excluded)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from beam_prep import keys  # pylint: disable=g-import-not-at-top

  spent = 0.0
  read, write = RecordCodec(prep.table), RecordCodec(table)
  with tf.io.TFRecordWriter(path, options="GZIP" if gzip else None) as writer:
    for serialized in prep.dataset(keys.TRAIN_SPLIT):
      examples = read.decode_examples(serialized.numpy())
      t = time.perf_counter()
      for record in (
        [write.encode(ex) for ex in examples] if per_example else [write.encode_unit(examples)]
      ):
        writer.write(record)
      spent += time.perf_counter() - t
    t = time.perf_counter()
  return spent + time.perf_counter() - t


def reader_rate(files: List[str], table, s: Dict[str, Any]) -> float:
  """Training examples/s of the trainer's Decoder (parse, pick one variant per
  record, decompress) over `files`, on one core: tf.data runs in a private
  pool of one thread, as the trainer's reader path (`InputReader.dataset`)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from beam_prep import keys  # pylint: disable=g-import-not-at-top
  from train.fit.data import Decoder  # pylint: disable=g-import-not-at-top

  decoder = Decoder(table, table.transform_keys)
  ds = tf.data.Dataset.from_tensor_slices(files).interleave(
    lambda f: tf.data.TFRecordDataset(f, compression_type=keys.compression_of(files[0])),
    cycle_length=max(len(files), 1),
    deterministic=False,
  )
  ds = ds.repeat().shuffle(64).batch(s["batch"], drop_remainder=True).map(decoder.decode)
  options = tf.data.Options()
  options.threading.private_threadpool_size = 1
  options.autotune.enabled = False
  return batches_rate(iter(ds.with_options(options)), s["batch"], s["batches"], s["repeats"])


def bench_storage(data: str, workdir: str, s: Dict[str, Any]) -> Dict[str, float]:
  """Bytes per (object, variant), reader examples/s per core and write time of
  record layouts, on the train records of a job at STORAGE_VARIANTS variants.

  `object`: the job's layout (a record per object, its variants stacked,
  masks and click maps zlib-compressed); `object_gzip`: the same in gzip
  files (--compression gzip); `object_raw`, `object_mask_zlib`: stacked with
  nothing, or only the mask, compressed; `variant`: the layout before format
  3 (a record per (object, variant), every array raw). Each is the job's
  records rewritten (`rewrite`; `object` byte-identical to the job's), and
  its write time is that of encoding and writing them. A training example is
  one (object, variant) in every layout.
  """
  from beam_prep import keys  # pylint: disable=g-import-not-at-top
  from beam_prep.prep_output import PrepOutput  # pylint: disable=g-import-not-at-top

  out_dir = os.path.join(workdir, "storage_object")
  run_pipeline(data, out_dir, s["size"], STORAGE_VARIANTS)
  prep = PrepOutput(out_dir)
  table = prep.table
  examples = prep.manifest["counts"]["examples_written"][keys.TRAIN_SPLIT]
  layouts = {  # name: (table, a record per example, gzip)
    "variant": (table.example_view, True, False),
    "object_raw": (recoded(table, ()), False, False),
    "object_mask_zlib": (recoded(table, (keys.MASK,)), False, False),
    "object": (table, False, False),
    "object_gzip": (table, False, True),
  }
  out = {"storage.variants": STORAGE_VARIANTS}
  for layout, (layout_table, per_example, gzip) in layouts.items():
    path = os.path.join(workdir, f"storage_{layout}.tfrecord" + (".gz" if gzip else ""))
    seconds = rewrite(prep, path, layout_table, per_example, gzip)
    if layout == "object":
      assert b"".join(_file_bytes(f) for f in prep.files(keys.TRAIN_SPLIT)) == _file_bytes(path)
    out[f"storage.{layout}.bytes_per_example"] = os.path.getsize(path) / max(examples, 1)
    out[f"storage.{layout}.examples_s_per_core"] = reader_rate([path], layout_table, s)
    out[f"storage.{layout}.write_ms_per_example"] = 1000.0 * seconds / max(examples, 1)
    log(
      f"storage {layout}: {out[f'storage.{layout}.bytes_per_example'] / 1e3:.0f} kB per "
      f"(object, variant), {out[f'storage.{layout}.examples_s_per_core']:.0f} examples/s "
      f"per core, {out[f'storage.{layout}.write_ms_per_example']:.2f} ms to write"
    )
  return out


def _file_bytes(path: str) -> bytes:
  with open(path, "rb") as f:
    return f.read()
