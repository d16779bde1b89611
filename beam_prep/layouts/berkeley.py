"""The Berkeley layout: ROOT/images/NAME.jpg and ROOT/masks/NAME.png, coded 255/128/0.

The Berkeley benchmark (McGuinness and O'Connor 2010; 96 images, 100
objects) as RITM's `BerkeleyDataset` reads it: one object per mask, grey,
255 the object, 128 ignore, 0 background (`paired.trimap`).

Its folders are the `images/` + `masks/` of the generic instance-id layout,
whose masks mean something else when they hold other values than 0 and 255
(128 an object, 255 ignore), and no file tells the two apart. `--layout auto` therefore picks
this layout only when
the root folder's name contains "berkeley" (as RITM's `datasets/Berkeley`);
any other root needs `--layout berkeley`.
"""

from beam_prep.layouts import paired
from beam_prep.layouts.registry import register_layout


@register_layout
class Berkeley(paired.PairedFolders):
  name = "berkeley"
  expects = (
    "ROOT/images/NAME.* + ROOT/masks/NAME.* (paired by NAME; grey: 255 object, 128 ignore, "
    "0 background); auto only when ROOT's name contains 'berkeley'"
  )
  priority = 36  # Before the generic images/ + masks/ layout, which would read it wrongly.
  images_dir = "images"
  masks_dir = "masks"
  root_word = "berkeley"
  coding = staticmethod(paired.trimap)
