"""The GrabCut layout: ROOT/data_GT/NAME.* (images), ROOT/boundary_GT/NAME.* (masks).

The GrabCut benchmark (Rother et al. 2004; 50 images, one object each) as
RITM's `GrabCutDataset` reads it: an image's mask is the boundary_GT file of
the same NAME, a grey trimap: 255 the object, 128 the unlabelled band along
its boundary (ignore, 255 in the records), 0 background (the exact coding:
`paired.trimap`).
"""

from beam_prep.layouts import paired
from beam_prep.layouts.registry import register_layout


@register_layout
class GrabCut(paired.PairedFolders):
  name = "grabcut"
  expects = (
    "ROOT/data_GT/NAME.* + ROOT/boundary_GT/NAME.* (paired by NAME; grey: 255 object, "
    "128 ignore band, 0 background)"
  )
  priority = 32
  images_dir = "data_GT"
  masks_dir = "boundary_GT"
  coding = staticmethod(paired.trimap)
