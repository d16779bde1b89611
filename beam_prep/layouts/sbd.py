"""The SBD layout: ROOT/img/NAME.jpg, ROOT/inst/NAME.mat, ROOT/{train,val}.txt.

The Semantic Boundaries Dataset (Hariharan et al. 2011) as RITM's
`SBDDataset` and `SBDEvaluationDataset` read it. `--input` is the folder
holding img/ and inst/, or the one above it holding `dataset/` (the
download unpacks to benchmark_RELEASE/dataset).

- NAME.mat holds a MATLAB struct `GTinst` whose `Segmentation` field is the
  instance mask: 0 background, 1..N objects (read by field name; RITM reads
  the struct's first field, which is Segmentation in SBD's files). Every
  object is an instance of the example's `instance_mask`; the pipeline makes
  one example per object, as RITM's evaluation set lists each (image,
  instance) pair on its own.
- The lists fix the split: train.txt -> train, val.txt -> eval. With both
  lists, an image in img/ that neither names is a dead letter
  (`not_in_split_list`): RITM never reads it, and a benchmark's split must
  be the one its lists give (never a guess by hash). With one list alone,
  the list is the data set (RITM's evaluation reads val.txt's names only):
  the other images are not inputs. val.txt alone makes an evaluation-only
  output (`only_split`). A name in both lists is `in_both_split_lists`.
- In the train split, an object covering less than 8% of its bounding box
  is an annotation error: RITM's training loader removes such masks
  (`buggy_mask_thresh=0.08`). Here it is a dead letter (`sparse_object`)
  and its pixels become ignore (RITM makes them background). The eval
  split keeps every object, as RITM's evaluation set does.

Other dead letters: `missing_image`, `missing_mask` (no .mat),
`unreadable_mask` (not a MATLAB file scipy reads), `missing_gtinst` (no
`GTinst` or no `Segmentation` in it), `unexpected_mask_value` (not a 2-D
array of integers 0..254: 255 is the ignore label here).
"""

import io
from typing import Any, Dict, List, Tuple

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems

from beam_prep import keys
from beam_prep.dead_letters import READ_STAGE, error_record
from beam_prep.layouts import common
from beam_prep.layouts.registry import InputError, Layout, ReadOptions, register_layout
from beam_prep.ops.registry import ExampleError

# RITM's SBDDataset: objects below this share of their bounding box are dropped.
MIN_BOX_FILL = 0.08
MAX_ID = 254


def data_root(root: str) -> str:
  """The folder holding img/ and inst/: `root`, or `root`/dataset when only that has them."""
  root = root.rstrip("/")
  nested = FileSystems.join(root, "dataset")
  if not common.exists(FileSystems.join(root, "inst")) and common.exists(
    FileSystems.join(nested, "inst")
  ):
    return nested
  return root


def _read_lists(root: str) -> Dict[str, set]:
  """NAME -> the splits whose lists name it (lists that do not exist name nothing)."""
  splits: Dict[str, set] = {}
  for list_name, split in common.LIST_SPLITS.items():
    path = FileSystems.join(root, f"{list_name}.txt")
    if not FileSystems.exists(path):
      continue
    with FileSystems.open(path) as f:
      for line in f.read().decode("utf-8-sig").splitlines():
        if line.strip():
          splits.setdefault(line.strip(), set()).add(split)
  return splits


def _present_lists(root: str) -> List[str]:
  return [
    name for name in common.LIST_SPLITS if FileSystems.exists(FileSystems.join(root, f"{name}.txt"))
  ]


def _list_inputs(root: str):
  """Pointers of the listed names; errors for names in both lists and (with
  both lists) for unlisted images."""
  splits = _read_lists(root)
  for name, found in sorted(splits.items()):
    image = FileSystems.join(root, "img", name + ".jpg")
    if len(found) > 1:
      yield beam.pvalue.TaggedOutput(
        common.ERRORS_TAG,
        error_record(
          READ_STAGE,
          "in_both_split_lists",
          f"{name} is in train.txt and in val.txt of {root}",
          {keys.SOURCE: image, keys.IMAGE_ID: name},
        ),
      )
      continue
    yield {
      keys.IMAGE_ID: name,
      keys.SOURCE: image,
      keys.MASK_SOURCE: FileSystems.join(root, "inst", name + ".mat"),
      keys.SPLIT: found.pop(),
    }
  if len(_present_lists(root)) < len(common.LIST_SPLITS):
    return  # One list alone is the data set.
  for m in FileSystems.match([FileSystems.join(root, "img", "*.jpg")])[0].metadata_list:
    name = common.stem(m.path)
    if name not in splits and not common.hidden(m.path):
      yield beam.pvalue.TaggedOutput(
        common.ERRORS_TAG,
        error_record(
          READ_STAGE,
          "not_in_split_list",
          f"{name} is in neither train.txt nor val.txt of {root}: it belongs to no split",
          {keys.SOURCE: m.path, keys.IMAGE_ID: name},
        ),
      )


def segmentation(data: bytes, path: str) -> np.ndarray:
  """GTinst.Segmentation of a .mat file's bytes, uint8 [H, W] (ExampleError naming `path`)."""
  from scipy import io as sio  # pylint: disable=g-import-not-at-top

  try:
    mat = sio.loadmat(io.BytesIO(data))
  except Exception as e:  # pylint: disable=broad-except
    raise ExampleError(
      "unreadable_mask", f"{path}: not a MATLAB file scipy reads: {type(e).__name__}: {e}"
    ) from None
  gt = mat.get("GTinst")
  if gt is None:
    names = ", ".join(k for k in mat if not k.startswith("__")) or "none"
    raise ExampleError("missing_gtinst", f"{path}: no GTinst struct (variables: {names})")
  fields = gt.dtype.names or ()
  if "Segmentation" not in fields or gt.size == 0:
    raise ExampleError(
      "missing_gtinst",
      f"{path}: GTinst has no Segmentation (fields: {', '.join(fields) or 'none'})",
    )
  seg = np.asarray(gt.flat[0]["Segmentation"])
  if seg.ndim != 2 or not np.issubdtype(seg.dtype, np.number) or seg.dtype.kind == "c":
    raise ExampleError(
      "unexpected_mask_value",
      f"{path}: GTinst.Segmentation is a "
      f"{seg.dtype} array of shape {seg.shape}, not a 2-D instance mask",
    )
  bad = (seg != np.round(seg)) | (seg < 0) | (seg > MAX_ID)
  if bad.any():
    y, x = (int(v[0]) for v in np.nonzero(bad))
    raise ExampleError(
      "unexpected_mask_value",
      f"{path}: GTinst.Segmentation holds {seg[y, x]} at x={x}, y={y}; "
      f"instance ids must be integers 0..{MAX_ID}",
    )
  return seg.astype(np.uint8)


def sparse_objects(inst: np.ndarray) -> List[Tuple[int, float]]:
  """(id, share of its bounding box) of the objects below MIN_BOX_FILL."""
  found = []
  for i in np.unique(inst):
    if i in (keys.BACKGROUND, keys.IGNORE):
      continue
    ys, xs = np.nonzero(inst == i)
    fill = ys.size / ((ys.max() - ys.min() + 1) * (xs.max() - xs.min() + 1))
    if fill < MIN_BOX_FILL:
      found.append((int(i), float(fill)))
  return found


@register_layout
class Sbd(Layout):
  name = "sbd"
  labels = ("instances",)
  gives = (keys.INSTANCE_MASK,)
  expects = (
    "ROOT/img/NAME.jpg + ROOT/inst/NAME.mat (GTinst.Segmentation instance ids) + "
    "ROOT/{train,val}.txt (the lists fix the split); ROOT may hold dataset/"
  )
  priority = 33

  def detect(self, root: str, offline: bool = False) -> bool:
    if offline:
      return False
    data = data_root(root)
    return all(common.exists(FileSystems.join(data, d)) for d in ("img", "inst"))

  def check_input(self, options: ReadOptions) -> None:
    data = data_root(options.root)
    lists = [FileSystems.join(data, f"{n}.txt") for n in common.LIST_SPLITS]
    if not any(common.exists(path) for path in lists):
      raise InputError(f"no split list: neither {' nor '.join(lists)} exists")

  def list_inputs(self, options: ReadOptions):
    return common.ReadPointers(data_root(options.root), _list_inputs)

  def only_split(self, options: ReadOptions):
    lists = _present_lists(data_root(options.root))
    return common.LIST_SPLITS[lists[0]] if len(lists) == 1 else None

  def materialize(self, pointer: Dict[str, Any]) -> Dict[str, Any]:
    ex = dict(pointer)
    ex[keys.IMAGE_BYTES] = common.read_bytes(ex[keys.SOURCE])
    mat = ex[keys.MASK_SOURCE]
    inst = segmentation(common.read_bytes(mat, "mask"), mat)
    errors = []
    if ex.get(keys.SPLIT) == keys.TRAIN_SPLIT:
      for i, fill in sparse_objects(inst):
        inst[inst == i] = keys.IGNORE
        errors.append(
          error_record(
            READ_STAGE,
            "sparse_object",
            f"{mat}: object {i} covers {fill:.1%} of its bounding box (under "
            f"{MIN_BOX_FILL:.0%}: an annotation error; its pixels are ignored)",
            {**ex, keys.OBJECT_ID: i},
          )
        )
    ex[keys.INSTANCE_MASK] = inst
    ex["object_errors"] = errors
    return ex
