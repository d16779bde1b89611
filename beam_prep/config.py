"""`PrepConfig`: everything a preprocessing run needs, in one frozen object."""

import dataclasses
import json
from typing import Any, Dict, Optional

from beam_prep import keys


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


@dataclasses.dataclass(frozen=True)
class PrepConfig:
  """A segmentation preprocessing run.

  Attributes:
    input: root of the input data (local path or gs://), or a manifest file.
    task: "segmentation" (objects, clicks, distance maps) or "classification".
    layout: input layout, see `beam_prep.readers` ("auto" guesses).
    allow_outside_root: let manifest paths leave the manifest's folder.
    output: output directory (local path or gs://).
    image_size: records hold images resized to image_size x image_size.
    variants: independent click samplings per object.
    seed: seed of the click sampling.
    eval_percent: share of images (by hash of the image id) in the eval split.
    num_shards: TFRecord shards per split.
    compression: "" for none or "gzip".
    max_pixels: images declaring more pixels are rejected (decompression bombs).
    max_error_fraction: exit non-zero when more than this fraction of inputs
      fails (after everything is written).
    ops: extra ops appended to the chain after the built-in ones (a chain
      string, see `beam_prep.ops.registry`).
    ops_module: module to import first, so that its registered ops exist.
    overwrite: replace a non-empty output directory.
    clicks: click simulation settings.
  """
  input: str
  output: str
  task: str = "segmentation"
  layout: str = "auto"
  allow_outside_root: bool = False
  image_size: int = 128
  variants: int = 2
  seed: int = 0
  eval_percent: int = 20
  num_shards: int = 2
  compression: str = ""
  max_pixels: int = 64_000_000
  max_error_fraction: float = 1.0
  ops: str = ""
  ops_module: str = ""
  overwrite: bool = False
  clicks: ClickConfig = ClickConfig()

  def __post_init__(self):
    if self.task not in ("segmentation", "classification"):
      raise ValueError(f"task must be segmentation or classification, got {self.task!r}")
    from beam_prep.readers import LAYOUTS  # pylint: disable=g-import-not-at-top
    if self.layout not in LAYOUTS:
      raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
    if self.image_size < 16:
      raise ValueError(f"image_size must be at least 16, got {self.image_size}")
    if self.variants < 1:
      raise ValueError(f"variants must be at least 1, got {self.variants}")
    if not 0 <= self.eval_percent < 100:
      raise ValueError(f"eval_percent must be in [0, 100), got {self.eval_percent}")
    if self.num_shards < 1:
      raise ValueError(f"num_shards must be at least 1, got {self.num_shards}")
    if self.compression not in ("", "gzip"):
      raise ValueError(f"compression must be '' or 'gzip', got {self.compression!r}")
    if not 0.0 <= self.max_error_fraction <= 1.0:
      raise ValueError(f"max_error_fraction must be in [0, 1], got {self.max_error_fraction}")

  @property
  def decode_chain(self) -> str:
    """Ops run once per image: decode, resize (and split into objects)."""
    if self.task == "classification":
      return f"decode(max_pixels={self.max_pixels}, require_mask=False)|resize({self.image_size})"
    return f"decode(max_pixels={self.max_pixels})|resize({self.image_size})|split_objects"

  @property
  def clicks_chain(self) -> str:
    """Ops run once per object: sample click variants."""
    c = self.clicks
    return (f"sample_clicks(variants={self.variants}, seed={self.seed}, "
            f"min_positive={c.min_positive}, max_positive={c.max_positive}, "
            f"negatives={tuple(c.negatives)!r}, d={c.d}, d_margin={c.d_margin}, "
            f"d_step={c.d_step}, strategies={tuple(c.strategies)!r}, flip={c.flip})")

  @property
  def record_suffix(self) -> str:
    return keys.RECORD_SUFFIX + (".gz" if self.compression == "gzip" else "")

  @property
  def chain(self) -> str:
    """The whole op chain this run applies, for the record."""
    if self.task == "classification":
      return "|".join(filter(None, [self.decode_chain, self.ops]))
    return "|".join(filter(None, [self.decode_chain, self.clicks_chain, "distance_maps",
                                  self.ops]))

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


PRESETS: Dict[str, Dict[str, Any]] = {
    # Tiny and quick: what the demo and the tests run.
    "smoke": {"image_size": 96, "variants": 2, "num_shards": 2},
    "default": {},
}


def preset(name: Optional[str]) -> Dict[str, Any]:
  if not name:
    return {}
  try:
    return dict(PRESETS[name])
  except KeyError:
    raise ValueError(f"unknown preset {name!r}; choose from {sorted(PRESETS)}") from None
