"""Interactive segmentation: objects of a scene, click variants, click encodings.

An image fans out into its objects (`split_objects`), each object into
`variants` click samplings (`sample_clicks`), each variant gets its click
encodings (distance maps, disks) and the user's ops. The label is the
object's mask (1 object, 0 background, 255 ignore).
"""

import argparse
import dataclasses
from typing import Any, Dict, List

import beam_prep.ops  # noqa: F401  pylint: disable=unused-import  (the ops whose defaults these are)
from beam_prep.kit import CommandConfig, check_known, option
from beam_prep.ops.registry import default_arg, op_call
from beam_prep.tasks.plan import decode_op, join, resize_chain
from beam_prep.tasks.registry import EXAMPLE, INPUT, OBJECT, Stage, Task, register_task

CLICK_ENCODINGS = ("distance", "disks", "both")
CROPS = ("object", "none")


def _clicks(arg: str):
  return default_arg("sample_clicks", arg)


@dataclasses.dataclass(frozen=True)
class ClickConfig:
  """Click simulation (Xu et al. 2016): the settings of `sample_clicks` (its
  defaults), `flip_variants` and `click_disks`."""

  min_positive: int = _clicks("min_positive")
  max_positive: int = _clicks("max_positive")
  negatives: tuple = _clicks("negatives")
  d: float = _clicks("d")
  d_margin: float = _clicks("d_margin")
  d_step: float = _clicks("d_step")
  strategies: tuple = _clicks("strategies")
  flip: bool = False
  disk_radius: float = default_arg("click_disks", "radius")
  protocol_clicks: int = _clicks("protocol_clicks")
  prob_gamma: float = _clicks("prob_gamma")
  protocol_share: float = _clicks("protocol_share")

  @classmethod
  def from_dict(cls, d: Dict[str, Any]) -> "ClickConfig":
    check_known(cls, d, "click config keys")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


@dataclasses.dataclass(frozen=True)
class SegmentationOptions(CommandConfig):
  """The settings only segmentation has: objects, crops, click variants and encodings.

  Each option field is also a `beam-prep segmentation` flag; `clicks` is set
  by a config file, a preset, `--flip-variants` and `--disk-radius`.
  """

  crop: str = option(
    "object",
    "'object': a record shows its object cut from the image at "
    "its own resolution with context around it, resized to N x N; 'none': the "
    "whole image fitted into N x N (long side N, the rest padded)",
    choices=CROPS,
    none="none",
  )
  crop_context: float = option(
    default_arg("crop_objects", "context"),
    "--crop object: context around the object, as a share of its "
    "long side (0.4: the box is 1.4x the object's)",
  )
  crop_jitter: float = option(
    1.0,
    "--crop object: each object's box grows by a random factor "
    "up to 1 + this and moves at random (seeded), so the model "
    "learns objects at several scales and places",
  )
  crop_min_size: int = option(
    default_arg("crop_objects", "min_side"),
    "--crop object: a crop box is at least N source pixels wide",
  )
  min_object_area: int = option(
    0,
    "objects covering fewer pixels than this at the source "
    "resolution are dead letters (object_below_min_area); 0 keeps "
    "every object a click can be placed on",
  )
  variants: int = option(2, "click samplings per object")
  seed: int = option(_clicks("seed"), "seed of the crops and the click sampling")
  click_encoding: str = option(
    "distance",
    "how clicks reach the model: distance maps (Xu et al. 2016), binary disks (RITM), or both",
    choices=CLICK_ENCODINGS,
  )
  previous_mask: bool = option(
    False,
    "the previous prediction is a model input (mask "
    "guidance, RITM): zeros in the records, the model's own "
    "prediction in the training step (beam-train fit --mask-rounds) "
    "and at serving",
  )
  clicks: ClickConfig = ClickConfig()

  def __post_init__(self):
    checks = [
      (self.variants >= 1, f"--variants must be at least 1, got {self.variants}"),
      (self.crop in CROPS, f"--crop must be object or none, got {self.crop!r}"),
      (self.crop_context >= 0, f"--crop-context must be >= 0, got {self.crop_context}"),
      (self.crop_jitter >= 0, f"--crop-jitter must be >= 0, got {self.crop_jitter}"),
      (self.crop_min_size >= 1, f"--crop-min-size must be at least 1, got {self.crop_min_size}"),
      (self.min_object_area >= 0, f"--min-object-area must be >= 0, got {self.min_object_area}"),
      (
        self.click_encoding in CLICK_ENCODINGS,
        f"--click-encoding must be one of "
        f"{', '.join(CLICK_ENCODINGS)}, got {self.click_encoding!r}",
      ),
    ]
    for ok, message in checks:
      if not ok:
        raise ValueError(message)

  @classmethod
  def from_dict(cls, d: Dict[str, Any]) -> "SegmentationOptions":
    d = dict(d)
    clicks = d.pop("clicks", None)
    options = super().from_dict(d)
    if clicks is None:
      return options
    if isinstance(clicks, dict):
      clicks = ClickConfig.from_dict(clicks)
    return dataclasses.replace(options, clicks=clicks)


def clicks_chain(variants: int, seed: int, clicks) -> str:
  """sample_clicks with every click setting of a `ClickConfig`."""
  return op_call(
    "sample_clicks",
    variants=variants,
    seed=seed,
    min_positive=clicks.min_positive,
    max_positive=clicks.max_positive,
    negatives=tuple(clicks.negatives),
    d=clicks.d,
    d_margin=clicks.d_margin,
    d_step=clicks.d_step,
    strategies=tuple(clicks.strategies),
    protocol_clicks=clicks.protocol_clicks,
    # Named only when set, so the chains of records made before stay as they were.
    **({"prob_gamma": clicks.prob_gamma} if clicks.prob_gamma else {}),
    **({"protocol_share": clicks.protocol_share} if clicks.protocol_share else {}),
  )


def encoding_chain(click_encoding: str, disk_radius: float) -> str:
  """The click encodings named by `--click-encoding`."""
  ops = []
  if click_encoding in ("distance", "both"):
    ops.append("distance_maps")
  if click_encoding in ("disks", "both"):
    ops.append(op_call("click_disks", radius=disk_radius))
  return "|".join(ops)


def objects_chain(image_size: int, o: SegmentationOptions) -> str:
  """An image into its objects: object-centred crops (`--crop object`), or the
  whole image resized and split (`--crop none`); measured at the source first
  when `--min-object-area` is given."""
  areas = o.min_object_area > 0
  if o.crop == "none":
    return resize_chain(image_size, object_areas=areas)
  return join(
    "object_areas" if areas else "",
    op_call(
      "crop_objects",
      image_size,
      context=o.crop_context,
      min_side=o.crop_min_size,
      jitter=o.crop_jitter,
      seed=o.seed,
    ),
  )


@register_task
class Segmentation(Task):
  name = "segmentation"
  summary = "click-variant records for interactive segmentation"
  labels = "instances"
  options = SegmentationOptions

  def stages(self, config) -> List[Stage]:
    """Decode (per image; kept at its own size for eval images), split into
    objects (`objects_chain`), sample clicks (per object), flip and encode
    (per variant).

    With `--min-object-area`, objects are measured before the resize and
    those under it fail first thing at the object level.
    """
    o = config.options
    min_area = o.min_object_area
    return [
      Stage("DecodeExamples", decode_op(config.max_pixels), INPUT, source=True),
      Stage("SplitObjects", objects_chain(config.image_size, o), INPUT),
      Stage(
        "SampleClicks",
        join(
          op_call("require_min_area", min_area) if min_area else "",
          clicks_chain(o.variants, o.seed, o.clicks),
        ),
        OBJECT,
      ),
      Stage(
        "EncodeClicks",
        join(
          "flip_variants" if o.clicks.flip else "",
          encoding_chain(o.click_encoding, o.clicks.disk_radius),
          "prev_mask" if o.previous_mask else "",
          config.ops,
        ),
        EXAMPLE,
      ),
    ]

  def examples_per_unit(self, config) -> int:
    return config.options.variants

  def add_arguments(self, parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
      "--flip-variants",
      dest="flip_variants",
      action="store_true",
      default=None,
      help="mirror every odd variant left-right",
    )
    parser.add_argument(
      "--disk-radius",
      type=float,
      dest="disk_radius",
      help=f"radius of the click disks in pixels (default: {ClickConfig.disk_radius})",
    )

  def config_fields(self, args) -> Dict[str, object]:
    clicks = {
      "flip": getattr(args, "flip_variants", None),
      "disk_radius": getattr(args, "disk_radius", None),
    }
    return {"clicks": {k: v for k, v in clicks.items() if v is not None} or None}
