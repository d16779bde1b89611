"""The preprocessing job shared by `beam-prep segmentation` and `classification`.

    ListInputs -> split -> PlanShards -> WriteShards (per group of pointers:
        read, the task's op stages, encode, stream into the group's files)
      -> analysis rows (one per train image) -> AnalyzeAndTransform
      -> Finalize (once, last): commit the files, write manifest.json,
         preview.png and _SUCCESS

The stages and their op chains come from the task (`beam_prep.tasks`); what
the records hold, the raw schema and the default preprocessing_fn come from
the chain's declared features (`features.json`); how records reach their
files is `beam_prep.sharding`.

Output directory:

    records/train-SSSSS-of-NNNNN.tfrecord   serialized tf.Examples (raw schema)
    records/eval-SSSSS-of-NNNNN.tfrecord
    transform/transform_fn/, transformed_metadata/, metadata/ (raw schema)
    errors/errors-SSSSS-of-NNNNN.jsonl     dead letters
    features.json                          the declared features, chain, ops module
    config.json                            the resolved PrepConfig
    manifest.json                          config, versions, counts, shards, timings
    preview.png                            a few records, drawn
    _SUCCESS                               written last: the output is complete
"""

import dataclasses
import json
import os
import time
import uuid
from typing import Any, Dict, List, Optional

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from beam_prep import keys, sharding, tasks
from beam_prep.config import PrepConfig
from beam_prep.features import FEATURES_FILE, FeatureTable
from beam_prep.ops import registry
from beam_prep.readers import ListInputs
from beam_prep.transforms import AnalyzeAndTransform
from pipelines import logs, outputs

PREVIEW_COUNT = 6
TEMP_PREFIX = ".temp-"


def processor_for(config: PrepConfig, table: FeatureTable) -> sharding.ImageProcessor:
  """What turns one input of this run into records and errors."""
  task = config.task_object
  unit_ops = tasks.unit_ops(config)
  stage_names = {spec.name for spec in registry.parse_chain(config.chain)} | unit_ops
  image_level = {s: task.image_level(s, config) for s in stage_names}
  # A user's preprocessing_fn may analyze anything: it reads whole records.
  return sharding.ImageProcessor(config.stages, config.ops_module, table, image_level, unit_ops,
                                 summary_rows=not config.preprocessing_fn)


class _FinalizeFn(beam.DoFn):
  """Runs once, after every group and the transform: commits the files, then
  writes the manifest, the preview and `_SUCCESS` (last)."""

  def __init__(self, config: PrepConfig, table: FeatureTable, temp_root: str, started: float):
    self._config, self._table = config, table
    self._temp_root, self._started = temp_root, started

  def process(self, _, files, counts, preview, transform_written):
    del transform_written  # Only waited for.
    config = self._config
    gzip = config.compression == "gzip"
    shards = sharding.commit_files(files, config.output, self._temp_root, gzip,
                                   (keys.TRAIN_SPLIT, keys.EVAL_SPLIT))
    previews = [record for _, record in sorted(preview)][:PREVIEW_COUNT]
    manifest = _manifest(config, self._table, counts, time.time() - self._started, shards,
                         previews)
    outputs.write_text(FileSystems.join(config.output, keys.MANIFEST_FILE),
                       json.dumps(manifest, indent=2, sort_keys=True))
    outputs.write_text(FileSystems.join(config.output, keys.SUCCESS_FILE),
                       json.dumps({"manifest": keys.MANIFEST_FILE}) + "\n")
    yield manifest["counts"]


def build(p: beam.Pipeline, config: PrepConfig, table: FeatureTable, temp_dir: str,
          started: Optional[float] = None) -> None:
  """Adds the whole preprocessing job to pipeline `p`."""
  import tensorflow_transform.beam as tft_beam  # pylint: disable=g-import-not-at-top
  from beam_prep import preprocessing  # pylint: disable=g-import-not-at-top

  out = config.output
  gzip = config.compression == "gzip"
  processor = processor_for(config, table)
  temp_root = FileSystems.join(out, f"{TEMP_PREFIX}{uuid.uuid4().hex}")
  pointers, list_errors = p | "ListInputs" >> ListInputs(
      config.input, config.layout, config.allow_outside_root, config.image_root)
  eval_percent = config.eval_percent
  inputs = ((pointers,
             list_errors | "AsPointers" >> beam.Map(sharding.error_pointer))
            | "AllInputs" >> beam.Flatten()
            | "Split" >> beam.Map(lambda ptr: (sharding.pointer_split(ptr, eval_percent), ptr)))
  plan = inputs | "PlanShards" >> sharding.PlanShards(
      processor, config.target_shard_mb * 1e6, gzip)
  written = (inputs, plan) | "WriteShards" >> sharding.WriteShards(
      processor, temp_root, gzip, config.progress_seconds)

  preprocessing_fn = preprocessing.preprocessing_fn_for(table, config.preprocessing_fn)
  with tft_beam.Context(temp_dir=temp_dir,
                        desired_batch_size=_analysis_batch(processor.summary_rows, table)):
    transform_fn = written[sharding.ANALYSIS_TAG] | "AnalyzeAndTransform" >> AnalyzeAndTransform(
        preprocessing_fn, FileSystems.join(out, keys.TRANSFORM_DIR), table.raw_feature_spec(),
        analysis_spec=table.analysis_feature_spec() if processor.summary_rows else None)

  counts = (written[sharding.COUNTS_TAG]
            | "SumCounts" >> beam.CombineGlobally(sharding.MergeCounts()))
  preview = (written[sharding.PREVIEW_TAG]
             | "PreviewRecords" >> beam.combiners.Top.Smallest(PREVIEW_COUNT, key=lambda kv: kv[0]))
  _ = (p
       | "Once" >> beam.Create([None])
       | "Finalize" >> beam.ParDo(
           _FinalizeFn(config, table, temp_root, started or time.time()),
           beam.pvalue.AsList(written[sharding.FILES_TAG]), beam.pvalue.AsSingleton(counts),
           beam.pvalue.AsSingleton(preview), beam.pvalue.AsList(transform_fn)))


def _analysis_batch(summary_rows: bool, table: FeatureTable) -> int:
  """Rows per tf.Transform batch: a few tens of MB of decoded features."""
  if summary_rows:
    return 1000  # A few hundred bytes each.
  row = sum(e.stored_bytes(table.image_size) * 4 for e in table if e.feature.per_pixel)
  return int(max(1, min(1000, 64e6 // max(row, 1))))


def accounting(raw: Dict[str, int], per_object: int) -> Dict[str, Any]:
  """Turns raw counts into the manifest's accounting, and checks it adds up.

  Args:
    raw: the counts the pipeline wrote.
    per_object: records per used object (segmentation: the variants; for
      classification an "object" is the image, 1 record each).
  """
  inputs = raw.get("images_decoded_input", 0) + raw.get("inputs_unreadable", 0)
  examples = {s: raw.get(f"examples/{s}", 0) for s in (keys.TRAIN_SPLIT, keys.EVAL_SPLIT)}
  errors = {k.split("/", 1)[1]: v for k, v in sorted(raw.items()) if k.startswith("reason/")}
  image_errors = raw.get("errors_image", 0)
  object_errors = raw.get("errors_object", 0)
  objects = raw.get("objects", 0)
  images_used = inputs - image_errors
  units_lost = raw.get("errors_after_units", 0)
  objects_used = objects - object_errors
  return {
      "inputs_read": inputs,
      "images_used": images_used,
      "images_failed": image_errors,
      "objects_found": objects,
      "objects_used": objects_used,
      "objects_failed": object_errors,
      "examples_written": examples,
      "errors_by_reason": errors,
      "errors_total": image_errors + object_errors,
      # Every unit (object, or image for classification) that did not fail
      # yields exactly `per_object` records.
      "accounted": sum(examples.values()) == (objects - units_lost) * per_object,
  }


def resolve_layout(config: PrepConfig, dry_run: bool) -> PrepConfig:
  """The config with `layout="auto"` replaced by the layout found."""
  from beam_prep import readers  # pylint: disable=g-import-not-at-top
  if config.layout != "auto":
    return config
  if dry_run and "://" in config.input:
    # A dry run builds the job offline: guess from the name, read nothing.
    if config.image_root and config.input.lower().endswith(".json"):
      layout = "coco"
    else:
      layout = "manifest" if readers._is_manifest(config.input) else "folders"  # pylint: disable=protected-access
  else:
    layout = readers.detect_layout(config.input)
  return dataclasses.replace(config, layout=layout)


class JobStillRunning(Exception):
  """The launcher stopped waiting; the Dataflow job goes on (the message says how to stop it)."""


def job_link(result, options: PipelineOptions) -> Dict[str, Optional[str]]:
  """Job id and console URL of a submitted Dataflow job (None elsewhere)."""
  job_id = result.job_id() if hasattr(result, "job_id") else None
  all_options = options.get_all_options()
  region, project = all_options.get("region"), all_options.get("project")
  url = (f"https://console.cloud.google.com/dataflow/jobs/{region}/{job_id}?project={project}"
         if job_id else None)
  return {"job_id": job_id, "console_url": url, "region": region}


def run(config: PrepConfig, pipeline_options: Optional[PipelineOptions] = None,
        wait: bool = True) -> Dict[str, Any]:
  """Runs the job; the job itself writes manifest.json, preview.png and _SUCCESS.

  With Beam's `--dry_run=True` (Dataflow), builds the job and returns
  `{"dry_run": True, "job": ...}` without touching any file. With
  `wait=False` on Dataflow, returns `{"submitted": True, "job_id": ...,
  "console_url": ...}` as soon as the job is submitted.

  Returns:
    The manifest the job wrote.

  Raises:
    pipelines.outputs.OutputExistsError: non-empty output without overwrite.
    InputError: a local input with nothing to read.
    JobStillRunning: Ctrl-C while waiting for a Dataflow job.
    RuntimeError: the job ended without writing `_SUCCESS`.
  """
  from apache_beam.options.pipeline_options import TestOptions  # pylint: disable=g-import-not-at-top
  log = logs.get()
  started = time.time()
  registry.import_ops_modules(config.ops_module)
  table = config.features()
  options = pipeline_options or PipelineOptions()
  dry_run = bool(options.view_as(TestOptions).dry_run)
  config = resolve_layout(config, dry_run)
  if not dry_run:
    _check_input(config)
    outputs.prepare_output(config.output, config.overwrite)
    outputs.write_text(FileSystems.join(config.output, keys.CONFIG_FILE), config.to_json())
    outputs.write_text(FileSystems.join(config.output, FEATURES_FILE), table.to_json())
  temp_dir = FileSystems.join(config.output, TEMP_PREFIX + "transform")
  temp_location = options.get_all_options().get("temp_location")
  if temp_location:
    temp_dir = FileSystems.join(temp_location, "beam_prep_tft")
  if dry_run:
    # tf.Transform traces the preprocessing_fn into its temp dir while the
    # job is built; offline, that must be a local folder.
    import tempfile  # pylint: disable=g-import-not-at-top
    temp_dir = tempfile.mkdtemp(prefix="beam_prep_dry_run_")

  p = beam.Pipeline(options=options)
  build(p, config, table, temp_dir, started)
  runner = options.get_all_options()["runner"] or "DirectRunner"
  log.info("%s: %s on %s (%s layout: %s -> %s)", config.task,
           "building the job (dry run)" if dry_run else "running", runner, config.layout,
           config.input, config.output)
  result = p.run()
  if dry_run:
    result.wait_until_finish()
    return {"pipeline": config.task, "dry_run": True, "job": getattr(result, "job", None)}
  link = job_link(result, options)
  if link["job_id"]:
    log.info("%s: submitted job %s; live counters: %s", config.task, link["job_id"],
             link["console_url"])
    if not wait:
      return {"pipeline": config.task, "submitted": True, **link}
  try:
    result.wait_until_finish()
  except KeyboardInterrupt:
    if link["job_id"]:
      raise JobStillRunning(
          f"stopped waiting; job {link['job_id']} keeps running on Dataflow ({link['console_url']})."
          f" To stop it: gcloud dataflow jobs cancel {link['job_id']} --region={link['region']}"
          ) from None
    raise
  success = FileSystems.join(config.output, keys.SUCCESS_FILE)
  if not FileSystems.exists(success):
    raise RuntimeError(f"the job ended ({result.state}) without writing {success}")
  if not temp_location and FileSystems.exists(temp_dir):
    FileSystems.delete([temp_dir])
  return outputs.read_json(FileSystems.join(config.output, keys.MANIFEST_FILE))


def _manifest(config: PrepConfig, table: FeatureTable, raw: Dict[str, int], seconds: float,
              shards: Dict[str, Any], previews: List[bytes]) -> Dict[str, Any]:
  """manifest.json: config, features, versions, counts, shards, timings, preview."""
  acc = accounting(raw, config.task_object.records_per_unit(config))
  n_examples = sum(acc["examples_written"].values())
  manifest = {
      "pipeline": config.task,
      "config": config.to_dict(),
      "versions": outputs.library_versions(),
      "features": table.to_dict()["features"],
      "paths": {
          "records": FileSystems.join(config.output, keys.RECORDS_DIR),
          "transform": FileSystems.join(config.output, keys.TRANSFORM_DIR),
          "errors": FileSystems.join(config.output, keys.ERRORS_DIR),
          "preview": None,
      },
      "counts": acc,
      "shards": shards,
      "timing": {
          "wall_seconds": round(seconds, 2),
          "examples_per_second": round(n_examples / seconds, 2) if seconds else None,
          "images_per_second": round(acc["inputs_read"] / seconds, 2) if seconds else None,
      },
  }
  if previews:
    from pipelines import preview  # pylint: disable=g-import-not-at-top
    manifest["paths"]["preview"] = preview.save(
        [table.decode_numpy(r) for r in previews], table,
        FileSystems.join(config.output, keys.PREVIEW_FILE))
  return manifest


class InputError(Exception):
  """The input root holds nothing to process."""


def _check_input(config: PrepConfig) -> None:
  """Fails early, with the expected layout, when a local input has nothing.

  `config.layout` is the resolved one (see `resolve_layout`).
  """
  from beam_prep import readers  # pylint: disable=g-import-not-at-top
  root = config.input
  if "://" in root:
    return  # Checked by the workers; no credentials may be at hand here.
  if not FileSystems.exists(root):
    raise InputError(f"input {root} does not exist")
  layout = config.layout
  if layout == "coco":
    image_root = config.image_root or os.path.dirname(root) or "."
    if "://" not in image_root and not os.path.isdir(image_root):
      raise InputError(f"image root {image_root} (of the COCO file {root}) is not a folder")
  elif config.image_root:
    raise InputError(f"--image-root is for the coco layout; {root} was read as {layout!r}")
  patterns = readers.input_patterns(root, layout)
  found = any(FileSystems.match([pat], limits=[1])[0].metadata_list for pat in patterns)
  if not found:
    raise InputError(f"no input found for layout {layout!r}: nothing matches "
                     f"{', '.join(patterns)} (see `beam-prep {config.task} --help` for layouts)")


def error_fraction(manifest: Dict[str, Any]) -> float:
  """Failed units over all units: images, plus objects for segmentation."""
  c = manifest["counts"]
  units = c["inputs_read"]
  if tasks.get(manifest["pipeline"]).splits_objects:
    units += c["objects_found"]
  return (c["images_failed"] + c["objects_failed"]) / max(units, 1)


def summary_lines(manifest: Dict[str, Any]) -> list:
  """The end-of-run summary, a few lines a person reads at a glance."""
  c, t = manifest["counts"], manifest["timing"]
  ex = c["examples_written"]
  inputs = (f"  inputs read      {c['inputs_read']} images ({c['images_used']} used, "
            f"{c['images_failed']} failed)")
  if tasks.get(manifest["pipeline"]).splits_objects:
    inputs += (f"; {c['objects_found']} objects ({c['objects_used']} used, "
               f"{c['objects_failed']} failed)")
  lines = [
      inputs,
      f"  examples written train {ex.get('train', 0)}, eval {ex.get('eval', 0)} "
      f"-> {manifest['paths']['records']}",
      f"  transform        {manifest['paths']['transform']}",
  ]
  if c["errors_total"]:
    reasons = ", ".join(f"{k} {v}" for k, v in c["errors_by_reason"].items())
    lines.append(f"  errors           {c['errors_total']} ({reasons}) -> "
                 f"{manifest['paths']['errors']}")
  else:
    lines.append("  errors           none")
  if manifest["paths"].get("preview"):
    lines.append(f"  preview          {manifest['paths']['preview']}")
  lines.append(f"  time             {t['wall_seconds']:.1f} s, "
               f"{t['examples_per_second']:.1f} examples/s, "
               f"{t['images_per_second']:.1f} images/s")
  return lines
