"""The preprocessing job shared by `beam-prep segmentation` and `classification`.

segmentation:
    ReadExamples -> DecodeExamples -> SampleClicks -> EncodeClicks (+ user ops)
      -> EncodeExamples -> WriteExamples (train, eval)
                        -> AnalyzeAndTransform (train split)
classification:
    ReadExamples -> DecodeExamples -> CheckLabels (+ user ops) -> EncodeExamples -> ...
both:
    all errors -> WriteDeadLetters; all counts -> manifest.json

The stages and their op chains come from the task (`beam_prep.tasks`); what
the records hold, the raw schema and the default preprocessing_fn come from
the chain's declared features (`features.json`).

Output directory:

    records/train-SSSSS-of-NNNNN.tfrecord   serialized tf.Examples (raw schema)
    records/eval-SSSSS-of-NNNNN.tfrecord
    transform/transform_fn/, transformed_metadata/, metadata/ (raw schema)
    errors/errors-SSSSS-of-NNNNN.jsonl     dead letters
    features.json                          the declared features, chain, ops module
    config.json                            the resolved PrepConfig
    manifest.json                          config, versions, counts, timings
"""

import dataclasses
import json
from typing import Any, Dict, Optional

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from beam_prep import keys, tasks
from beam_prep.config import PrepConfig
from beam_prep.features import FEATURES_FILE, FeatureTable
from beam_prep.ops import registry
from beam_prep.transforms import (AnalyzeAndTransform, ApplyOps, EncodeExamples, ReadExamples,
                                  WriteDeadLetters, WriteExamples)
from pipelines import logs, outputs

COUNTS_FILE = "_counts.json"


def build(p: beam.Pipeline, config: PrepConfig, table: FeatureTable, temp_dir: str) -> None:
  """Adds the whole preprocessing job to pipeline `p`."""
  import tensorflow_transform.beam as tft_beam  # pylint: disable=g-import-not-at-top
  from beam_prep import preprocessing  # pylint: disable=g-import-not-at-top

  out = config.output
  task = config.task_object
  images, read_errors = p | "ReadExamples" >> ReadExamples(
      config.input, config.layout, config.allow_outside_root)
  (first_label, first_chain), *later = config.stages
  # After the first stage an example is a unit: an object (or a decoded image).
  units, errors = images | first_label >> ApplyOps(first_chain, config.ops_module)
  error_list = [read_errors, errors]
  current = units
  for label, chain in later:
    current, errors = current | label >> ApplyOps(chain, config.ops_module)
    error_list.append(errors)
  encoded = current | "EncodeExamples" >> EncodeExamples(config.eval_percent, table)

  splits = {}
  for split in (keys.TRAIN_SPLIT, keys.EVAL_SPLIT):
    splits[split] = (encoded
                     | f"Select{split.title()}" >> beam.Filter(lambda kv, s=split: kv[0] == s)
                     | f"Drop{split.title()}Key" >> beam.Map(lambda kv: (kv[1], kv[2])))
    _ = splits[split] | f"Write{split.title()}Examples" >> WriteExamples(
        out, split, config.num_shards, config.compression)

  preprocessing_fn = preprocessing.preprocessing_fn_for(table, config.preprocessing_fn)
  with tft_beam.Context(temp_dir=temp_dir):
    _ = (splits[keys.TRAIN_SPLIT]
         | "Serialized" >> beam.Values()
         | "AnalyzeAndTransform" >> AnalyzeAndTransform(
        preprocessing_fn, FileSystems.join(out, keys.TRANSFORM_DIR), table.raw_feature_spec()))

  unit_ops = tasks.unit_ops(config)
  stage_names = {spec.name for spec in registry.parse_chain(config.chain)} | unit_ops
  image_level = {s: task.image_level(s, config) for s in stage_names}

  def error_keys(e: Dict[str, Any]):
    level = "image" if image_level[e["stage"]] else "object"
    out = [(f"errors_{level}", 1), (f"reason/{e['reason']}", 1)]
    if e["stage"] not in unit_ops:  # Lost after being counted as a unit.
      out.append(("errors_after_units", 1))
    return out

  errors = tuple(error_list) | "AllErrors" >> beam.Flatten()
  _ = errors | "WriteDeadLetters" >> WriteDeadLetters(out)

  counts = (
      (images | "CountImages" >> beam.Map(lambda _: ("images_decoded_input", 1)),
       read_errors | "CountReadErrors" >> beam.Map(lambda _: ("inputs_unreadable", 1)),
       units | "CountObjects" >> beam.Map(lambda _: ("objects", 1)),
       encoded | "CountExamples" >> beam.Map(lambda kv: (f"examples/{kv[0]}", 1)),
       errors | "CountErrors" >> beam.FlatMap(error_keys))
      | "AllCounts" >> beam.Flatten()
      | "SumCounts" >> beam.CombinePerKey(sum)
      | "OneDict" >> beam.combiners.ToDict()
      | "CountsJson" >> beam.Map(lambda d: json.dumps(d, sort_keys=True)))
  _ = counts | "WriteCounts" >> beam.io.WriteToText(
      FileSystems.join(out, COUNTS_FILE), shard_name_template="")


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
    layout = "manifest" if readers._is_manifest(config.input) else "folders"  # pylint: disable=protected-access
  else:
    layout = readers.detect_layout(config.input)
  return dataclasses.replace(config, layout=layout)


def run(config: PrepConfig, pipeline_options: Optional[PipelineOptions] = None) -> Dict[str, Any]:
  """Runs the job, writes config.json, manifest.json and preview.png.

  With Beam's `--dry_run=True` (Dataflow), builds the job and returns
  `{"dry_run": True, "job": ...}` without touching any file.

  Raises:
    pipelines.outputs.OutputExistsError: non-empty output without overwrite.
    InputError: a local input with nothing to read.
  """
  from apache_beam.options.pipeline_options import TestOptions  # pylint: disable=g-import-not-at-top
  log = logs.get()
  clock = outputs.Stopwatch()
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
  temp_dir = FileSystems.join(config.output, "tmp")
  temp_location = options.get_all_options().get("temp_location")
  if temp_location:
    temp_dir = FileSystems.join(temp_location, "beam_prep_tft")
  if dry_run:
    # tf.Transform traces the preprocessing_fn into its temp dir while the
    # job is built; offline, that must be a local folder.
    import tempfile  # pylint: disable=g-import-not-at-top
    temp_dir = tempfile.mkdtemp(prefix="beam_prep_dry_run_")

  p = beam.Pipeline(options=options)
  build(p, config, table, temp_dir)
  runner = options.get_all_options()["runner"] or "DirectRunner"
  log.info("%s: %s on %s (%s layout: %s -> %s)", config.task,
           "building the job (dry run)" if dry_run else "running", runner, config.layout,
           config.input, config.output)
  result = p.run()
  result.wait_until_finish()
  if dry_run:
    return {"pipeline": config.task, "dry_run": True, "job": getattr(result, "job", None)}
  seconds = clock.seconds()

  counts_path = FileSystems.join(config.output, COUNTS_FILE)
  raw = outputs.read_json(counts_path)
  FileSystems.delete([counts_path])
  if not temp_location and FileSystems.exists(temp_dir):
    FileSystems.delete([temp_dir])
  manifest = _manifest(config, table, raw, seconds)
  outputs.write_text(FileSystems.join(config.output, keys.MANIFEST_FILE),
                     json.dumps(manifest, indent=2, sort_keys=True))
  return manifest


def _manifest(config: PrepConfig, table: FeatureTable, raw: Dict[str, int],
              seconds: float) -> Dict[str, Any]:
  """manifest.json: config, features, versions, counts, timings, preview."""
  acc = accounting(raw, config.task_object.records_per_unit(config))
  n_examples = sum(acc["examples_written"].values())
  records = FileSystems.join(config.output, keys.RECORDS_DIR)
  manifest = {
      "pipeline": config.task,
      "config": config.to_dict(),
      "versions": outputs.library_versions(),
      "features": table.to_dict()["features"],
      "paths": {
          "records": records,
          "transform": FileSystems.join(config.output, keys.TRANSFORM_DIR),
          "errors": FileSystems.join(config.output, keys.ERRORS_DIR),
          "preview": None,
      },
      "counts": acc,
      "timing": {
          "wall_seconds": round(seconds, 2),
          "examples_per_second": round(n_examples / seconds, 2) if seconds else None,
          "images_per_second": round(acc["inputs_read"] / seconds, 2) if seconds else None,
      },
  }
  if n_examples:
    from pipelines import preview  # pylint: disable=g-import-not-at-top
    manifest["paths"]["preview"] = preview.write_preview(
        records, FileSystems.join(config.output, keys.PREVIEW_FILE), table=table)
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
