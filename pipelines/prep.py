"""The preprocessing job shared by `beam-prep segmentation` and `classification`.

    ListInputs -> split -> PlanShards -> WriteShards (per group of pointers:
        read, the task's op stages, encode, stream into the group's files)
      -> analysis rows (one per train image) -> AnalyzeAndTransform
      -> Finalize (once, last): commit the files, write manifest.json,
         preview.png and _SUCCESS

The stages and their op chains come from the task (`beam_prep.tasks`); what
the records hold, the raw schema and the default preprocessing_fn come from
the chain's declared features (`features.json`); how records reach their
files is `beam_prep.shards`; what a finished job reports is `pipelines.report`.

Output directory:

    records/train-SSSSS-of-NNNNN.tfrecord   serialized tf.Examples (raw schema)
    records/eval-SSSSS-of-NNNNN.tfrecord
    records/source-SSSSS-of-NNNNN.tfrecord  eval images at their own size (segmentation;
                                           beam_prep.source_records)
    transform/transform_fn/, transformed_metadata/, metadata/ (raw schema; not in an
                                           evaluation-only output, --eval-percent 100;
                                           copied, not analysed, with --transform-from)
    errors/errors-SSSSS-of-NNNNN.jsonl     dead letters
    index/images-SSSSS-of-NNNNN.jsonl      each image the output holds, by digest
                                           (beam_prep.image_index)
    features.json                          the declared features, chain, ops module
    config.json                            the resolved PrepConfig
    manifest.json                          config, versions, counts, shards, timings
    preview.png                            a few records, drawn
    _SUCCESS                               written last, only when the output is complete
                                           (pipelines.report.problems)

With --add, the job adds the images an output does not hold yet as a new
shard set of it (`pipelines.shard_sets`).
"""

import dataclasses
import json
import tempfile
import time
import uuid
from typing import Any, Dict, List, Optional

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from beam_prep import keys, layouts
from beam_prep.config import PrepConfig, PreviewConfig
from beam_prep.console import Interrupted
from beam_prep.features import FEATURES_FILE, FeatureError, FeatureTable
from beam_prep.kernel import Kernel
from beam_prep.ops import registry
from beam_prep.prep_output import PrepOutput, sets_of
from beam_prep.readers import ListInputs, resolve_layout
from beam_prep.record_codec import RecordCodec
from beam_prep.shards import commit, plan, write
from beam_prep.transforms import AnalyzeAndTransform
from pipelines import logs, outputs, report, runners, shard_sets
from pipelines.shard_sets import AddTarget

PREVIEW_COUNT = PreviewConfig.count
SPLITS = (keys.TRAIN_SPLIT, keys.EVAL_SPLIT)
InputError = layouts.InputError


def kernel_for(
  config: PrepConfig, table: FeatureTable, target: Optional[AddTarget] = None
) -> Kernel:
  """What turns one input of this run into records and errors (skipping the
  images an output added to holds)."""
  # A user's preprocessing_fn may analyze anything: it reads whole records.
  return Kernel(
    config.layout,
    config.stages,
    config.ops_module,
    table,
    summary_rows=not config.preprocessing_fn,
    held_by=(
      (target.output, target.kept, config.task_object.one_label_per_image) if target else None
    ),
  )


class _FinalizeFn(beam.DoFn):
  """Runs once, after every group and the transform: commits the files, then
  writes the manifest, the preview and, when the output is complete,
  `_SUCCESS` (last)."""

  def __init__(
    self,
    config: PrepConfig,
    table: FeatureTable,
    temp_root: str,
    started: float,
    target: Optional[AddTarget],
  ):
    self._config, self._table = config, table
    self._temp_root, self._started, self._target = temp_root, started, target

  def process(self, _, files, tally, preview, transform_written):
    del transform_written  # Only waited for.
    config, out, target = self._config, self._config.output, self._target
    gzip = config.compression == "gzip"
    set_name = target.name if target else ""
    shards = commit.commit_files(files, out, self._temp_root, gzip, SPLITS, set_name)
    held = target.previous["counts"] if target else None
    m = report.manifest(config, self._table, tally, time.time() - self._started, shards, held)
    if target:  # The output keeps its preview.
      m = shard_sets.combined(target, m)
    previews = [record for _, record in sorted(preview)][:PREVIEW_COUNT]
    if previews and not target:
      from pipelines import preview as drawing  # pylint: disable=g-import-not-at-top

      m["paths"]["preview"] = drawing.save(
        [ex[0] for ex in RecordCodec(self._table).decode_records(previews)],
        self._table,
        FileSystems.join(out, keys.PREVIEW_FILE),
      )
    outputs.write_text(
      FileSystems.join(out, keys.MANIFEST_FILE), json.dumps(m, indent=2, sort_keys=True)
    )
    if m["complete"]:
      outputs.write_success(out)
    yield m["counts"]


def _list_and_split(p: beam.Pipeline, config: PrepConfig) -> beam.PCollection:
  """(split, pointer) of every input; inputs that failed to list travel as pointers."""
  pointers, list_errors = p | "ListInputs" >> ListInputs(
    config.input, config.layout, config.allow_outside_root, config.image_root
  )
  eval_percent = config.eval_percent
  return (
    (pointers, list_errors | "AsPointers" >> beam.Map(plan.error_pointer))
    | "AllInputs" >> beam.Flatten()
    | "Split" >> beam.Map(_with_split, eval_percent)
  )


def _with_split(pointer, eval_percent: int):
  """(split, pointer); the pointer says its split too (what a layout reads by it)."""
  split = plan.pointer_split(pointer, eval_percent)
  return split, {**pointer, keys.SPLIT: split} if keys.SPLIT in pointer else pointer


def _analyze(written, config: PrepConfig, table: FeatureTable, kernel: Kernel, temp_dir: str):
  """tf.Transform's analysis of the rows the writers gave; the transform's output."""
  import tensorflow_transform.beam as tft_beam  # pylint: disable=g-import-not-at-top
  from beam_prep import preprocessing  # pylint: disable=g-import-not-at-top

  preprocessing_fn = preprocessing.preprocessing_fn_for(table, config.preprocessing_fn)
  with tft_beam.Context(
    temp_dir=temp_dir, desired_batch_size=_analysis_batch(kernel.summary_rows, table)
  ):
    return written[write.ANALYSIS_TAG] | "AnalyzeAndTransform" >> AnalyzeAndTransform(
      preprocessing_fn,
      FileSystems.join(config.output, keys.TRANSFORM_DIR),
      table.raw_feature_spec(),
      analysis_spec=kernel.codec.analysis_feature_spec() if kernel.summary_rows else None,
    )


def build(
  p: beam.Pipeline,
  config: PrepConfig,
  table: FeatureTable,
  temp_dir: str,
  started: Optional[float] = None,
  target: Optional[AddTarget] = None,
) -> None:
  """Adds the whole preprocessing job to pipeline `p` (with `target`: the
  job adds a shard set to that output, `pipelines.shard_sets`)."""
  gzip = config.compression == "gzip"
  kernel = kernel_for(config, table, target)
  temp_root = FileSystems.join(config.output, f"{keys.TEMP_PREFIX}{uuid.uuid4().hex}")
  inputs = _list_and_split(p, config)
  shard_plan = inputs | "PlanShards" >> plan.PlanShards(kernel, config.target_shard_mb * 1e6, gzip)
  written = (inputs, shard_plan) | "WriteShards" >> write.WriteShards(
    kernel, temp_root, gzip, config.progress_seconds
  )
  if config.eval_only or config.transform_from or config.add:
    # Nothing to train on, or a transform given (`copy_transform`, the
    # output's own with --add): no analysis.
    transform_fn = p | "NoAnalysis" >> beam.Create([])
  else:
    transform_fn = _analyze(written, config, table, kernel, temp_dir)
  tally = written[write.TALLY_TAG] | "SumCounts" >> beam.CombineGlobally(write.MergeTallies())
  preview = written[write.PREVIEW_TAG] | "PreviewRecords" >> beam.combiners.Top.Smallest(
    PREVIEW_COUNT, key=lambda kv: kv[0]
  )
  _ = (
    p
    | "Once" >> beam.Create([None])
    | "Finalize"
    >> beam.ParDo(
      _FinalizeFn(config, table, temp_root, started or time.time(), target),
      beam.pvalue.AsList(written[write.FILES_TAG]),
      beam.pvalue.AsSingleton(tally),
      beam.pvalue.AsSingleton(preview),
      beam.pvalue.AsList(transform_fn),
    )
  )


def _analysis_batch(summary_rows: bool, table: FeatureTable) -> int:
  """Rows per tf.Transform batch: a few tens of MB of decoded features."""
  if summary_rows:
    return 1000  # A few hundred bytes each.
  row = sum(e.stored_bytes(table.image_size) * 4 for e in table if e.feature.per_pixel)
  return int(max(1, min(1000, 64e6 // max(row, 1))))


def with_layout(config: PrepConfig, dry_run: bool) -> PrepConfig:
  """The config with `layout="auto"` replaced by the layout that recognises the input
  (a dry run reads nothing from gs://: it judges by the name), and made
  evaluation-only when the input's layout fixes every input as eval."""
  if not keys.is_remote(config.input) and not FileSystems.exists(config.input):
    raise InputError(f"input {config.input} does not exist")
  offline = dry_run and keys.is_remote(config.input)
  layout = resolve_layout(config.input, config.layout, config.task_object.labels, offline=offline)
  config = dataclasses.replace(config, layout=layout.name)
  if (
    not config.eval_only
    and not offline
    and layout.only_split(config.read_options) == keys.EVAL_SPLIT
  ):
    logs.get().info(
      "%s: every input of %s is in the eval split (%s layout): an evaluation-only "
      "output, as with --eval-percent 100",
      config.task,
      config.input,
      layout.name,
    )
    config = dataclasses.replace(config, eval_percent=100)
  return config


def check_input(config: PrepConfig) -> None:
  """Fails early, saying what was expected, when a local input holds nothing to read.

  Raises:
    InputError: naming the input and what its layout expects.
  """
  if keys.is_remote(config.input):
    return  # Checked by the workers; no credentials may be at hand here.
  if not FileSystems.exists(config.input):
    raise InputError(f"input {config.input} does not exist")
  layout = layouts.get_layout(config.layout)
  try:
    layout.check_input(config.read_options)
  except InputError as e:
    raise InputError(
      f"{config.input} as the {layout.name} layout: {e} (expected: {layout.expects})"
    ) from None


class JobStillRunning(Interrupted):
  """The launcher stopped waiting; the Dataflow job goes on (the message says how to stop it)."""


def job_link(result, options: PipelineOptions) -> Dict[str, Optional[str]]:
  """Job id and console URL of a submitted Dataflow job (None elsewhere)."""
  job_id = result.job_id() if hasattr(result, "job_id") else None
  all_options = options.get_all_options()
  region, project = all_options.get("region"), all_options.get("project")
  url = (
    f"https://console.cloud.google.com/dataflow/jobs/{region}/{job_id}?project={project}"
    if job_id
    else None
  )
  return {"job_id": job_id, "console_url": url, "region": region}


def _start(config: PrepConfig, table: FeatureTable, dry_run: bool) -> None:
  """Checks the input, prepares the output and writes what the job runs with."""
  registry.check_chain(
    registry.parse_chain(config.chain), _given_keys(config), f"the {config.layout} layout"
  )
  if not dry_run:
    check_input(config)
    source = (
      transform_source(config.transform_from, table)
      if config.transform_from and not config.eval_only
      else None
    )
  if not dry_run and not config.add:
    outputs.prepare_output(config.output, config.overwrite)
    outputs.write_text(FileSystems.join(config.output, keys.CONFIG_FILE), config.to_json())
    outputs.write_text(FileSystems.join(config.output, FEATURES_FILE), table.to_json())
    if source is not None:
      copy_transform(source, config.output)


def _temp_dir(config: PrepConfig, options: PipelineOptions) -> str:
  """tf.Transform's temp dir: under --temp_location, else in the output."""
  temp_location = options.get_all_options().get("temp_location")
  if temp_location:
    return FileSystems.join(temp_location, "beam_prep_tft")
  return FileSystems.join(config.output, keys.TEMP_PREFIX + "transform")


class TransformFromError(Exception):
  """--transform-from names no transform these records can be read with; the message says why."""


def transform_source(path: str, table: FeatureTable) -> PrepOutput:
  """The prep output `--transform-from` names (itself, or the one a model dir
  trained on), checked: it has a transform, and its records' raw schema is
  this run's.

  Raises:
    TransformFromError: naming the folder and why.
  """
  prep = PrepOutput(path)
  if not FileSystems.exists(prep.join(keys.MANIFEST_FILE)):  # Not a prep output: a model dir?
    try:
      prep = PrepOutput.of_model(path)
    except FileNotFoundError as e:
      raise TransformFromError(
        f"--transform-from {path}: not a beam-prep output, and {e}"
      ) from None
  if not FileSystems.exists(prep.join(keys.TRANSFORM_DIR, "transform_fn")):
    raise TransformFromError(
      f"--transform-from {path}: {prep.path} has no tf.Transform output "
      f"({keys.TRANSFORM_DIR}/transform_fn; an evaluation-only output?)"
    )
  differ = schema_differences(prep.table, table)
  if differ:
    raise TransformFromError(
      f"--transform-from {path}: its records' raw schema differs from this run's in "
      f"{', '.join(differ)} (give the settings it was made with: {prep.join(keys.CONFIG_FILE)})"
    )
  return prep


# What a transform reads of a feature: its bytes' meaning, not which op made it.
_SCHEMA_FIELDS = ("dtype", "shape", "role", "normalize", "encoding", "channels")


def _schema(table: FeatureTable) -> Dict[str, tuple]:
  return {f["key"]: tuple(str(f[k]) for k in _SCHEMA_FIELDS) for f in table.to_dict()["features"]}


def schema_differences(theirs: FeatureTable, ours: FeatureTable) -> List[str]:
  """The features whose raw schema differs between two tables ([]: none)."""
  a, b = _schema(theirs), _schema(ours)
  return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def copy_transform(prep: PrepOutput, output: str) -> None:
  """Copies the tf.Transform output of `prep` (`transform_source`) into `output`."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  src, dst = prep.join(keys.TRANSFORM_DIR), FileSystems.join(output, keys.TRANSFORM_DIR)
  for folder, _, files in tf.io.gfile.walk(src):
    target = FileSystems.join(dst, folder[len(src) :].lstrip("/"))
    tf.io.gfile.makedirs(target)
    for name in files:
      tf.io.gfile.copy(
        FileSystems.join(folder, name), FileSystems.join(target, name), overwrite=True
      )
  logs.get().info(
    "%s: records read with the transform of %s (no analysis)", prep.table.task, prep.path
  )


def _given_keys(config: PrepConfig):
  """Keys every example of this run's layout holds before the first op."""
  return layouts.BASE_KEYS + layouts.get_layout(config.layout).gives


def _wait(result, link: Dict[str, Optional[str]]) -> None:
  """Waits for the job; Ctrl-C on a Dataflow job leaves it running, and says so."""
  try:
    result.wait_until_finish()
  except KeyboardInterrupt:
    if link["job_id"]:
      raise JobStillRunning(
        f"stopped waiting; job {link['job_id']} keeps running on Dataflow ({link['console_url']})."
        f" To stop it: gcloud dataflow jobs cancel {link['job_id']} --region={link['region']}"
      ) from None
    raise


def _guarded(config: PrepConfig, fn, remove: bool = True, target: Optional[AddTarget] = None):
  """Calls `fn`; an op's bug (it stops the job) removes the half-written
  output (or, with --add, the half-written set: the output is as it was)."""
  try:
    return fn()
  except FeatureError:
    if remove and target:
      shard_sets.restore(target)
    elif remove:
      outputs.remove_output(config.output)
    raise


def run(
  config: PrepConfig, pipeline_options: Optional[PipelineOptions] = None, wait: bool = True
) -> Dict[str, Any]:
  """Runs the job; the job itself writes manifest.json, preview.png and (when
  the output is complete) _SUCCESS.

  With Beam's `--dry_run=True` (Dataflow), builds the job and returns
  `{"dry_run": True, "job": ...}` without touching any file. With
  `wait=False` on Dataflow, returns `{"submitted": True, "job_id": ...,
  "console_url": ...}` as soon as the job is submitted.

  Returns:
    The manifest the job wrote (`complete` False: see its `problems`).

  Raises:
    pipelines.outputs.OutputExistsError: non-empty output without overwrite.
    pipelines.shard_sets.AddError: --add to an output it cannot add to, or
      that another job is adding to.
    InputError: a local input with nothing to read.
    FeatureError: an op's bug (the output is removed).
    JobStillRunning: Ctrl-C while waiting for a Dataflow job.
    RuntimeError: the job ended without writing its manifest.
  """
  from apache_beam.options.pipeline_options import TestOptions  # pylint: disable=g-import-not-at-top

  started = time.time()
  registry.import_ops_modules(config.ops_module)
  options = pipeline_options or PipelineOptions()
  dry_run = bool(options.view_as(TestOptions).dry_run)
  config = with_layout(config, dry_run)
  if dry_run:
    # tf.Transform traces the preprocessing_fn into its temp dir while the
    # job is built; offline, that must be a local folder.
    with tempfile.TemporaryDirectory(prefix="beam_prep_dry_run_") as temp_dir:
      return _run(config, options, wait, started, dry_temp=temp_dir)
  if not config.add:
    return _run(config, options, wait, started)
  with shard_sets.one_job_adding(config.output):
    return _run(config, options, wait, started)


def _run(
  config: PrepConfig, options, wait: bool, started: float, dry_temp: str = ""
) -> Dict[str, Any]:
  """`run`, its config resolved (with --add, under the output's lock); a dry
  run's tf.Transform temp dir is `dry_temp`."""
  log, table, dry_run = logs.get(), config.features(), bool(dry_temp)
  adding = config.add and not dry_run
  target = shard_sets.check_target(config, table, schema_differences) if adding else None
  _start(config, table, dry_run)
  temp_dir = dry_temp or _temp_dir(config, options)
  if target:
    shard_sets.ready(target, config.task)
  p = beam.Pipeline(runner=runners.local_engine(options), options=options)
  build(p, config, table, temp_dir, started, target)
  runner = runners.runner_name(options) or "DirectRunner"
  log.info(
    "%s: %s on %s (%s layout: %s -> %s)",
    config.task,
    "building the job (dry run)" if dry_run else "running",
    runner,
    config.layout,
    config.input,
    config.output,
  )
  result = _guarded(config, p.run, remove=not dry_run, target=target)
  if dry_run:
    result.wait_until_finish()
    return {"pipeline": config.task, "dry_run": True, "job": getattr(result, "job", None)}
  link = job_link(result, options)
  if link["job_id"]:
    log.info(
      "%s: submitted job %s; live counters: %s", config.task, link["job_id"], link["console_url"]
    )
    if not wait:
      return {"pipeline": config.task, "submitted": True, **link}
  _guarded(config, lambda: _wait(result, link), target=target)
  return _finished(config, result, temp_dir, options, target)


def _finished(config: PrepConfig, result, temp_dir: str, options, target) -> Dict[str, Any]:
  manifest_path = FileSystems.join(config.output, keys.MANIFEST_FILE)
  written = FileSystems.exists(manifest_path)
  if written and target:  # The manifest was there before: it must name the job's set.
    written = sets_of(outputs.read_json(manifest_path))[-1]["name"] == target.name
  if not written:
    raise RuntimeError(f"the job ended ({result.state}) without writing {manifest_path}")
  if not options.get_all_options().get("temp_location") and FileSystems.exists(temp_dir):
    FileSystems.delete([temp_dir])
  return outputs.read_json(manifest_path)
