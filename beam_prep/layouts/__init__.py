"""The built-in input layouts; importing this package registers them (see `registry`)."""

from beam_prep.layouts import (
  berkeley,
  classes,
  coco,
  coco_mval,
  cvat,
  davis,
  folders,
  grabcut,  # noqa: F401  pylint: disable=unused-import
  label_studio,
  manifest,
  sbd,
  voc,
)
from beam_prep.layouts.registry import (
  AUTO,
  BASE_KEYS,
  InputError,
  Layout,
  ReadOptions,  # noqa: F401
  describe,
  detect,
  get_layout,
  layout_names,
  layouts_for,
  register_layout,
)
