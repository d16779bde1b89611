"""`PrepConfig`: everything a preprocessing run needs, in one frozen object."""

import dataclasses
import json
from typing import Any, ClassVar, Dict

from beam_prep import keys
from beam_prep.kit import CommandConfig, option


# A preset is one name for a matching pair of settings: these of the
# preprocessing, and the training's of the same name (`train.config.TRAIN_PRESETS`).
PREP_PRESETS: Dict[str, Dict[str, Any]] = {
  # What the tests run: tiny records.
  "smoke": {"image_size": 96, "variants": 2, "target_shard_mb": 4},
  # What `make demo` runs: smoke's sizes, click disks (RITM's encoding, far
  # better than distance maps at few clicks), a quarter of the variants
  # with the evaluation protocol's clicks.
  "demo": {
    "image_size": 96,
    "variants": 2,
    "target_shard_mb": 4,
    "click_encoding": "disks",
    "clicks": {"strategies": [1, 2, 3, 4]},
  },
  # Real photographs on 2 CPU cores (`--preset real` on both commands): click
  # disks, the previous mask as an input, the protocol's clicks among the
  # variants, 1 to 24 positive clicks drawn as RITM does (the full recipe on
  # COCO-MVal, 800 steps: NoC@85 9.18 against 10.08 with 1 to 5 uniform).
  "real": {
    "image_size": 128,
    "variants": 2,
    "click_encoding": "disks",
    "previous_mask": True,
    "clicks": {"strategies": [1, 2, 3, 4], "max_positive": 24, "prob_gamma": 0.8},
  },
  # The field's scale (RITM's recipe) on a GPU: 320 px crops, objects of
  # 1000 source pixels or more, 1 to 24 positive clicks drawn as RITM does.
  "field": {
    "image_size": 320,
    "variants": 4,
    "click_encoding": "disks",
    "previous_mask": True,
    "min_object_area": 1000,
    "clicks": {"strategies": [1, 2, 3, 4], "max_positive": 24, "prob_gamma": 0.8},
  },
  "default": {},
}


@dataclasses.dataclass(frozen=True)
class PrepConfig:
  """A preprocessing run: the settings every task has, and the task's own (`options`).

  Attributes:
    input: root of the input data (local path or gs://), or a manifest file.
    task: a registered task ("segmentation", "classification", ...).
    layout: a registered input layout (`beam_prep.layouts`), or "auto".
    allow_outside_root: let manifest paths leave the manifest's folder (coco:
      file_names leave the image root).
    image_root: coco: the folder the images' file_names are relative to
      (default: the JSON file's folder).
    output: output directory (local path or gs://).
    image_size: records hold image_size x image_size images (what of the
      image they show is the task's: segmentation's `crop`).
    eval_percent: share of images (by hash of the image id) in the eval split;
      100 makes an evaluation-only output (every input eval, whatever a
      layout's lists say; no tf.Transform analysis).
    target_shard_mb: size each record file aims at, in MB; the file count
      follows from the data (measured in the job), and no file exceeds twice
      this plus one record.
    compression: "" for none or "gzip".
    max_pixels: images declaring more pixels are rejected (decompression bombs).
    max_error_fraction: the job fails (exits non-zero and writes no
      `_SUCCESS`) when more than this fraction of its images, objects or
      examples failed.
    ops: extra ops appended to the chain after the built-in ones (a chain
      string, see `beam_prep.ops.registry`).
    ops_module: module (or comma-separated modules) to import first, so that
      its registered ops exist.
    preprocessing_fn: "module:function", a tf.Transform preprocessing_fn to
      use instead of the one generated from the declared features.
    transform_from: a beam-prep output, or a `beam-train fit` model dir (the
      output it trained on), whose tf.Transform output this run's records
      are read with, as it is: no analysis. The records must have its raw
      schema. A model warm-started on them sees its inputs normalized as
      before (the data engine's rounds).
    add: add to `output`, a complete beam-prep output, the inputs whose
      images it does not hold yet (by digest, `beam_prep.image_index`) as a
      new shard set, read with its tf.Transform output (no analysis); the
      manifest accounts for every set. The records must have its raw schema.
      `overwrite` and `transform_from` do not apply (the command line
      refuses them beside --add; a config file's are set aside).
    overwrite: replace a non-empty output directory.
    progress_seconds: interval of the job's progress lines (0: none); they
      never change the output.
    options: the task's own settings (an instance of its `Task.options`
      dataclass, e.g. `beam_prep.tasks.segmentation.SegmentationOptions`;
      None: its defaults). In a dict (`from_dict`, `to_dict`, config.json,
      config files) they sit beside the others, flat.
  """

  input: str = option(
    "",
    "data root (local or gs://), or the file a file-based layout reads (manifest, COCO JSON)",
    required=True,
  )
  output: str = option("", "output directory (local or gs://)", required=True)
  task: str = "segmentation"
  layout: str = option("auto", "input layout (see below)")
  allow_outside_root: bool = option(
    False, "let paths listed in a manifest or annotation file leave its folder (or the image root)"
  )
  image_root: str = option(
    "",
    "coco layout: folder the images' file_names are relative to ('': the JSON file's folder)",
    show_default=False,
  )
  image_size: int = option(128, "records hold N x N images")
  eval_percent: int = option(
    20,
    "share of images in the eval split (by a hash of the image "
    "id); 100: an evaluation-only output (a benchmark set: every "
    "image evaluated, no transform analysed)",
  )
  target_shard_mb: float = option(
    200.0, "size each record file aims at, in MB; the number of files follows from the data"
  )
  compression: str = option(
    "",
    "record compression (docs/performance.md: 'Record layout, measured')",
    choices=("none", "gzip"),
    none="",
  )
  max_pixels: int = option(
    keys.MAX_PIXELS, "reject images declaring more pixels (decompression bombs)"
  )
  max_error_fraction: float = option(
    0.5,
    "the job fails (exit 1, no _SUCCESS) when more than "
    "this fraction of its images, objects or examples failed",
  )
  ops: str = option("", "extra op chain applied after the built-in ones")
  ops_module: str = option(
    "",
    "module (or comma-separated modules) to import first; it "
    "registers your own ops (and input layouts)",
  )
  preprocessing_fn: str = option(
    "",
    "a tf.Transform preprocessing_fn to use instead of the one "
    "generated from the declared features",
    metavar="MODULE:FUNCTION",
  )
  transform_from: str = option(
    "",
    "read the records with the tf.Transform output of this "
    "beam-prep output or beam-train fit model dir, as it is (no "
    "analysis): fine-tuning data normalized as before",
    metavar="PREP_OUTPUT|MODEL_DIR",
  )
  add: bool = option(
    False,
    "add to OUTPUT, a beam-prep output, the images it does not hold yet (by their "
    "bytes' digest) as a new shard set, read with its own transform (no analysis)",
  )
  overwrite: bool = option(False, "replace a non-empty output directory")
  progress_seconds: float = option(
    30.0, "a progress line every N seconds while the job runs (0: none)"
  )
  options: Any = None
  PRESETS: ClassVar[Dict[str, Dict[str, Any]]] = PREP_PRESETS

  def __post_init__(self):
    from beam_prep import layouts, tasks  # pylint: disable=g-import-not-at-top

    if self.add:  # The output is kept, with its transform (an output's config.json has both).
      object.__setattr__(self, "overwrite", False)
      object.__setattr__(self, "transform_from", "")
    task = tasks.get_task(self.task)
    object.__setattr__(self, "options", _task_options(task, self.options))
    if self.layout != layouts.AUTO:
      layout = layouts.get_layout(self.layout, task.labels)
      if self.image_root and not layout.takes_image_root:
        raise ValueError(
          f"--image-root is for layouts that list image paths in an "
          f"annotation file, not {self.layout!r}"
        )
    checks = [
      (self.input and self.output, "--input and --output are required"),
      (self.image_size >= 16, f"--image-size must be at least 16, got {self.image_size}"),
      (
        0 <= self.eval_percent <= 100,
        f"--eval-percent must be in [0, 100], got {self.eval_percent}",
      ),
      (self.progress_seconds >= 0, f"--progress-seconds must be >= 0, got {self.progress_seconds}"),
      (self.target_shard_mb > 0, f"--target-shard-mb must be positive, got {self.target_shard_mb}"),
      (
        self.compression in ("", "gzip"),
        f"--compression must be gzip or none, got {self.compression!r}",
      ),
      (
        0.0 <= self.max_error_fraction <= 1.0,
        f"--max-error-fraction must be in [0, 1], got {self.max_error_fraction}",
      ),
      (
        not self.preprocessing_fn or ":" in self.preprocessing_fn,
        f"--preprocessing-fn is module:function, got {self.preprocessing_fn!r}",
      ),
    ]
    for ok, message in checks:
      if not ok:
        raise ValueError(message)

  @property
  def eval_only(self) -> bool:
    """Every input is evaluated; nothing is trained on, so nothing is analysed."""
    return self.eval_percent >= 100

  @property
  def task_object(self):
    from beam_prep import tasks  # pylint: disable=g-import-not-at-top

    return tasks.get_task(self.task)

  @property
  def stages(self):
    """The task's `Stage`s of this run (label, op chain, level)."""
    return self.task_object.stages(self)

  @property
  def chain(self) -> str:
    """The whole op chain this run applies."""
    return "|".join(s.chain for s in self.stages if s.chain)

  @property
  def read_options(self):
    """What the input layout reads (`beam_prep.layouts.ReadOptions`)."""
    from beam_prep.layouts import ReadOptions  # pylint: disable=g-import-not-at-top

    return ReadOptions(self.input, self.image_root, self.allow_outside_root)

  def features(self):
    """The run's `FeatureTable`: what the records hold, from the chain's declarations.

    Where the stages say a unit fans out into variants (a stage at the object
    level), the features declared last by that stage or a later one differ
    per variant and are stacked in the unit's record. The ops module must
    have been imported (`registry.import_ops_modules`).
    """
    from beam_prep.features import FeatureTable  # pylint: disable=g-import-not-at-top
    from beam_prep.layouts.registry import READ_FEATURES  # pylint: disable=g-import-not-at-top
    from beam_prep.ops import registry  # pylint: disable=g-import-not-at-top
    from beam_prep.tasks.registry import INPUT, OBJECT  # pylint: disable=g-import-not-at-top

    stages = [s for s in self.stages if s.chain]
    fans_out = any(s.level == OBJECT for s in stages)
    declarations = [
      (op, produces, fans_out and s.level != INPUT)
      for s in stages
      for op, produces in registry.declarations(registry.parse_chain(s.chain))
    ]
    # The records' size is what the chain's geometric op makes (its serving
    # side says it); a chain without one keeps --image-size.
    size = registry.image_size(registry.parse_chain(self.chain))
    return FeatureTable.from_declarations(
      declarations,
      size or (self.image_size, self.image_size),
      self.task,
      chain=self.chain,
      read=READ_FEATURES,
      ops_module=self.ops_module,
      variants=self.task_object.examples_per_unit(self),
    )

  def to_dict(self) -> Dict[str, Any]:
    """Every setting, the task's own beside the others, and the chain."""
    d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "options"}
    d.update(dataclasses.asdict(self.options))
    d["chain"] = self.chain
    return d

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), indent=2, sort_keys=True)

  @classmethod
  def from_dict(cls, d: Dict[str, Any]) -> "PrepConfig":
    """Builds a config from a plain dict, the task's settings among the others
    (unknown keys are an error naming the known ones)."""
    from beam_prep import tasks  # pylint: disable=g-import-not-at-top

    d = dict(d)
    d.pop("chain", None)
    own = {f.name for f in dataclasses.fields(tasks.get_task(d.get("task", cls.task)).options)}
    options = {k: d.pop(k) for k in list(d) if k in own}
    names = {f.name for f in dataclasses.fields(cls)} - {"options"}
    unknown = set(d) - names
    if unknown:
      raise ValueError(f"unknown config keys: {sorted(unknown)}; known: {sorted(names | own)}")
    return cls(**d, options=options)


def _task_options(task, options):
  """`options` as an instance of `task.options` (None: its defaults; a dict: its settings)."""
  if options is None:
    return task.options()
  if isinstance(options, dict):
    return task.options.from_dict(options)
  if not isinstance(options, task.options):
    raise ValueError(
      f"options of task {task.name!r} must be a {task.options.__name__}, got "
      f"{type(options).__name__}"
    )
  return options


@dataclasses.dataclass(frozen=True)
class PreviewConfig(CommandConfig):
  """`beam-prep preview`: a picture of what the records hold."""

  records: str = option("", "a records/ directory, or a pipeline output holding one", required=True)
  output: str = option("", "PNG file to write", required=True)
  count: int = option(6, "examples to draw")

  def __post_init__(self):
    if self.count < 1:
      raise ValueError(f"--count must be at least 1, got {self.count}")


@dataclasses.dataclass(frozen=True)
class SampleDataConfig(CommandConfig):
  """`beam-prep sample-data`: a deterministic sample data set (images/ + masks/)."""

  output: str = option("", "directory to write", required=True)
  count: int = option(32, "number of scenes")
  seed: int = option(0, "seed")
  width: int = option(160, "scene width in pixels")
  height: int = option(128, "scene height in pixels")
