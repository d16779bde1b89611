"""What differs between the preprocessing of segmentation and classification.

A task is one object: it builds the op chains of a run (as text, from the
config), says which stages fail whole images, declares what the reader gives
every record, and turns the declared label feature into the tf.Transform
graph's label outputs. Everything else (record schema, encoder, model inputs)
follows from the ops' declarations (`beam_prep.features`).
"""

from typing import Any, Dict, List, Set, Tuple

from beam_prep import keys
from beam_prep.features import READ_STAGE, Feature, FeatureError, FeatureTable
from beam_prep.ops.registry import op_call, parse_chain

# The reader's `image_id` is kept by every record (tracing, ordering, splits).
READ_FEATURES = {keys.IMAGE_ID: Feature("string", shape=(), role="metadata")}

CLICK_ENCODINGS = ("distance", "disks", "both")


def decode_chain(image_size: int, max_pixels: int, require_mask: bool = True) -> str:
  """decode + resize (+ split into objects when there are masks)."""
  decode = (op_call("decode", max_pixels=max_pixels) if require_mask
            else op_call("decode", max_pixels=max_pixels, require_mask=False))
  ops = [decode, op_call("resize", image_size)]
  if require_mask:
    ops.append("split_objects")
  return "|".join(ops)


def clicks_chain(variants: int, seed: int, clicks) -> str:
  """sample_clicks with every click setting of a `ClickConfig`."""
  return op_call("sample_clicks", variants=variants, seed=seed,
                 min_positive=clicks.min_positive, max_positive=clicks.max_positive,
                 negatives=tuple(clicks.negatives), d=clicks.d, d_margin=clicks.d_margin,
                 d_step=clicks.d_step, strategies=tuple(clicks.strategies), flip=clicks.flip,
                 protocol_clicks=clicks.protocol_clicks)


def encoding_chain(click_encoding: str, disk_radius: float = 5) -> str:
  """The click encodings named by `--click-encoding`."""
  if click_encoding not in CLICK_ENCODINGS:
    raise ValueError(f"click_encoding must be one of {CLICK_ENCODINGS}, got {click_encoding!r}")
  ops = []
  if click_encoding in ("distance", "both"):
    ops.append("distance_maps")
  if click_encoding in ("disks", "both"):
    ops.append(op_call("click_disks", radius=disk_radius))
  return "|".join(ops)


def unit_ops(config) -> Set[str]:
  """The stages that run before an example becomes a unit of the run (an
  object, or for classification a decoded image): read and the first stage."""
  return {s.name for s in parse_chain(config.stages[0][1])} | {READ_STAGE}


def _join(*chains: str) -> str:
  return "|".join(c for c in chains if c)


class SegmentationTask:
  """Objects of a scene, click variants, click encodings; label = object mask."""
  name = "segmentation"
  splits_objects = True  # an image fans out into objects, counted and failed apart

  def stages(self, config) -> List[Tuple[str, str]]:
    """(Beam label, op chain) of each stage, in order; user ops come last."""
    return [
        ("DecodeExamples", decode_chain(config.image_size, config.max_pixels)),
        ("SampleClicks", clicks_chain(config.variants, config.seed, config.clicks)),
        ("EncodeClicks", _join(encoding_chain(config.click_encoding, config.clicks.disk_radius),
                               config.ops)),
    ]

  def records_per_unit(self, config) -> int:
    """Records written per used object."""
    return config.variants

  def image_level(self, stage: str, config) -> bool:
    """Whether a failure in `stage` loses a whole image (else one object)."""
    return stage in unit_ops(config)

  def label_outputs(self, inputs: Dict[str, Any], table: FeatureTable) -> Dict[str, Any]:
    """`label` (1 on the object) and `label_weight` (0 on ignore pixels), [B, H, W, 1]."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    from beam_prep.preprocessing import decode_feature  # pylint: disable=g-import-not-at-top
    entry = _one_label(table, per_pixel=True)
    mask = decode_feature(inputs[entry.key], entry, table.image_size)
    return {keys.LABEL: tf.cast(tf.equal(mask, 1), tf.float32),
            keys.LABEL_WEIGHT: tf.cast(tf.not_equal(mask, keys.IGNORE), tf.float32)}


class ClassificationTask:
  """One record per image; label = class name, as an index into a vocabulary."""
  name = "classification"
  splits_objects = False

  def stages(self, config) -> List[Tuple[str, str]]:
    return [
        ("DecodeExamples", decode_chain(config.image_size, config.max_pixels,
                                        require_mask=False)),
        ("CheckLabels", _join("require_label", config.ops)),
    ]

  def records_per_unit(self, config) -> int:
    del config
    return 1

  def image_level(self, stage: str, config) -> bool:
    del stage, config
    return True

  def label_outputs(self, inputs: Dict[str, Any], table: FeatureTable) -> Dict[str, Any]:
    """`label`: the index of the class in the vocabulary (most frequent first)."""
    import tensorflow_transform as tft  # pylint: disable=g-import-not-at-top
    entry = _one_label(table, per_pixel=False)
    return {keys.LABEL: tft.compute_and_apply_vocabulary(
        inputs[entry.key], vocab_filename=keys.LABEL_VOCABULARY, num_oov_buckets=0,
        default_value=-1)}


def _one_label(table: FeatureTable, per_pixel: bool):
  labels = table.with_role("label")
  if len(labels) != 1 or labels[0].feature.per_pixel != per_pixel:
    kind = "a per-pixel mask" if per_pixel else "a class name"
    raise FeatureError(f"a {table.task} run needs exactly one label feature ({kind}); the "
                       f"chain declares {[e.key for e in labels] or 'none'}")
  return labels[0]


TASKS = {t.name: t for t in (SegmentationTask(), ClassificationTask())}


def get(name: str):
  try:
    return TASKS[name]
  except KeyError:
    raise ValueError(f"task must be one of {sorted(TASKS)}, got {name!r}") from None
