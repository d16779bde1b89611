"""The COCO-MVal layout: ROOT/img/NAME.jpg and ROOT/gt/NAME.png, one object per mask.

COCO-MVal (800 COCO val images, one object each, as f-BRS and RITM
distribute it) is read by RITM's `get_dataset` with the loader of another
img/ + gt/ benchmark: the same files, the same coding (any non-zero pixel
is the object: `paired.nonzero`). The records are the same either way;
this layout names the set in the run's manifest. Since no file tells the two apart, `--layout
auto` picks it only
when the root folder's name contains "COCO_MVal" (letters and digits
compared, case ignored: `cocomval`), as RITM's `datasets/COCO_MVal`.
"""

from beam_prep.layouts import paired
from beam_prep.layouts.registry import register_layout


@register_layout
class CocoMval(paired.PairedFolders):
  name = "coco_mval"
  expects = (
    "ROOT/img/NAME.* + ROOT/gt/NAME.* (paired by NAME; any non-zero pixel is the object); "
    "auto only when ROOT's name contains 'COCO_MVal'"
  )
  priority = 34  # Before the layout that reads the same img/ + gt/ files under any name.
  images_dir = "img"
  masks_dir = "gt"
  root_word = "cocomval"
  coding = staticmethod(paired.nonzero)
