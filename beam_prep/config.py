"""`PrepConfig`: everything a preprocessing run needs, in one frozen object."""

import dataclasses
import json
from typing import Any, Dict


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
    task: "segmentation" (objects, clicks, distance maps) or "classification".
    layout: input layout, see `beam_prep.readers` ("auto" guesses).
    allow_outside_root: let manifest paths leave the manifest's folder (coco:
      file_names leave the image root).
    image_root: coco: the folder the images' file_names are relative to
      (default: the JSON file's folder).
    output: output directory (local path or gs://).
    image_size: records hold images resized to image_size x image_size.
    variants: independent click samplings per object.
    seed: seed of the click sampling.
    eval_percent: share of images (by hash of the image id) in the eval split.
    target_shard_mb: size each record file aims at, in MB; the file count
      follows from the data (measured in the job), and no file exceeds twice
      this plus one record.
    compression: "" for none or "gzip".
    click_encoding: segmentation: "distance" (Xu et al. 2016 distance maps),
      "disks" (RITM's binary disks) or "both".
    max_pixels: images declaring more pixels are rejected (decompression bombs).
    max_error_fraction: exit non-zero when more than this fraction of inputs
      fails (after everything is written).
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
  input: str
  output: str
  task: str = "segmentation"
  layout: str = "auto"
  allow_outside_root: bool = False
  image_root: str = ""
  image_size: int = 128
  variants: int = 2
  seed: int = 0
  eval_percent: int = 20
  target_shard_mb: float = 200.0
  compression: str = ""
  click_encoding: str = "distance"
  max_pixels: int = 64_000_000
  max_error_fraction: float = 1.0
  ops: str = ""
  ops_module: str = ""
  preprocessing_fn: str = ""
  overwrite: bool = False
  progress_seconds: float = 30.0
  clicks: ClickConfig = ClickConfig()

  def __post_init__(self):
    from beam_prep import tasks  # pylint: disable=g-import-not-at-top
    from beam_prep.readers import LAYOUTS  # pylint: disable=g-import-not-at-top
    tasks.get(self.task)
    if self.layout not in LAYOUTS:
      raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
    if self.image_root and self.layout not in ("auto", "coco"):
      raise ValueError(f"image_root is for the coco layout, not {self.layout!r}")
    if self.image_size < 16:
      raise ValueError(f"image_size must be at least 16, got {self.image_size}")
    if self.variants < 1:
      raise ValueError(f"variants must be at least 1, got {self.variants}")
    if not 0 <= self.eval_percent < 100:
      raise ValueError(f"eval_percent must be in [0, 100), got {self.eval_percent}")
    if self.progress_seconds < 0:
      raise ValueError(f"progress_seconds must be >= 0, got {self.progress_seconds}")
    if not self.target_shard_mb > 0:
      raise ValueError(f"target_shard_mb must be positive, got {self.target_shard_mb}")
    if self.compression not in ("", "gzip"):
      raise ValueError(f"compression must be '' or 'gzip', got {self.compression!r}")
    if self.click_encoding not in tasks.CLICK_ENCODINGS:
      raise ValueError(f"click_encoding must be one of {tasks.CLICK_ENCODINGS}, got "
                       f"{self.click_encoding!r}")
    if not 0.0 <= self.max_error_fraction <= 1.0:
      raise ValueError(f"max_error_fraction must be in [0, 1], got {self.max_error_fraction}")
    if self.preprocessing_fn and ":" not in self.preprocessing_fn:
      raise ValueError(f"preprocessing_fn is module:function, got {self.preprocessing_fn!r}")

  @property
  def task_object(self):
    from beam_prep import tasks  # pylint: disable=g-import-not-at-top
    return tasks.get(self.task)

  @property
  def stages(self):
    """(Beam label, op chain) of each stage of the run."""
    return self.task_object.stages(self)

  @property
  def chain(self) -> str:
    """The whole op chain this run applies."""
    return "|".join(chain for _, chain in self.stages if chain)

  def features(self):
    """The run's `FeatureTable`: what the records hold, from the chain's declarations.

    The ops module must have been imported (`registry.import_ops_modules`).
    """
    from beam_prep import tasks  # pylint: disable=g-import-not-at-top
    from beam_prep.features import FeatureTable  # pylint: disable=g-import-not-at-top
    return FeatureTable.for_chain(self.chain, (self.image_size, self.image_size), self.task,
                                  read=tasks.READ_FEATURES, ops_module=self.ops_module)

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
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - names
    if unknown:
      raise ValueError(f"unknown config keys: {sorted(unknown)}; known: {sorted(names)}")
    if clicks is not None:
      cnames = {f.name for f in dataclasses.fields(ClickConfig)}
      if set(clicks) - cnames:
        raise ValueError(f"unknown click config keys: {sorted(set(clicks) - cnames)}")
      clicks = ClickConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in clicks.items()})
      d["clicks"] = clicks
    return cls(**d)
