"""The folders layout: ROOT/images/NAME.png|jpg and ROOT/masks/NAME.png (same
stem; a mask in another format, masks/NAME.jpg say, when there is no PNG).

Masks hold instance ids: 0 background, 1..254 objects, 255 ignore (as Pascal
VOC's SegmentationObject PNGs). A mask of only 0 and 255 is one object (255),
as most single-object sets save their masks; in grey or in RGB (black and
white); so is a black and white mask with grey edges (resized, anti-aliased,
JPEG): its pixels of grey 128 and above. The details:
`beam_prep.ops.image.mask_to_ids`.

The Berkeley benchmark's folders are the same (`has_files`): `--layout auto`
says so when it reads a folder as one of the two.
"""

import logging
import os
from typing import List, Tuple

from apache_beam.io.filesystems import FileSystems

from beam_prep import keys
from beam_prep.layouts import common
from beam_prep.layouts.registry import InputError, Layout, ReadOptions, register_layout

# The folders beside each other under ROOT, and the mask file's suffix (the
# labels the page of `beam-train serve` saves are written in this layout).
IMAGES_DIR, MASKS_DIR, MASK_SUFFIX = "images", "masks", ".png"


# At most this many unread files are named in the line that counts them.
NAMED = 3


def unread(root: str) -> Tuple[List[str], List[str]]:
  """The files of a local ROOT the layout does not read: those in folders
  under images/ (it reads images/NAME.*), and masks no image is named as."""
  images, masks = (os.path.join(root, d) for d in (IMAGES_DIR, MASKS_DIR))
  nested, stems = [], set()
  for d, _, files in os.walk(images):  # One listing of images/, its own files included.
    shown = [f for f in files if not common.hidden(f)]
    if d == images:
      stems.update(common.stem(f) for f in shown)
    else:
      nested += [os.path.join(d, f) for f in shown]
  nested.sort()
  masked = sorted(os.listdir(masks)) if os.path.isdir(masks) else []
  orphans = [os.path.join(masks, f) for f in masked if common.stem(f) not in stems]
  return nested, [p for p in orphans if os.path.isfile(p) and not common.hidden(p)]


def _say_unread(root: str) -> None:
  """One line for each kind of file the job will not read, naming a few."""
  nested, orphans = unread(root)
  log = logging.getLogger(__name__)
  for files, what in (
    (nested, f"files in folders under {os.path.join(root, IMAGES_DIR)} (it reads images/NAME.*)"),
    (orphans, "masks with no image of their name"),
  ):
    if files:
      named = ", ".join(files[:NAMED]) + (", ..." if len(files) > NAMED else "")
      log.warning("folders: %d not read, %s: %s", len(files), what, named)


@register_layout
class Folders(Layout):
  name = "folders"
  labels = ("instances",)
  gives = (keys.MASK_BYTES,)
  expects = (
    "ROOT/images/NAME.png|jpg + ROOT/masks/NAME.png|jpg|... (instance ids: 0 background, "
    "1..254 objects, 255 ignore; a mask of only 0 and 255 is one object, "
    "and so is one with grey edges between them: grey 128 and above)"
  )
  priority = 40

  def detect(self, root: str, offline: bool = False) -> bool:
    if offline:
      return not root.lower().endswith((".json", ".jsonl", ".csv"))
    return common.exists(FileSystems.join(root, IMAGES_DIR))

  def has_files(self, root: str) -> bool:
    return all(common.exists(FileSystems.join(root, d)) for d in (IMAGES_DIR, MASKS_DIR))

  def check_input(self, options: ReadOptions) -> None:
    pattern = self.pattern(options.root)
    if not common.any_match(pattern):
      nested, _ = unread(options.root)
      if not nested:
        raise InputError(f"no image matches {pattern}")
      raise InputError(
        f"no image matches {pattern} (the {len(nested)} files are in folders under it: "
        f"{nested[0]}, ...); the folders layout reads ROOT/images/NAME.* with "
        "ROOT/masks/NAME.*: make one ROOT of each folder"
      )
    _say_unread(options.root)

  @staticmethod
  def pattern(root: str) -> str:
    """What each input's image file matches."""
    return FileSystems.join(root.rstrip("/"), IMAGES_DIR, "*")

  @staticmethod
  def pointer(root: str, path: str):
    """The pointer of the image file `path` under `root`."""
    return {
      keys.IMAGE_ID: common.stem(path),
      keys.SOURCE: path,
      keys.MASK_SOURCE: FileSystems.join(
        root.rstrip("/"), MASKS_DIR, common.stem(path) + MASK_SUFFIX
      ),
    }

  def list_inputs(self, options: ReadOptions):
    root = options.root
    return common.GlobPointers(self.pattern(root), lambda path: self.pointer(root, path))

  def materialize(self, pointer):
    ex = common.read_image_and_mask(pointer)
    if ex[keys.MASK_BYTES] is None:  # No masks/NAME.png: NAME in another format.
      other = common.in_another_format(ex[keys.MASK_SOURCE], "mask", ex[keys.SOURCE])
      if other:
        ex[keys.MASK_SOURCE], ex[keys.MASK_BYTES] = other, common.read_bytes(other, "mask")
    return ex
