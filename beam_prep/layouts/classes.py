"""One folder per class: ROOT/<label>/NAME.png|jpg (classification).

The image id is "label/stem", so equal file names in two classes stay apart.
"""

from apache_beam.io.filesystems import FileSystems

from beam_prep import keys
from beam_prep.layouts import common
from beam_prep.layouts.registry import InputError, Layout, ReadOptions, register_layout


@register_layout
class Classes(Layout):
  name = "classes"
  labels = ("classes",)
  gives = (keys.LABEL,)
  expects = "ROOT/<label>/NAME.png|jpg, one folder per class"
  priority = 90

  def detect(self, root: str, offline: bool = False) -> bool:
    if offline:
      return not root.lower().endswith((".json", ".jsonl", ".csv"))
    return common.any_match(FileSystems.join(root, "*", "*"))

  def check_input(self, options: ReadOptions) -> None:
    pattern = FileSystems.join(options.root, "*", "*")
    if not common.any_match(pattern):
      raise InputError(f"nothing matches {pattern}")

  def list_inputs(self, options: ReadOptions):

    def pointer(path):
      label = common.parent(path)
      return {keys.IMAGE_ID: f"{label}/{common.stem(path)}", keys.SOURCE: path, "label": label}

    return common.GlobPointers(FileSystems.join(options.root.rstrip("/"), "*", "*"), pointer)

  def materialize(self, pointer):
    return common.read_image_and_mask(pointer)
