"""Chain pieces the task modules share: decoding, joining chains."""

from beam_prep.ops.registry import op_call


def decode_op(max_pixels: int, require_mask: bool = True) -> str:
  """decode, with the mask when there is one."""
  return (
    op_call("decode", max_pixels=max_pixels)
    if require_mask
    else op_call("decode", max_pixels=max_pixels, require_mask=False)
  )


def resize_chain(image_size: int, require_mask: bool = True, object_areas: bool = False) -> str:
  """resize (+ split into objects when there are masks).

  `object_areas`: measure each object at the source resolution first, before
  the resize (for `require_min_area`).
  """
  return join(
    "object_areas" if object_areas else "",
    op_call("resize", image_size),
    "split_objects" if require_mask else "",
  )


def decode_chain(
  image_size: int, max_pixels: int, require_mask: bool = True, object_areas: bool = False
) -> str:
  """decode + resize (+ split into objects when there are masks)."""
  return join(
    decode_op(max_pixels, require_mask), resize_chain(image_size, require_mask, object_areas)
  )


def join(*chains: str) -> str:
  """Chains joined with `|`, empty ones left out."""
  return "|".join(c for c in chains if c)
