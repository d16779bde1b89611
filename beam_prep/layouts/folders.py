"""The folders layout: ROOT/images/NAME.png|jpg and ROOT/masks/NAME.png (same stem).

Masks hold instance ids: 0 background, 1..254 objects, 255 ignore (as Pascal
VOC's SegmentationObject PNGs).
"""

from apache_beam.io.filesystems import FileSystems

from beam_prep.layouts import common
from beam_prep.layouts.registry import InputError, Layout, ReadOptions, register_layout


@register_layout
class Folders(Layout):
  name = "folders"
  labels = ("instances",)
  gives = ("mask_bytes",)
  expects = ("ROOT/images/NAME.png|jpg + ROOT/masks/NAME.png (instance ids: 0 background, "
             "1..254 objects, 255 ignore)")
  priority = 40

  def detect(self, root: str, offline: bool = False) -> bool:
    if offline:
      return not root.lower().endswith((".json", ".jsonl", ".csv"))
    return common.exists(FileSystems.join(root, "images"))

  def check_input(self, options: ReadOptions) -> None:
    pattern = FileSystems.join(options.root, "images", "*")
    if not common.any_match(pattern):
      raise InputError(f"no image matches {pattern}")

  @staticmethod
  def pattern(root: str) -> str:
    """What each input's image file matches."""
    return FileSystems.join(root.rstrip("/"), "images", "*")

  @staticmethod
  def pointer(root: str, path: str):
    """The pointer of the image file `path` under `root`."""
    return {"image_id": common.stem(path), "source": path,
            "mask_source": FileSystems.join(root.rstrip("/"), "masks",
                                            common.stem(path) + ".png")}

  def list_inputs(self, options: ReadOptions):
    root = options.root
    return common.GlobPointers(self.pattern(root), lambda path: self.pointer(root, path))

  def materialize(self, pointer):
    return common.read_image_and_mask(pointer)
