"""Interactive segmentation: objects of a scene, click variants, click encodings.

An image fans out into its objects (`split_objects`), each object into
`variants` click samplings (`sample_clicks`), each variant gets its click
encodings (distance maps, disks) and the user's ops. The label is the
object's mask (1 object, 0 background, 255 ignore).
"""

import argparse
from typing import Dict, List

from beam_prep.ops.registry import op_call
from beam_prep.tasks.plan import decode_op, join, resize_chain
from beam_prep.tasks.registry import EXAMPLE, INPUT, OBJECT, Stage, Task, register_task

CLICK_ENCODINGS = ("distance", "disks", "both")


def clicks_chain(variants: int, seed: int, clicks) -> str:
  """sample_clicks with every click setting of a `ClickConfig`."""
  return op_call("sample_clicks", variants=variants, seed=seed,
                 min_positive=clicks.min_positive, max_positive=clicks.max_positive,
                 negatives=tuple(clicks.negatives), d=clicks.d, d_margin=clicks.d_margin,
                 d_step=clicks.d_step, strategies=tuple(clicks.strategies),
                 protocol_clicks=clicks.protocol_clicks)


def encoding_chain(click_encoding: str, disk_radius: float = 5) -> str:
  """The click encodings named by `--click-encoding`."""
  if click_encoding not in CLICK_ENCODINGS:
    raise ValueError(f"--click-encoding must be one of {', '.join(CLICK_ENCODINGS)}, got "
                     f"{click_encoding!r}")
  ops = []
  if click_encoding in ("distance", "both"):
    ops.append("distance_maps")
  if click_encoding in ("disks", "both"):
    ops.append(op_call("click_disks", radius=disk_radius))
  return "|".join(ops)


def objects_chain(config) -> str:
  """An image into its objects: object-centred crops (`--crop object`), or the
  whole image resized and split (`--crop none`); measured at the source first
  when `--min-object-area` is given."""
  areas = config.min_object_area > 0
  if config.crop == "none":
    return resize_chain(config.image_size, object_areas=areas)
  return join("object_areas" if areas else "",
              op_call("crop_objects", config.image_size, context=config.crop_context,
                      min_side=config.crop_min_size, jitter=config.crop_jitter,
                      seed=config.seed))


@register_task
class Segmentation(Task):
  name = "segmentation"
  summary = "click-variant records for interactive segmentation"
  labels = "instances"
  trainer = "train.tasks:SegmentationTask"
  own_fields = ("variants", "click_encoding", "seed", "min_object_area", "crop", "crop_context",
                "crop_jitter", "crop_min_size")

  def stages(self, config) -> List[Stage]:
    """Decode (per image; kept at its own size for eval images), split into
    objects (`objects_chain`), sample clicks (per object), flip and encode
    (per variant).

    With `--min-object-area`, objects are measured before the resize and
    those under it fail first thing at the object level.
    """
    min_area = config.min_object_area
    return [
        Stage("DecodeExamples", decode_op(config.max_pixels), INPUT, source=True),
        Stage("SplitObjects", objects_chain(config), INPUT),
        Stage("SampleClicks", join(op_call("require_min_area", min_area) if min_area else "",
                                   clicks_chain(config.variants, config.seed, config.clicks)),
              OBJECT),
        Stage("EncodeClicks", join("flip_variants" if config.clicks.flip else "",
                                   encoding_chain(config.click_encoding,
                                                  config.clicks.disk_radius), config.ops),
              EXAMPLE),
    ]

  def examples_per_unit(self, config) -> int:
    return config.variants

  def add_arguments(self, parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--flip-variants", dest="flip_variants", action="store_true",
                        default=None, help="mirror every odd variant left-right")
    parser.add_argument("--disk-radius", type=float, dest="disk_radius",
                        help="radius of the click disks in pixels (default: 5.0)")

  def config_fields(self, args) -> Dict[str, object]:
    clicks = {"flip": getattr(args, "flip_variants", None),
              "disk_radius": getattr(args, "disk_radius", None)}
    return {"clicks": {k: v for k, v in clicks.items() if v is not None} or None}
