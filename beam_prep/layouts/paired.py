"""Layouts of an image folder and a mask folder paired by name, one object per mask.

The single-object benchmark sets of interactive segmentation lie on disk as
ROOT/<images>/NAME.<ext> and ROOT/<masks>/NAME.<ext>: an image's mask is the
file of the same NAME (the file name without its last extension) in the
mask folder, in any image format. A layout module subclasses
`PairedFolders`, names the two folders and picks a coding: the function
that turns a mask file's pixels into an instance mask.

Data contract of the examples (`materialize`): `image_id` (NAME; the file
name when two images share a NAME), `source` (the image), `mask_source`,
`image_bytes`, and `instance_mask`, uint8 [H, W]: 0 background, 1 the
object, 255 ignore. A mask is read as OpenCV's `imread` reads it in RITM's
loaders (`isegm/data/datasets/`): RGB, palette and grey and 16-bit files
converted, EXIF orientation applied. The codings, as those loaders apply
them:

  `trimap`   grey masks: 128 is ignore, values above 128 the object, and 1
             the object too (RITM's loader keeps 1 as id 1, so a 0/1 mask
             reads as its object); every other value is background. A
             colour mask (its channels differ) is refused with
             `unexpected_mask_value`: RITM would read its blue channel only.
  `nonzero`  a pixel is the object where any channel is non-zero; no ignore.

Listing matches both folders once, on one worker (these sets hold tens to a
few hundred images). Each pointer carries every mask file of its NAME;
reading it fails with `missing_mask` (none) or `ambiguous_mask` (several:
RITM would take whichever its listing gave last), never a crash.
"""

import collections
import posixpath
import re
from typing import Any, Callable, Dict, List

import numpy as np
from apache_beam.io.filesystems import FileSystems

from beam_prep import keys
from beam_prep.layouts import common
from beam_prep.layouts.registry import InputError, Layout, ReadOptions
from beam_prep.ops import image
from beam_prep.ops.registry import ExampleError

OBJECT = 1
TRIMAP_IGNORE = 128


def trimap(pixels: np.ndarray, path: str) -> np.ndarray:
  """A grey trimap mask (255 object, 128 ignore, 0 background) -> instance mask."""
  grey = pixels[..., 0]
  differs = (pixels != grey[..., None]).any(axis=-1)
  if differs.any():
    y, x = (int(v[0]) for v in np.nonzero(differs))
    raise ExampleError(
      "unexpected_mask_value",
      f"{path}: a colour mask (pixel x={x}, y={y} is RGB {tuple(pixels[y, x].tolist())}); "
      "these masks are grey: 255 object, 128 ignore, 0 background",
    )
  out = np.zeros(grey.shape, np.uint8)
  out[(grey > TRIMAP_IGNORE) | (grey == OBJECT)] = OBJECT
  out[grey == TRIMAP_IGNORE] = keys.IGNORE
  return out


def nonzero(pixels: np.ndarray, path: str) -> np.ndarray:
  """A mask whose non-zero pixels (in any channel) are the object -> instance mask."""
  del path  # Every value has a meaning.
  return (pixels.max(axis=-1) > 0).astype(np.uint8) * OBJECT


def read_mask_pixels(path: str) -> np.ndarray:
  """A mask file's pixels, uint8 RGB [H, W, 3] (ExampleError naming the file)."""
  data = common.read_bytes(path, "mask")
  try:
    return image.decode_file(data)
  except ExampleError as e:
    raise ExampleError("unreadable_mask", f"{path}: {e.detail} ({e.reason})") from None


def folder_word(root: str) -> str:
  """The root folder's name, lower case, letters and digits only ("My_Set-2" -> "myset2")."""
  return re.sub(r"[^a-z0-9]", "", posixpath.basename(root.rstrip("/")).lower())


def match_files(pattern: str) -> List[str]:
  """Paths matching `pattern`, hidden files left out, sorted."""
  found = FileSystems.match([pattern])[0].metadata_list
  return sorted(m.path for m in found if not common.hidden(m.path))


def pair_by_name(image_paths: List[str], mask_paths: List[str]) -> List[Dict[str, Any]]:
  """One pointer per image, with every mask file of the same NAME."""
  masks = collections.defaultdict(list)
  for path in mask_paths:
    masks[common.stem(path)].append(path)
  names = collections.Counter(common.stem(p) for p in image_paths)
  pointers = []
  for path in sorted(image_paths):
    name = common.stem(path)
    image_id = name if names[name] == 1 else path.rstrip("/").split("/")[-1]
    pointers.append(
      {keys.IMAGE_ID: image_id, keys.SOURCE: path, "mask_sources": sorted(masks.get(name, []))}
    )
  return pointers


def _pairs(root: str, images_dir: str, masks_dir: str) -> List[Dict[str, Any]]:
  """A root's images paired with their masks (`pair_by_name`)."""
  images, masks = (FileSystems.join(root, d, "*") for d in (images_dir, masks_dir))
  return pair_by_name(match_files(images), match_files(masks))


class PairedFolders(Layout):
  """An image folder and a mask folder (subclass it; see the module docstring).

  Attributes:
    images_dir, masks_dir: the two folders under the root.
    root_word: when set, `--layout auto` picks the layout only for a root
      whose folder name contains it (see `folder_word`): for a format that
      another layout shares.
    coding: `trimap` or `nonzero` (a function of the mask's RGB pixels and
      its path).
  """

  labels = ("instances",)
  gives = (keys.INSTANCE_MASK,)
  images_dir = ""
  masks_dir = ""
  root_word = ""
  coding: Callable[[np.ndarray, str], np.ndarray] = staticmethod(nonzero)

  def detect(self, root: str, offline: bool = False) -> bool:
    if offline or (self.root_word and self.root_word not in folder_word(root)):
      return False
    return self.has_files(root)

  def has_files(self, root: str) -> bool:
    return all(common.exists(FileSystems.join(root, d)) for d in (self.images_dir, self.masks_dir))

  def check_input(self, options: ReadOptions) -> None:
    for folder, what in ((self.images_dir, "image"), (self.masks_dir, "mask")):
      pattern = FileSystems.join(options.root, folder, "*")
      if not common.any_match(pattern):
        raise InputError(f"no {what} matches {pattern}")

  def list_inputs(self, options: ReadOptions):
    return common.ReadPointers(options.root.rstrip("/"), _pairs, self.images_dir, self.masks_dir)

  def materialize(self, pointer: Dict[str, Any]) -> Dict[str, Any]:
    ex = dict(pointer)
    masks = ex.pop("mask_sources")
    source = ex[keys.SOURCE]
    if len(masks) != 1:
      folder = source.rstrip("/").rsplit("/", 2)[0] + "/" + self.masks_dir
      if not masks:
        raise ExampleError(
          "missing_mask", f"{source}: no file named {common.stem(source)}.* in {folder}"
        )
      raise common.ambiguous("mask", source, masks)
    ex[keys.MASK_SOURCE] = masks[0]
    ex[keys.IMAGE_BYTES] = common.read_bytes(source)
    ex[keys.INSTANCE_MASK] = self.coding(read_mask_pixels(masks[0]), masks[0])
    return ex
