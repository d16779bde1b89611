"""The DAVIS layout: ROOT/img/NAME.jpg and ROOT/gt/NAME.png, one object per mask.

The 345 frames of DAVIS that interactive segmentation evaluates on, as
RITM's `DavisDataset` reads them: a pixel is the object where any channel of
the mask is non-zero; there is no ignore label (`paired.nonzero`).
"""

from beam_prep.layouts import paired
from beam_prep.layouts.registry import register_layout


@register_layout
class Davis(paired.PairedFolders):
  name = "davis"
  expects = "ROOT/img/NAME.* + ROOT/gt/NAME.* (paired by NAME; any non-zero pixel is the object)"
  priority = 35
  images_dir = "img"
  masks_dir = "gt"
  coding = staticmethod(paired.nonzero)
