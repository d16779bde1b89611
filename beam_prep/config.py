"""`PrepConfig`: everything a preprocessing run needs, in one frozen object."""

import dataclasses
import json
from typing import Any, Dict, Optional, Sequence


def option(default: Any, help: str, choices: Optional[Sequence[str]] = None,  # pylint: disable=redefined-builtin
           metavar: str = "", none: Any = None, required: bool = False,
           show_default: bool = True):
  """A config field that is also a command-line option (`beam_prep.kit` makes the flag).

  Args:
    default: the field's default.
    help: the option's help text.
    choices: the values the flag accepts.
    metavar: the flag's value name in --help.
    none: the field's value for a flag value "none" (a choice that means off).
    required: the command needs it (it has no useful default).
    show_default: add "(default: X)" to the help.
  """
  return dataclasses.field(default=default, metadata={
      "help": help, "choices": tuple(choices) if choices else None, "metavar": metavar or None,
      "none": none, "required": required, "show_default": show_default})


def check_known(cls, d: Dict[str, Any], what: str = "config keys") -> None:
  """Raises ValueError naming the keys of `d` that are not fields of dataclass `cls`."""
  names = {f.name for f in dataclasses.fields(cls)}
  unknown = set(d) - names
  if unknown:
    raise ValueError(f"unknown {what}: {sorted(unknown)}; known: {sorted(names)}")


class CommandConfig:
  """Base of a command's frozen config dataclass: built from a plain dict
  (a config file, the resolved flags) by `from_dict`, unknown keys refused,
  lists (repeated flags, JSON arrays) made tuples."""

  @classmethod
  def from_dict(cls, d: Dict[str, Any]):
    check_known(cls, d, f"{cls.__name__} settings")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


@dataclasses.dataclass(frozen=True)
class ClickConfig:
  """Click simulation (Xu et al. 2016); defaults as public reimplementations."""
  min_positive: int = 1
  max_positive: int = 5
  negatives: tuple = (10, 5, 10)
  d: float = 40.0
  d_margin: float = 5.0
  d_step: float = 10.0
  strategies: tuple = (1, 2, 3)
  flip: bool = False
  disk_radius: float = 5.0
  protocol_clicks: int = 10


@dataclasses.dataclass(frozen=True)
class PrepConfig:
  """A segmentation preprocessing run.

  Attributes:
    input: root of the input data (local path or gs://), or a manifest file.
    task: a registered task ("segmentation", "classification", ...).
    layout: a registered input layout (`beam_prep.layouts`), or "auto".
    allow_outside_root: let manifest paths leave the manifest's folder (coco:
      file_names leave the image root).
    image_root: coco: the folder the images' file_names are relative to
      (default: the JSON file's folder).
    output: output directory (local path or gs://).
    image_size: records hold image_size x image_size images: with `crop`
      "object", one object's crop (`beam_prep.ops.crop`); with "none", the
      whole image with its aspect ratio kept (the long side fills it; the
      rest is padding: black pixels, ignore in the label).
    crop: segmentation: "object" (object-centred crops) or "none".
    crop_context: segmentation, crop "object": the box is (1 + this) times
      the object's long side.
    crop_jitter: segmentation, crop "object": each box grows by a random
      factor in [1, 1 + this] and moves at random, the object inside.
    crop_min_size: segmentation, crop "object": the least side of a crop box,
      in source pixels.
    min_object_area: segmentation: objects covering fewer pixels at the
      source resolution (before any resize) fail with reason
      `object_below_min_area`; 0 keeps every object a click can be placed
      on at the records' size.
    variants: independent click samplings per object.
    seed: seed of the click sampling.
    eval_percent: share of images (by hash of the image id) in the eval split;
      100 makes an evaluation-only output (every input eval, whatever a
      layout's lists say; no tf.Transform analysis).
    target_shard_mb: size each record file aims at, in MB; the file count
      follows from the data (measured in the job), and no file exceeds twice
      this plus one record.
    compression: "" for none or "gzip".
    click_encoding: segmentation: "distance" (Xu et al. 2016 distance maps),
      "disks" (RITM's binary disks) or "both".
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
    overwrite: replace a non-empty output directory.
    progress_seconds: interval of the job's progress lines (0: none); they
      never change the output.
    clicks: click simulation settings.
  """
  input: str = option("", "data root (local or gs://), or the file a file-based layout reads "
                      "(manifest, COCO JSON)", required=True)
  output: str = option("", "output directory (local or gs://)", required=True)
  task: str = "segmentation"
  layout: str = option("auto", "input layout (see below)")
  allow_outside_root: bool = option(False, "let paths listed in a manifest or annotation file "
                                    "leave its folder (or the image root)")
  image_root: str = option("", "coco layout: folder the images' file_names are relative to "
                           "('': the JSON file's folder)", show_default=False)
  image_size: int = option(128, "records hold N x N images: object-centred crops (--crop "
                           "object), or the whole image with its aspect ratio kept (--crop none)")
  crop: str = option("object", "segmentation: 'object': a record shows its object cut from the "
                     "image at its own resolution with context around it, resized to N x N; "
                     "'none': the whole image fitted into N x N (long side N, the rest padded)",
                     choices=("object", "none"), none="none")
  crop_context: float = option(0.4, "segmentation, --crop object: context around the object, "
                               "as a share of its long side (0.4: the box is 1.4x the object's)")
  crop_jitter: float = option(1.0, "segmentation, --crop object: each object's box grows by a "
                              "random factor up to 1 + this and moves at random (seeded), so "
                              "the model learns objects at several scales and places")
  crop_min_size: int = option(32, "segmentation, --crop object: a crop box is at least N source "
                              "pixels wide")
  min_object_area: int = option(0, "objects covering fewer pixels than this at the source "
                                "resolution are dead letters (object_below_min_area); 0 keeps "
                                "every object a click can be placed on")
  variants: int = option(2, "click samplings per object")
  seed: int = option(0, "seed of the click sampling")
  eval_percent: int = option(20, "share of images in the eval split (by a hash of the image "
                             "id); 100: an evaluation-only output (a benchmark set: every "
                             "image evaluated, no transform analysed)")
  target_shard_mb: float = option(200.0, "size each record file aims at, in MB; the number of "
                                  "files follows from the data")
  compression: str = option("", "record compression (README: 'Record layout, measured')",
                            choices=("none", "gzip"), none="")
  click_encoding: str = option("distance", "how clicks reach the model: distance maps (Xu et al. "
                               "2016), binary disks (RITM), or both",
                               choices=("distance", "disks", "both"))
  max_pixels: int = option(64_000_000, "reject images declaring more pixels (decompression "
                           "bombs)")
  max_error_fraction: float = option(0.5, "the job fails (exit 1, no _SUCCESS) when more than "
                                     "this fraction of its images, objects or examples failed")
  ops: str = option("", "extra op chain applied after the built-in ones")
  ops_module: str = option("", "module (or comma-separated modules) to import first; it "
                           "registers your own ops (and input layouts)")
  preprocessing_fn: str = option("", "a tf.Transform preprocessing_fn to use instead of the one "
                                 "generated from the declared features", metavar="MODULE:FUNCTION")
  overwrite: bool = option(False, "replace a non-empty output directory")
  progress_seconds: float = option(30.0, "a progress line every N seconds while the job runs "
                                   "(0: none)")
  clicks: ClickConfig = ClickConfig()

  def __post_init__(self):
    from beam_prep import layouts, tasks  # pylint: disable=g-import-not-at-top
    task = tasks.get_task(self.task)
    if self.layout != layouts.AUTO:
      layout = layouts.get_layout(self.layout, task.labels)
      if self.image_root and not layout.takes_image_root:
        raise ValueError(f"--image-root is for layouts that list image paths in an "
                         f"annotation file, not {self.layout!r}")
    checks = [
        (self.input and self.output, "--input and --output are required"),
        (self.image_size >= 16, f"--image-size must be at least 16, got {self.image_size}"),
        (self.variants >= 1, f"--variants must be at least 1, got {self.variants}"),
        (self.crop in ("object", "none"), f"--crop must be object or none, got {self.crop!r}"),
        (self.crop_context >= 0, f"--crop-context must be >= 0, got {self.crop_context}"),
        (self.crop_jitter >= 0, f"--crop-jitter must be >= 0, got {self.crop_jitter}"),
        (self.crop_min_size >= 1, f"--crop-min-size must be at least 1, got "
         f"{self.crop_min_size}"),
        (self.min_object_area >= 0,
         f"--min-object-area must be >= 0, got {self.min_object_area}"),
        (0 <= self.eval_percent <= 100,
         f"--eval-percent must be in [0, 100], got {self.eval_percent}"),
        (self.progress_seconds >= 0,
         f"--progress-seconds must be >= 0, got {self.progress_seconds}"),
        (self.target_shard_mb > 0,
         f"--target-shard-mb must be positive, got {self.target_shard_mb}"),
        (self.compression in ("", "gzip"),
         f"--compression must be gzip or none, got {self.compression!r}"),
        (0.0 <= self.max_error_fraction <= 1.0,
         f"--max-error-fraction must be in [0, 1], got {self.max_error_fraction}"),
        (not self.preprocessing_fn or ":" in self.preprocessing_fn,
         f"--preprocessing-fn is module:function, got {self.preprocessing_fn!r}"),
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
    declarations = [(op, produces, fans_out and s.level != INPUT)
                    for s in stages
                    for op, produces in registry.declarations(registry.parse_chain(s.chain))]
    return FeatureTable.from_declarations(
        declarations, (self.image_size, self.image_size), self.task, chain=self.chain,
        read=READ_FEATURES, ops_module=self.ops_module,
        variants=self.task_object.examples_per_unit(self))

  def to_dict(self) -> Dict[str, Any]:
    d = dataclasses.asdict(self)
    d["chain"] = self.chain
    return d

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), indent=2, sort_keys=True)

  @classmethod
  def from_dict(cls, d: Dict[str, Any]) -> "PrepConfig":
    """Builds a config from a plain dict (unknown keys are an error)."""
    d = dict(d)
    d.pop("chain", None)
    clicks = d.pop("clicks", None)
    check_known(cls, d)
    if clicks is not None:
      check_known(ClickConfig, clicks, "click config keys")
      clicks = ClickConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in clicks.items()})
      d["clicks"] = clicks
    return cls(**d)


@dataclasses.dataclass(frozen=True)
class PreviewConfig(CommandConfig):
  """`beam-prep preview`: a picture of what the records hold."""
  records: str = option("", "a records/ directory, or a pipeline output holding one",
                        required=True)
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
