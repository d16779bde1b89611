"""The serving side of an op that changes an image's geometry.

The serving graph (`train.export.servers`) runs the chain's twins on a request. An
op whose records show the image in another frame than the request's (one
object's crop, the whole image fitted into a square) declares how the
serving graph goes between the two, with `register_op(..., serving=Cls)`:
`Cls(*op_args, **op_kwargs)` is a `ServingSide`,

  prepare(ex)                  the request before the twins run (a crop needs
                               a mask to cut around)
  size                         (height, width) the op gives the image: the
                               records' size (`FeatureTable.image_size` is
                               read from it)
  frame()                      what a records-sized image already is, to score
                               records as they are (`serve_examples`)
  to_request(prob, out, height, width)
                               the model's [S, S] output -> [height, width] of
                               the request (`out`: the example after the twins)
  seen(out, height, width)     int32 (x0, y0, x1, y1): the part of the request's
                               image the model saw (x1, y1 exclusive; the
                               served probabilities are refined there)

The serving graph asks the chain's op for its side (`train.export.serving_inputs`)
and never names an op. A chain holds at most one such op.
"""

from typing import Any, Dict, Optional, Tuple

Example = Dict[str, Any]


class ServingSide:
  """The serving side of an op that leaves the geometry as it is: nothing to do."""

  size: Optional[Tuple[int, int]] = None
  # True for a side that shows the model a crop around the object (zoom-in).
  zooms_in: bool = False

  def prepare(self, ex: Example) -> Example:
    return ex

  def prepare_box(self, ex: Example, region) -> Example:
    del region
    return self.prepare(ex)

  def frame(self) -> Example:
    return {}

  def to_request(self, prob, out: Example, height, width):
    del out, height, width
    return prob

  def seen(self, out: Example, height, width):
    """The whole image: the model saw all of it."""
    del out
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    return tf.cast(tf.stack([0, 0, width, height]), tf.int32)
