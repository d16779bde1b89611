"""Pascal VOC: ROOT/JPEGImages/ID.jpg, ROOT/SegmentationObject/ID.png and the
split lists ROOT/ImageSets/Segmentation/{train,val}.txt (train -> train,
val -> eval: the lists fix the split)."""

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.filesystems import FileSystems

from beam_prep import keys
from beam_prep.layouts import common
from beam_prep.layouts.registry import InputError, Layout, ReadOptions, register_layout


def _pointers(list_path: str, root: str):
  name = common.stem(list_path)
  if name not in common.LIST_SPLITS:
    return
  with FileSystems.open(list_path) as f:
    ids = [line.strip() for line in f.read().decode("utf-8").splitlines() if line.strip()]
  for image_id in ids:
    yield {
      keys.IMAGE_ID: image_id,
      keys.SOURCE: FileSystems.join(root, "JPEGImages", image_id + ".jpg"),
      keys.MASK_SOURCE: FileSystems.join(root, "SegmentationObject", image_id + ".png"),
      keys.SPLIT: common.LIST_SPLITS[name],
    }


class _ListVoc(beam.PTransform):
  def __init__(self, root: str):
    super().__init__()
    self._root = root

  def expand(self, pbegin):
    root = self._root
    pointers = (
      pbegin
      | "Lists" >> beam.Create([FileSystems.join(root, "ImageSets", "Segmentation", "*.txt")])
      | "MatchLists" >> fileio.MatchAll()
      | "ListPaths" >> beam.Map(lambda m: m.path)
      | "ReadLists" >> beam.FlatMap(_pointers, root)
    )
    return pointers, pbegin | "NoListErrors" >> beam.Create([])


@register_layout
class Voc(Layout):
  name = "voc"
  labels = ("instances",)
  gives = (keys.MASK_BYTES,)
  expects = (
    "ROOT/JPEGImages, ROOT/SegmentationObject, "
    "ROOT/ImageSets/Segmentation/{train,val}.txt (the lists fix the split)"
  )
  priority = 20

  def detect(self, root: str, offline: bool = False) -> bool:
    return not offline and common.exists(FileSystems.join(root, "JPEGImages"))

  def check_input(self, options: ReadOptions) -> None:
    pattern = FileSystems.join(options.root, "ImageSets", "Segmentation", "*.txt")
    if not common.any_match(pattern):
      raise InputError(f"no split list matches {pattern}")

  def list_inputs(self, options: ReadOptions):
    return _ListVoc(options.root.rstrip("/"))

  def materialize(self, pointer):
    return common.read_image_and_mask(pointer)
