"""Pascal VOC's segmentation layout, as VOC ships it and as CVAT's
"Segmentation mask 1.1" export and Datumaro's voc_segmentation write it:

  ROOT/JPEGImages/ID.jpg              the image (or the one ID.* there: CVAT
                                      keeps each image's own format)
  ROOT/SegmentationObject/ID.png      instance ids: a palette or grey PNG
                                      (VOC), or painted with VOC's palette in
                                      RGB (CVAT, Datumaro)
  ROOT/ImageSets/Segmentation/*.txt   lists of IDs (an ID may hold folders)

Lists named train, val, validation or test (any case) fix their images'
split: train -> train, the others -> eval; an image in both kinds is eval,
so that nothing evaluated is trained on. Any other list (CVAT's
default.txt, a subset named otherwise, VOC's trainval.txt) adds the images
no such list names, split by --eval-percent. A list none of whose images
has a mask (judged on up to UNLABELLED_SAMPLES of them, spread over the
list) is a list of unlabelled images (VOC's test.txt): it is not read, and
one dead letter (`unlabelled_list`) names it. In a list partly labelled (a
CVAT task whose frames are not all annotated), each image without a mask is
a `missing_mask` dead letter of its own.
"""

from typing import Any, Dict, List, Optional, Tuple

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from beam_prep import keys
from beam_prep.dead_letters import READ_STAGE, error_record
from beam_prep.layouts import common
from beam_prep.layouts.registry import InputError, Layout, ReadOptions, register_layout
from beam_prep.ops.registry import ExampleError

IMAGES_DIR, MASKS_DIR = "JPEGImages", "SegmentationObject"
# The lists that fix their images' split, by name (any case).
SPLIT_LISTS = {**common.LIST_SPLITS, "validation": keys.EVAL_SPLIT, "test": keys.EVAL_SPLIT}
# A list is unlabelled when none of this many of its images, spread over it, has a mask.
UNLABELLED_SAMPLES = 20
# An image several lists name takes the highest of their splits.
_RANK = {None: 0, keys.TRAIN_SPLIT: 1, keys.EVAL_SPLIT: 2}


def _lists_pattern(root: str) -> str:
  return FileSystems.join(root, "ImageSets", "Segmentation", "*.txt")


def _mask_path(root: str, image_id: str) -> str:
  return FileSystems.join(root, MASKS_DIR, image_id + ".png")


def _read_list(path: str) -> List[str]:
  with FileSystems.open(path) as f:
    return [line.strip() for line in f.read().decode("utf-8-sig").splitlines() if line.strip()]


def _labelled(ids: List[str], root: str) -> bool:
  """Whether any of UNLABELLED_SAMPLES images spread over a list has a mask."""
  step = max(1, len(ids) // UNLABELLED_SAMPLES)
  return any(FileSystems.exists(_mask_path(root, i)) for i in ids[::step][:UNLABELLED_SAMPLES])


def _unlabelled(path: str, ids: List[str], root: str):
  looked = min(len(ids), UNLABELLED_SAMPLES)
  detail = (
    f"{path}: none of {looked} of its {len(ids)} images has a mask under "
    f"{FileSystems.join(root, MASKS_DIR)}: a list of unlabelled images (as Pascal VOC's "
    "test.txt), not read"
  )
  return error_record(READ_STAGE, "unlabelled_list", detail, {keys.SOURCE: path})


def _listed_splits(root: str) -> Tuple[Dict[str, Optional[str]], List[Dict[str, Any]]]:
  """ID -> its split (None: by --eval-percent), in the lists' order; and an
  `unlabelled_list` dead letter for each list of unlabelled images."""
  splits: Dict[str, Optional[str]] = {}
  unlabelled = []
  paths = sorted(m.path for m in FileSystems.match([_lists_pattern(root)])[0].metadata_list)
  for path in paths:
    ids = _read_list(path)
    if ids and not _labelled(ids, root):
      unlabelled.append(_unlabelled(path, ids, root))
      continue
    split = SPLIT_LISTS.get(common.stem(path).lower())
    for image_id in ids:
      if image_id not in splits or _RANK[split] > _RANK[splits[image_id]]:
        splits[image_id] = split
  return splits, unlabelled


def _list_inputs(root: str):
  """The pointer of every listed image; dead letters (tagged) for unlabelled lists."""
  splits, unlabelled = _listed_splits(root)
  for error in unlabelled:
    yield beam.pvalue.TaggedOutput(common.ERRORS_TAG, error)
  for image_id, split in splits.items():
    pointer = {
      keys.IMAGE_ID: image_id,
      keys.SOURCE: FileSystems.join(root, IMAGES_DIR, image_id + ".jpg"),
      keys.MASK_SOURCE: _mask_path(root, image_id),
    }
    yield {**pointer, keys.SPLIT: split} if split else pointer


@register_layout
class Voc(Layout):
  name = "voc"
  labels = ("instances",)
  gives = (keys.MASK_BYTES,)
  expects = (
    "ROOT/JPEGImages, ROOT/SegmentationObject, ROOT/ImageSets/Segmentation/*.txt "
    "(Pascal VOC, or CVAT's 'Segmentation mask' export with its images; "
    "train/val/test lists fix the split, others are split by --eval-percent)"
  )
  priority = 20

  def detect(self, root: str, offline: bool = False) -> bool:
    """JPEGImages/, or SegmentationObject/ alone (an export without its
    images: each image is then a `missing_image` dead letter naming it)."""
    folders = (IMAGES_DIR, MASKS_DIR)
    return not offline and any(common.exists(FileSystems.join(root, d)) for d in folders)

  def check_input(self, options: ReadOptions) -> None:
    pattern = _lists_pattern(options.root)
    if not common.any_match(pattern):
      raise InputError(f"no split list matches {pattern}")

  def list_inputs(self, options: ReadOptions):
    return common.ReadPointers(options.root.rstrip("/"), _list_inputs)

  def materialize(self, pointer):
    try:
      return common.read_image_and_mask(pointer)
    except ExampleError as e:
      if e.reason != "missing_image":
        raise
    source = pointer[keys.SOURCE]  # No JPEGImages/ID.jpg: ID in another format.
    other = common.in_another_format(source, "image", source)
    if not other:
      raise ExampleError("missing_image", f"{source}: no file named {pointer[keys.IMAGE_ID]}.*")
    return common.read_image_and_mask({**pointer, keys.SOURCE: other})
