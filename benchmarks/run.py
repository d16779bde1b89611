"""Measures every claim of the product as ratios within one run.

    python -m benchmarks [--quick] [--json PATH] [--plot PATH] [--workdir DIR]

Figures (each the median of several timed repetitions after a warm-up):

  input.on_the_fly_img_s     records without maps; distance maps built in a
                             tf.py_function per example (what the product replaces)
  input.precomputed_img_s    our records through our reader (parse + transform)
  input.read_ceiling_img_s   the same files read by TFRecordDataset alone
  train.synthetic_steps_s    the training step on in-memory tensors
  train.real_steps_s         the same step fed by our reader
  train.input_wait_fraction  share of the real run's step time waiting for input
  prep.kernel_objects_s      the pipeline's ops in a plain Python loop, one core
  prep.beam_objects_s        the whole pipeline on the DirectRunner, as the CLI runs it
  clicks.ms_per_sample       one object, one variant, 512x512: sampling + both maps
  clicks.reference_ms_per_sample   a full distance transform after every click
  prep.peak_rss_mb.N / .16N  peak memory of the pipeline at two data-set sizes
  prep.beam_marginal_objects_s  objects/s between N and 16N (fixed cost removed)
  prep.two_workers_speedup   16N with 2 DirectRunner worker threads vs 1 worker
  storage.*                  bytes per (object, variant), reader examples/s per core and
                             write time of the record layouts (`bench_storage`)
  serve.latency_ms_p50/p95   one 512x512 image, 5+5 clicks, loaded SavedModel
  serve.rest_latency_ms_p50/p95  the same through `beam-train serve`'s TF Serving
                             REST endpoint (JSON both ways), and its ratio to the
                             SavedModel's p50 (serve.rest_vs_saved_model)
  serve.page_latency_ms_p50/p95  a click through the page's own endpoint
  noc.*_object_clicks_s      NoC at source resolution (512x512 images): objects x
                             clicks per second, nearest-click baseline and model;
                             noc.edt_share_of_baseline: the distance transforms' share
"""

import argparse
import glob
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Sequence

import numpy as np


def _median_rate(fn: Callable[[], int], repeats: int) -> float:
  """Median of items/s over `repeats` timed calls; `fn` returns items done."""
  rates = []
  for _ in range(repeats):
    t = time.perf_counter()
    n = fn()
    rates.append(n / (time.perf_counter() - t))
  return statistics.median(rates)


def _log(msg: str) -> None:
  print(f"bench: {msg}", flush=True)


# --------------------------------------------------------------------------- data

def make_data(workdir: str, count: int, size: int, seed: int = 0) -> str:
  from beam_prep.sample_data import write_sample_data  # pylint: disable=g-import-not-at-top
  path = os.path.join(workdir, f"data_{count}_{size}")
  if not os.path.isdir(path):
    write_sample_data(path, count=count, seed=seed, size=(size, size))
  return path


def run_pipeline(data: str, out: str, size: int, variants: int, beam_args: Sequence[str] = (),
                 **fields) -> Dict[str, Any]:
  """The segmentation pipeline exactly as `beam-prep segmentation` runs it."""
  from apache_beam.options.pipeline_options import PipelineOptions  # pylint: disable=g-import-not-at-top
  from beam_prep.config import PrepConfig  # pylint: disable=g-import-not-at-top
  from pipelines import cli, prep  # pylint: disable=g-import-not-at-top
  config = PrepConfig(input=data, output=out, image_size=size, variants=variants,
                      overwrite=True, **fields)
  return prep.run(config, PipelineOptions(cli.pipeline_args(list(beam_args), data)))


# ------------------------------------------------------------------------- figures

def bench_clicks(repeats: int) -> Dict[str, float]:
  """Sampling + both maps for one (object, variant) at 512x512, vs the reference."""
  from scipy import ndimage  # pylint: disable=g-import-not-at-top
  from beam_prep import keys  # pylint: disable=g-import-not-at-top
  from beam_prep.ops.clicks import sample_clicks  # pylint: disable=g-import-not-at-top
  from beam_prep.ops.distance import distance_maps  # pylint: disable=g-import-not-at-top
  from beam_prep.sample_data import make_scene  # pylint: disable=g-import-not-at-top
  objects = []
  for i in range(4):
    _, inst = make_scene(7, i, (512, 512))
    for oid in sorted(set(np.unique(inst).tolist()) - {0, 255}):
      mask = np.where(inst == oid, 1, np.where(inst == keys.IGNORE, keys.IGNORE, 0))
      objects.append({"image_id": f"s{i}", "object_id": oid, "mask": mask.astype(np.uint8),
                      "instance_mask": inst})
  op = sample_clicks(variants=1)

  def ours():
    for ex in objects:
      try:
        s = op(ex)[0]
      except Exception:  # pylint: disable=broad-except
        continue  # objects too small for clicks cost the same in both
      distance_maps(s["positive_clicks"], s["negative_clicks"], 512, 512)
    return len(objects)

  samples = []
  for ex in objects:
    try:
      samples.append(op(ex)[0])
    except Exception:  # pylint: disable=broad-except
      pass

  def reference():
    # Public reimplementations: after every click, a full exact distance
    # transform of the click image, for each of the two maps.
    for s in samples:
      for kind in ("positive_clicks", "negative_clicks"):
        grid = np.ones((512, 512), bool)
        for x, y in s[kind]:
          grid[y, x] = False
          ndimage.distance_transform_edt(grid)
    return len(samples)

  ours()  # warm-up
  ms = 1000.0 / _median_rate(ours, repeats)
  ref = 1000.0 / _median_rate(reference, max(1, repeats // 2))
  return {"clicks.ms_per_sample": ms, "clicks.reference_ms_per_sample": ref,
          "clicks.objects": len(objects)}


def bench_kernel_loop(data: str, size: int, variants: int) -> float:
  """Objects/s of the job's kernel (read, decode, clicks, maps, encode) in a plain loop
  over the folders layout's pointers (the same kernel the job's shard writers run)."""
  from beam_prep.config import PrepConfig  # pylint: disable=g-import-not-at-top
  from beam_prep.kernel import Kernel  # pylint: disable=g-import-not-at-top
  from beam_prep.readers import resolve_layout  # pylint: disable=g-import-not-at-top
  layout = resolve_layout(data, "auto", "instances")  # The sample data's image folders.
  config = PrepConfig(input=data, output="unused", image_size=size, variants=variants,
                      layout=layout.name)
  kernel = Kernel(config.layout, config.stages, config.ops_module, config.features())
  kernel.setup()
  from beam_prep.shards.plan import pointer_split  # pylint: disable=g-import-not-at-top
  pointers = [layout.pointer(data, p) for p in sorted(glob.glob(layout.pattern(data)))]
  t = time.perf_counter()
  objects = 0
  for pointer in pointers:  # Each in its split, as the job: eval images also keep a source record.
    result = kernel.process(pointer, pointer_split(pointer, config.eval_percent))
    objects += result.tally.counts.get("objects_found", 0)
  return objects / (time.perf_counter() - t)


def bench_input(prep_dir: str, batch: int, batches: int, repeats: int) -> Dict[str, float]:
  """Images/s of three input pipelines that yield the same model input."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from beam_prep import keys  # pylint: disable=g-import-not-at-top
  from beam_prep.ops.distance import distance_maps  # pylint: disable=g-import-not-at-top
  from train.data import Decoder, InputReader  # pylint: disable=g-import-not-at-top
  from train.export import to_raw_bytes  # pylint: disable=g-import-not-at-top
  from train.prep_output import PrepOutput  # pylint: disable=g-import-not-at-top
  from train.tasks import make_task  # pylint: disable=g-import-not-at-top

  prep = PrepOutput(prep_dir)
  table = prep.table
  files = prep.files(keys.TRAIN_SPLIT)
  reader = InputReader(prep, make_task(table, prep.tft_output), batch, shuffle_buffer=64)
  decoder = Decoder(table, [keys.IMAGE, keys.MASK, keys.POSITIVE_CLICKS, keys.NEGATIVE_CLICKS])
  size = table.image_size[0]

  def precomputed():
    return reader.dataset(keys.TRAIN_SPLIT, training=True)

  def ceiling():
    ds = tf.data.Dataset.from_tensor_slices(files).interleave(
        tf.data.TFRecordDataset, cycle_length=len(files), num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=False)
    return ds.repeat().batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)

  def on_the_fly():
    # The records' image and clicks only; the maps are rebuilt per example by
    # the numpy op in a tf.py_function. The output is the very batch our
    # reader gives the training step (raw uint8 bytes of image, maps, mask).
    def with_maps(serialized):
      raw = decoder.decode(serialized[None])  # One variant of the record, picked.

      def np_maps(pos, neg):
        return distance_maps(pos.numpy().reshape(-1, 2), neg.numpy().reshape(-1, 2),
                             size, size)

      maps = tf.py_function(np_maps, [tf.sparse.to_dense(raw[keys.POSITIVE_CLICKS])[0],
                                      tf.sparse.to_dense(raw[keys.NEGATIVE_CLICKS])[0]],
                            tf.uint8)
      return {keys.IMAGE: raw[keys.IMAGE][0], keys.MASK: raw[keys.MASK][0],
              keys.DISTANCE_MAPS: to_raw_bytes(tf.reshape(maps, [size, size, 2]))}

    ds = tf.data.Dataset.from_tensor_slices(files).interleave(
        tf.data.TFRecordDataset, cycle_length=len(files), num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=False).repeat()
    ds = ds.map(with_maps, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    return ds.batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)

  out = {}
  for name, make in (("read_ceiling", ceiling), ("precomputed", precomputed),
                     ("on_the_fly", on_the_fly)):
    it = iter(make())
    for _ in range(3):  # warm-up: fill buffers, trace functions
      next(it)

    def take(it=it):
      for _ in range(batches):
        next(it)
      return batches * batch

    out[f"input.{name}_img_s"] = _median_rate(take, repeats)
    _log(f"input {name}: {out[f'input.{name}_img_s']:.1f} img/s")
  return out


def recoded(table, zlib_keys: Sequence[str]):
  """`table` with only the per-pixel features `zlib_keys` stored compressed."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  from beam_prep.features import Entry, FeatureTable  # pylint: disable=g-import-not-at-top
  entries = [Entry(e.key, dataclasses.replace(
      e.feature, encoding="zlib" if e.key in zlib_keys else "raw") if e.feature.per_pixel
                   else e.feature, e.op, e.stacked) for e in table]
  return FeatureTable(entries, table.image_size, table.task, table.chain, table.ops_module,
                      table.variants)


def rewrite(prep, path: str, table, per_example: bool, gzip: bool = False) -> float:
  """The job's train records rewritten in another layout: a record per unit
  in `table`'s encodings, or (`per_example`) a record per (object, variant),
  the layout before format 3. Returns the seconds spent encoding and writing
  (decoding the job's records excluded)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from beam_prep import keys  # pylint: disable=g-import-not-at-top
  spent = 0.0
  with tf.io.TFRecordWriter(path, options="GZIP" if gzip else None) as writer:
    for serialized in prep.dataset(keys.TRAIN_SPLIT):
      examples = prep.table.decode_examples(serialized.numpy())
      t = time.perf_counter()
      for record in ([table.encode(ex) for ex in examples] if per_example
                     else [table.encode_unit(examples)]):
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
  from train.data import Decoder  # pylint: disable=g-import-not-at-top
  decoder = Decoder(table, table.keys("model_input") + table.keys("label"))
  ds = tf.data.Dataset.from_tensor_slices(files).interleave(
      lambda f: tf.data.TFRecordDataset(f, compression_type=keys.compression_of(files[0])),
      cycle_length=max(len(files), 1), deterministic=False)
  ds = ds.repeat().shuffle(64).batch(s["batch"], drop_remainder=True).map(decoder.decode)
  options = tf.data.Options()
  options.threading.private_threadpool_size = 1
  options.autotune.enabled = False
  it = iter(ds.with_options(options))
  for _ in range(3):
    next(it)

  def take():
    for _ in range(s["batches"]):
      next(it)
    return s["batches"] * s["batch"]

  return _median_rate(take, s["repeats"])


# The record layouts are measured at 4 variants per object (at the settings' size).
STORAGE_VARIANTS = 4


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
  from train.prep_output import PrepOutput  # pylint: disable=g-import-not-at-top
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
    _log(f"storage {layout}: {out[f'storage.{layout}.bytes_per_example'] / 1e3:.0f} kB per "
         f"(object, variant), {out[f'storage.{layout}.examples_s_per_core']:.0f} examples/s "
         f"per core, {out[f'storage.{layout}.write_ms_per_example']:.2f} ms to write")
  return out


def _file_bytes(path: str) -> bytes:
  with open(path, "rb") as f:
    return f.read()


def bench_train(prep_dir: str, batch: int, steps: int, repeats: int, width: int, depth: int
                ) -> Dict[str, float]:
  """The training step on in-memory tensors vs fed by the reader."""
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from beam_prep import keys  # pylint: disable=g-import-not-at-top
  from train import models  # pylint: disable=g-import-not-at-top
  from train.data import InputReader  # pylint: disable=g-import-not-at-top
  from train.prep_output import PrepOutput  # pylint: disable=g-import-not-at-top
  from train.tasks import make_task  # pylint: disable=g-import-not-at-top

  prep = PrepOutput(prep_dir)
  table = prep.table
  task = make_task(table, prep.tft_output)
  reader = InputReader(prep, task, batch)
  model = models.build_model("segmentation_fcn", table.input_channels,
                             builtin={"width": width, "depth": depth})
  opt = keras.optimizers.Adam(1e-3)
  opt.build(model.trainable_variables)

  @tf.function
  def step(raw):
    inputs, labels = reader.parser(raw, training=True)  # on the device, as the trainer does
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(task.loss(labels, model(inputs, training=True)))
    opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                            model.trainable_variables))
    return loss

  real = iter(reader.dataset(keys.TRAIN_SPLIT, training=True))
  first = next(real)
  synthetic = iter(tf.data.Dataset.from_tensors(first).repeat())
  for it in (synthetic, real):
    for _ in range(2):
      float(step(next(it)))
  waits = []

  def run(it, record_wait):
    def go():
      wait = busy = 0.0
      for _ in range(steps):
        t0 = time.perf_counter()
        b = next(it)
        t1 = time.perf_counter()
        float(step(b))
        t2 = time.perf_counter()
        wait += t1 - t0
        busy += t2 - t0
      if record_wait:
        waits.append(wait / busy)
      return steps
    return go

  out = {"train.synthetic_steps_s": _median_rate(run(synthetic, False), repeats),
         "train.real_steps_s": _median_rate(run(real, True), repeats)}
  out["train.input_wait_fraction"] = statistics.median(waits)
  _log(f"train: synthetic {out['train.synthetic_steps_s']:.2f} steps/s, real "
       f"{out['train.real_steps_s']:.2f} steps/s")
  return out


def bench_serving(model_dir: str, repeats: int) -> Dict[str, float]:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from train.export import latest_export  # pylint: disable=g-import-not-at-top
  fn = tf.saved_model.load(latest_export(model_dir)).signatures["serving_default"]
  rng = np.random.default_rng(0)
  image = tf.constant(rng.integers(0, 256, (512, 512, 3), dtype=np.uint8))
  pos = tf.constant(rng.integers(0, 512, (5, 2)), tf.int32)
  neg = tf.constant(rng.integers(0, 512, (5, 2)), tf.int32)
  for _ in range(3):
    fn(image=image, positive_clicks=pos, negative_clicks=neg)
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    fn(image=image, positive_clicks=pos, negative_clicks=neg)["mask"].numpy()
    times.append(1000 * (time.perf_counter() - t))
  return {"serve.latency_ms_p50": float(np.percentile(times, 50)),
          "serve.latency_ms_p95": float(np.percentile(times, 95))}


def bench_noc_source(workdir: str, model_dir: str, s: Dict[str, Any]) -> Dict[str, float]:
  """NoC at source resolution (`beam-train evaluate --data`): objects x clicks
  per second for the nearest-click baseline and the model, as a command runs
  it (the loop's one trace included), and the share of
  the baseline's time its distance transforms take (2 per click per object,
  timed alone on masks of the same size)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from train import clicker, source_eval  # pylint: disable=g-import-not-at-top
  from train.prep_output import PrepOutput  # pylint: disable=g-import-not-at-top
  data = make_data(workdir, s["noc_images"], s["noc_size"], seed=2)
  prep = os.path.join(workdir, "noc_prep")
  run_pipeline(data, prep, s["size"], 1, eval_percent=100, max_error_fraction=1.0)
  out, k = {}, s["noc_clicks"]
  for name, predictor in (("baseline", clicker.baseline_logits),
                          ("model", source_eval.ServedPredictor(model_dir))):
    source_eval.run(PrepOutput(prep), {name: predictor}, k, (0.85, 0.9), clicker.PRED_THR,
                    max_objects=1)  # Warm-up: first calls; the timed run traces its loop once.
    t = time.perf_counter()
    rows, _ = source_eval.run(PrepOutput(prep), {name: predictor}, k, (0.85, 0.9),
                              clicker.PRED_THR)
    seconds = time.perf_counter() - t
    out[f"noc.{name}_object_clicks_s"] = len(rows) * k / seconds
    out[f"noc.{name}_seconds"] = seconds
  side = s["noc_size"]
  mask = tf.constant(np.random.default_rng(0).random((1, side, side)) < 0.9)
  clicker.edt_squared(mask)
  t = time.perf_counter()
  for _ in range(4):
    clicker.edt_squared(mask).numpy()
  edt = (time.perf_counter() - t) / 4
  out["noc.objects"] = len(rows)
  out["noc.edt_share_of_baseline"] = 2 * len(rows) * k * edt / out["noc.baseline_seconds"]
  return out


def _timed(fn: Callable[[], Any], repeats: int) -> List[float]:
  """Milliseconds of each of `repeats` calls after 3 warm-up calls."""
  for _ in range(3):
    fn()
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    fn()
    times.append(1000 * (time.perf_counter() - t))
  return times


def bench_rest(model_dir: str, repeats: int, saved_model_p50: float) -> Dict[str, float]:
  """Click to mask through `beam-train serve` on a local port, the same
  512x512 image and 5+5 clicks as `bench_serving`: TF Serving's JSON predict
  (request text made once; the answer read into numpy arrays, as a client
  must) and the page's endpoint (image sent once, then clicks; mask as PNG)."""
  import threading  # pylint: disable=g-import-not-at-top
  import urllib.request  # pylint: disable=g-import-not-at-top
  import orjson  # pylint: disable=g-import-not-at-top
  from train.serve import app  # pylint: disable=g-import-not-at-top
  from train.serve.config import ServeConfig  # pylint: disable=g-import-not-at-top
  server, model = app.start(ServeConfig(model=model_dir, model_name="bench", port=0))
  threading.Thread(target=server.serve_forever, daemon=True).start()
  url = f"http://127.0.0.1:{server.port}"
  rng = np.random.default_rng(0)
  image = rng.integers(0, 256, (512, 512, 3), dtype=np.uint8)
  pos, neg = rng.integers(0, 512, (5, 2)).tolist(), rng.integers(0, 512, (5, 2)).tolist()

  def post(path, body):
    req = urllib.request.Request(url + path, data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
      return orjson.loads(r.read())

  body = orjson.dumps({"inputs": {"image": image, "positive_clicks": pos, "negative_clicks": neg}},
                      option=orjson.OPT_SERIALIZE_NUMPY)
  rest = lambda: {k: np.asarray(v) for k, v in  # pylint: disable=unnecessary-lambda-assignment
                  post(f"/v1/models/{model.name}:predict", body)["outputs"].items()}
  try:
    rest_times = _timed(rest, repeats)
    form = urllib.request.Request(url + "/page/upload", data=_multipart(image), headers={
        "Content-Type": "multipart/form-data; boundary=bench"})
    with urllib.request.urlopen(form) as r:
      key = orjson.loads(r.read())["id"]
    # Two click sets in turn: the page keeps the last mask, and a repeated
    # request would not run the model.
    clicks = [orjson.dumps({"id": key, "positive": [[x + i, y] for x, y in pos],
                            "negative": neg}) for i in (0, 1)]
    turn = iter(range(10**9))
    page_times = _timed(lambda: post("/page/segment", clicks[next(turn) % 2]), repeats)
  finally:
    server.shutdown()
  p50 = float(np.percentile(rest_times, 50))
  return {"serve.rest_latency_ms_p50": p50,
          "serve.rest_latency_ms_p95": float(np.percentile(rest_times, 95)),
          "serve.rest_vs_saved_model": p50 / saved_model_p50,
          "serve.rest_request_mb": len(body) / 1e6,
          "serve.page_latency_ms_p50": float(np.percentile(page_times, 50)),
          "serve.page_latency_ms_p95": float(np.percentile(page_times, 95))}


def _multipart(image: np.ndarray) -> bytes:
  import io  # pylint: disable=g-import-not-at-top
  from PIL import Image  # pylint: disable=g-import-not-at-top
  buf = io.BytesIO()
  Image.fromarray(image).save(buf, format="PNG")
  return (b"--bench\r\nContent-Disposition: form-data; name=\"file\"; filename=\"b.png\"\r\n"
          b"Content-Type: image/png\r\n\r\n" + buf.getvalue() + b"\r\n--bench--\r\n")


def pipeline_in_fresh_process(data: str, out: str, size: int, variants: int = 1,
                              beam_args: Sequence[str] = ()) -> Dict[str, float]:
  """One pipeline run in a fresh process: peak RSS (MB), wall seconds, objects."""
  code = ("import json, resource, sys\n"
          "from pipelines import logs\nlogs.quiet()\n"
          "from benchmarks.run import run_pipeline\n"
          f"m = run_pipeline({data!r}, {out!r}, {size}, {variants}, beam_args={list(beam_args)!r})\n"
          # The pipeline runs in this process (in_memory DirectRunner).
          # VmHWM, not ru_maxrss: Linux carries ru_maxrss across fork+exec,
          # so a child would report its (large) parent's peak.
          "rss = next(int(l.split()[1]) for l in open('/proc/self/status')\n"
          "           if l.startswith('VmHWM:'))\n"
          "print('RESULT', json.dumps({'rss_mb': rss / 1024.0,\n"
          "      'seconds': m['timing']['wall_seconds'],\n"
          "      'records_mb': sum(v['bytes'] for k, v in m['shards'].items()\n"
          "                        if k in ('train', 'eval')) / 1e6,\n"
          "      'objects': m['counts']['objects_found']}))\n")
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1800,
                     cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  for line in r.stdout.splitlines():
    if line.startswith("RESULT"):
      return json.loads(line.split(" ", 1)[1])
  raise RuntimeError(f"pipeline run failed:\n{r.stdout}\n{r.stderr}")


PAIRS = 3  # Paired measurements of the Beam job's marginal rate against the kernel loop.


def bench_marginal(workdir: str, small: str, large: str, s: Dict[str, Any]) -> Dict[str, Any]:
  """The Beam job's marginal objects/s (the slope between N and 16N images, one
  worker, fresh processes) against the plain kernel loop over the 16N images,
  as PAIRS paired measurements: the figures are the medians, the ratio the
  median of the pairs' ratios (the loop alone moves a lot between runs)."""
  one_worker = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]
  pairs = []
  for i in range(PAIRS):
    run_n = pipeline_in_fresh_process(small, os.path.join(workdir, f"rss_n_{i}"), s["size"],
                                      s["variants"], one_worker)
    run_16n = pipeline_in_fresh_process(large, os.path.join(workdir, f"rss_16n_{i}"),
                                        s["size"], s["variants"], one_worker)
    extra = run_16n["seconds"] - run_n["seconds"]
    marginal = (run_16n["objects"] - run_n["objects"]) / extra if extra > 0 else float("nan")
    kernel = bench_kernel_loop(large, s["size"], s["variants"])
    pairs.append({"n": run_n, "16n": run_16n, "marginal": marginal, "kernel": kernel,
                  "ratio": marginal / kernel})
    _log(f"pair {i + 1}: Beam marginal {marginal:.1f} objects/s, kernel loop {kernel:.1f} "
         f"objects/s ({marginal / kernel:.2f})")
  def median(values):  # Of the defined ones (a slope within noise is NaN).
    values = [v for v in values if math.isfinite(v)]
    return statistics.median(values) if values else float("nan")

  first = pairs[0]
  marginal = median(p["marginal"] for p in pairs)
  return {
      "prep.beam_marginal_objects_s": marginal,
      "prep.kernel_objects_s.16N": median(p["kernel"] for p in pairs),
      "prep.beam_marginal_vs_kernel_pairs": [p["ratio"] for p in pairs],
      "prep.beam_marginal_vs_kernel_median": median(p["ratio"] for p in pairs),
      "prep.beam_fixed_seconds": median(
          p["n"]["seconds"] - p["n"]["objects"] / p["marginal"] for p in pairs),
      "prep.seconds_16n_1_worker": median(p["16n"]["seconds"] for p in pairs),
      "prep.peak_rss_mb.N": first["n"]["rss_mb"], "prep.peak_rss_mb.16N": first["16n"]["rss_mb"],
      "prep.rss_images.N": s["rss_n"], "prep.records_mb.16N": first["16n"]["records_mb"],
  }


# --------------------------------------------------------------------------- main

SETTINGS = {
    "quick": {"count": 24, "size": 256, "variants": 2, "batch": 8, "batches": 12, "repeats": 3,
              "train_steps": 5, "width": 8, "depth": 3, "rss_n": 12, "fit_steps": 20,
              "serve_repeats": 20, "click_repeats": 3, "noc_images": 4, "noc_size": 512,
              "noc_clicks": 20},
    "full": {"count": 64, "size": 256, "variants": 4, "batch": 16, "batches": 25, "repeats": 5,
             "train_steps": 10, "width": 16, "depth": 3, "rss_n": 16, "fit_steps": 100,
             "serve_repeats": 50, "click_repeats": 5, "noc_images": 8, "noc_size": 512,
             "noc_clicks": 20},
    # Tiny: what the smoke test runs to keep this code working.
    "tiny": {"count": 4, "size": 64, "variants": 2, "batch": 2, "batches": 2, "repeats": 1,
             "train_steps": 2, "width": 4, "depth": 2, "rss_n": 2, "fit_steps": 4,
             "serve_repeats": 2, "click_repeats": 1, "noc_images": 1, "noc_size": 96,
             "noc_clicks": 3},
}

TARGETS = {
    "input.precomputed_vs_on_the_fly": (">=", 20.0),
    "input.precomputed_vs_read_ceiling": (">=", 0.85),
    "train.real_vs_synthetic": (">=", 0.95),
    "prep.beam_vs_kernel": (">=", 0.75),
    "prep.beam_marginal_vs_kernel": (">=", 0.75),
    "clicks.ms_per_sample": ("<=", 20.0),
    "clicks.speedup_vs_reference": (">=", 15.0),
    "prep.peak_rss_16n_vs_n": ("<=", 1.1),
    "storage.object_vs_variant_bytes": ("<=", 0.4),
    "storage.object_vs_variant_reader": (">=", 1.0),
}


def environment() -> Dict[str, Any]:
  from pipelines.outputs import library_versions  # pylint: disable=g-import-not-at-top
  return {"cores": os.cpu_count(), "machine": platform.machine(),
          "platform": platform.platform(), "versions": library_versions()}


def measure(mode: str, workdir: str) -> Dict[str, Any]:
  s = SETTINGS[mode]
  figures: Dict[str, Any] = {}
  t0 = time.time()
  _log(f"{mode} settings: {s}")
  figures.update(bench_clicks(s["click_repeats"]))
  _log(f"clicks: {figures['clicks.ms_per_sample']:.1f} ms/sample, reference "
       f"{figures['clicks.reference_ms_per_sample']:.1f} ms")

  data = make_data(workdir, s["count"], s["size"])
  prep_dir = os.path.join(workdir, "prep")
  kernel = bench_kernel_loop(data, s["size"], s["variants"])
  manifest = run_pipeline(data, prep_dir, s["size"], s["variants"])
  objects = manifest["counts"]["objects_found"]
  beam = objects / manifest["timing"]["wall_seconds"]
  figures.update({"prep.kernel_objects_s": kernel, "prep.beam_objects_s": beam,
                  "prep.objects": objects, "prep.runner": "DirectRunner in_memory, 1 worker"})
  _log(f"prep: kernel loop {kernel:.1f} objects/s, Beam {beam:.1f} objects/s")

  figures.update(bench_input(prep_dir, s["batch"], s["batches"], s["repeats"]))
  figures.update(bench_train(prep_dir, s["batch"], s["train_steps"], s["repeats"], s["width"],
                             s["depth"]))

  small = make_data(workdir, s["rss_n"], s["size"], seed=1)
  large = make_data(workdir, 16 * s["rss_n"], s["size"], seed=1)
  figures.update(bench_marginal(workdir, small, large, s))
  run_16n_2w = pipeline_in_fresh_process(
      large, os.path.join(workdir, "rss_16n_2w"), s["size"], s["variants"],
      ["--direct_running_mode=multi_threading", "--direct_num_workers=2"])
  figures["prep.seconds_16n_2_workers"] = run_16n_2w["seconds"]
  figures["prep.two_workers_speedup"] = (figures["prep.seconds_16n_1_worker"]
                                         / run_16n_2w["seconds"])
  figures["prep.peak_rss_mb.16N_2_workers"] = run_16n_2w["rss_mb"]
  _log(f"memory: {figures['prep.peak_rss_mb.N']:.0f} MB at N={s['rss_n']}, "
       f"{figures['prep.peak_rss_mb.16N']:.0f} MB at 16N ({figures['prep.records_mb.16N']:.0f} "
       f"MB of records); 2 workers {figures['prep.two_workers_speedup']:.2f}x faster at 16N")
  figures.update(bench_storage(data, workdir, s))

  from train.config import TrainConfig  # pylint: disable=g-import-not-at-top
  from train import loop  # pylint: disable=g-import-not-at-top
  model_dir = os.path.join(workdir, "model")
  shutil.rmtree(model_dir, ignore_errors=True)
  loop.fit(TrainConfig(data=prep_dir, model_dir=model_dir, steps=s["fit_steps"],
                       batch_size=s["batch"], width=s["width"], depth=s["depth"],
                       histogram_every=0, log_every=max(s["fit_steps"], 1)))
  figures.update(bench_serving(model_dir, s["serve_repeats"]))
  _log(f"serving: p50 {figures['serve.latency_ms_p50']:.1f} ms, "
       f"p95 {figures['serve.latency_ms_p95']:.1f} ms")
  figures.update(bench_rest(model_dir, s["serve_repeats"], figures["serve.latency_ms_p50"]))
  _log(f"serving over REST: p50 {figures['serve.rest_latency_ms_p50']:.1f} ms "
       f"({figures['serve.rest_vs_saved_model']:.2f}x the SavedModel's); the page's endpoint "
       f"p50 {figures['serve.page_latency_ms_p50']:.1f} ms")
  figures.update(bench_noc_source(workdir, model_dir, s))
  _log(f"NoC at source resolution ({s['noc_size']} px): baseline "
       f"{figures['noc.baseline_object_clicks_s']:.1f} object-clicks/s (distance transforms "
       f"{100 * figures['noc.edt_share_of_baseline']:.0f}% of it), model "
       f"{figures['noc.model_object_clicks_s']:.1f} object-clicks/s")

  ratios = {
      "input.precomputed_vs_on_the_fly":
          figures["input.precomputed_img_s"] / figures["input.on_the_fly_img_s"],
      "input.precomputed_vs_read_ceiling":
          figures["input.precomputed_img_s"] / figures["input.read_ceiling_img_s"],
      "train.real_vs_synthetic": figures["train.real_steps_s"] / figures["train.synthetic_steps_s"],
      "prep.beam_vs_kernel": figures["prep.beam_objects_s"] / figures["prep.kernel_objects_s"],
      "prep.beam_marginal_vs_kernel": figures["prep.beam_marginal_vs_kernel_median"],
      "storage.object_vs_variant_bytes": (figures["storage.object.bytes_per_example"]
                                          / figures["storage.variant.bytes_per_example"]),
      "storage.object_vs_variant_reader": (figures["storage.object.examples_s_per_core"]
                                           / figures["storage.variant.examples_s_per_core"]),
      "clicks.ms_per_sample": figures["clicks.ms_per_sample"],
      "clicks.speedup_vs_reference":
          figures["clicks.reference_ms_per_sample"] / figures["clicks.ms_per_sample"],
      "prep.peak_rss_16n_vs_n": figures["prep.peak_rss_mb.16N"] / figures["prep.peak_rss_mb.N"],
  }
  targets = {}
  for k, (op, want) in TARGETS.items():
    got = ratios[k]
    targets[k] = {"value": got, "target": f"{op} {want}",
                  "met": bool(got >= want if op == ">=" else got <= want)}
  return {"mode": mode, "settings": s, "environment": environment(), "figures": figures,
          "targets": targets, "seconds": time.time() - t0}


STORAGE_ROWS = (
    ("variant", "before: a record per (object, variant), arrays raw"),
    ("object_raw", "a record per object, variants stacked, arrays raw"),
    ("object_mask_zlib", "the same, the mask zlib"),
    ("object", "the job's: the same, mask and click maps zlib"),
    ("object_gzip", "the job's in gzip files (--compression gzip)"),
)


def table(result: Dict[str, Any]) -> str:
  f, s = result["figures"], result["settings"]
  size = s["size"]
  rows = [
      ("input.on_the_fly_img_s", f"{f['input.on_the_fly_img_s']:.1f}",
       f"{size}px records, batch {s['batch']}, maps in tf.py_function"),
      ("input.precomputed_img_s", f"{f['input.precomputed_img_s']:.1f}", "our reader"),
      ("input.read_ceiling_img_s", f"{f['input.read_ceiling_img_s']:.1f}",
       "TFRecordDataset only"),
      ("train.synthetic_steps_s", f"{f['train.synthetic_steps_s']:.2f}",
       f"segmentation_fcn width {s['width']} depth {s['depth']}, batch {s['batch']}"),
      ("train.real_steps_s", f"{f['train.real_steps_s']:.2f}", "fed by our reader"),
      ("train.input_wait_fraction", f"{f['train.input_wait_fraction']:.3f}", ""),
      ("prep.kernel_objects_s", f"{f['prep.kernel_objects_s']:.1f}",
       f"{s['count']} images, {size}px, {s['variants']} variants, one core"),
      ("prep.beam_objects_s", f"{f['prep.beam_objects_s']:.1f}", f["prep.runner"]),
      ("prep.kernel_objects_s.16N", f"{f['prep.kernel_objects_s.16N']:.1f}",
       f"the plain loop over the {16 * f['prep.rss_images.N']} images of the slope"),
      ("prep.beam_marginal_objects_s", f"{f['prep.beam_marginal_objects_s']:.1f}",
       f"slope between N and 16N images, median of {PAIRS}; fixed cost "
       f"{f['prep.beam_fixed_seconds']:.1f} s; pairs' ratios to the loop "
       + ", ".join(f"{r:.2f}" for r in f["prep.beam_marginal_vs_kernel_pairs"])),
      ("prep.two_workers_speedup", f"{f['prep.two_workers_speedup']:.2f}",
       f"16N images: {f['prep.seconds_16n_1_worker']:.1f} s with 1 worker, "
       f"{f['prep.seconds_16n_2_workers']:.1f} s with 2 worker threads"),
      ("clicks.ms_per_sample", f"{f['clicks.ms_per_sample']:.1f}", "512x512, one variant"),
      ("clicks.reference_ms_per_sample", f"{f['clicks.reference_ms_per_sample']:.1f}",
       "EDT after every click"),
      ("prep.peak_rss_mb.N", f"{f['prep.peak_rss_mb.N']:.0f}", f"N = {f['prep.rss_images.N']}"),
      ("prep.peak_rss_mb.16N", f"{f['prep.peak_rss_mb.16N']:.0f}",
       f"16N = {16 * f['prep.rss_images.N']} images, {f['prep.records_mb.16N']:.0f} MB of records"),
      ("serve.latency_ms_p50", f"{f['serve.latency_ms_p50']:.1f}", "512x512, 5+5 clicks"),
      ("serve.latency_ms_p95", f"{f['serve.latency_ms_p95']:.1f}", ""),
      ("serve.rest_latency_ms_p50", f"{f['serve.rest_latency_ms_p50']:.1f}",
       f"the same through beam-train serve, TF Serving JSON "
       f"({f['serve.rest_request_mb']:.1f} MB request), answer read into numpy"),
      ("serve.rest_latency_ms_p95", f"{f['serve.rest_latency_ms_p95']:.1f}", ""),
      ("serve.rest_vs_saved_model", f"{f['serve.rest_vs_saved_model']:.2f}",
       "REST p50 / SavedModel p50"),
      ("serve.page_latency_ms_p50", f"{f['serve.page_latency_ms_p50']:.1f}",
       "the page's endpoint: image sent once, then clicks; mask and overlay as PNG"),
      ("serve.page_latency_ms_p95", f"{f['serve.page_latency_ms_p95']:.1f}", ""),
      ("noc.baseline_object_clicks_s", f"{f['noc.baseline_object_clicks_s']:.1f}",
       f"NoC at source resolution, {f['noc.objects']} objects of {s['noc_size']}x"
       f"{s['noc_size']} images, {s['noc_clicks']} clicks; distance transforms "
       f"{100 * f['noc.edt_share_of_baseline']:.0f}% of the time"),
      ("noc.model_object_clicks_s", f"{f['noc.model_object_clicks_s']:.1f}",
       "the same through the model's serving graph"),
  ]
  for layout, what in STORAGE_ROWS:
    rows.append((f"storage.{layout}",
                 f"{f[f'storage.{layout}.bytes_per_example'] / 1e3:.0f} kB/ex, "
                 f"{f[f'storage.{layout}.examples_s_per_core']:.0f} ex/s/core, "
                 f"{f[f'storage.{layout}.write_ms_per_example']:.2f} ms/ex to write",
                 f"{what}; {size}px, {f['storage.variants']} variants"))
  out = ["| figure | value | setting |", "|---|---|---|"]
  out += [f"| `{a}` | {b} | {c} |" for a, b, c in rows]
  out += ["", "| target | measured | wanted | met |", "|---|---|---|---|"]
  for k, t in result["targets"].items():
    out.append(f"| {k} | {t['value']:.3g} | {t['target']} | {'yes' if t['met'] else 'NO'} |")
  env = result["environment"]
  out += ["", f"{env['cores']} cores; " + ", ".join(
      f"{k} {v}" for k, v in env["versions"].items())]
  return "\n".join(out)


def plot(result: Dict[str, Any], path: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  f = result["figures"]
  names = ["on the fly\n(tf.py_function maps)", "precomputed\n(our records)",
           "read ceiling\n(TFRecordDataset)"]
  values = [f["input.on_the_fly_img_s"], f["input.precomputed_img_s"],
            f["input.read_ceiling_img_s"]]
  fig, ax = plt.subplots(figsize=(6, 3.4))
  bars = ax.bar(names, values, color=["#c44", "#36a", "#999"])
  for b, v in zip(bars, values):
    ax.text(b.get_x() + b.get_width() / 2, v, f"{v:.0f}", ha="center", va="bottom", fontsize=9)
  ax.set_ylabel("images / s")
  ax.set_title(f"Input pipeline, {result['settings']['size']}px, "
               f"{result['environment']['cores']} cores")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(prog="python -m benchmarks")
  parser.add_argument("--quick", action="store_true", help="small sizes (a few minutes)")
  parser.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)
  parser.add_argument("--json", help="write the results here")
  parser.add_argument("--plot", help="write the input-pipeline plot (PNG) here")
  parser.add_argument("--workdir", help="keep the data and outputs here (default: a temp dir)")
  args = parser.parse_args(argv)
  from pipelines import logs  # pylint: disable=g-import-not-at-top
  logs.quiet()
  mode = "tiny" if args.tiny else "quick" if args.quick else "full"
  workdir = args.workdir or tempfile.mkdtemp(prefix="beam_prep_bench_")
  os.makedirs(workdir, exist_ok=True)
  try:
    result = measure(mode, workdir)
  finally:
    if not args.workdir:
      shutil.rmtree(workdir, ignore_errors=True)
  print(table(result))
  print(f"\n({result['seconds']:.0f} s)")
  for path in (args.json, args.plot):
    if path and os.path.dirname(path):
      os.makedirs(os.path.dirname(path), exist_ok=True)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(result, f, indent=2, sort_keys=True)
  if args.plot:
    plot(result, args.plot)
