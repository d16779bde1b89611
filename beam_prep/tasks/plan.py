"""Chain pieces the task modules share: decoding, joining chains."""

from beam_prep.ops.registry import op_call


def decode_chain(image_size: int, max_pixels: int, require_mask: bool = True,
                 object_areas: bool = False) -> str:
  """decode + resize (+ split into objects when there are masks).

  `object_areas`: measure each object at the source resolution, before the
  resize (for `require_min_area`).
  """
  decode = (op_call("decode", max_pixels=max_pixels) if require_mask
            else op_call("decode", max_pixels=max_pixels, require_mask=False))
  ops = [decode] + (["object_areas"] if object_areas else []) + [op_call("resize", image_size)]
  if require_mask:
    ops.append("split_objects")
  return "|".join(ops)


def join(*chains: str) -> str:
  """Chains joined with `|`, empty ones left out."""
  return "|".join(c for c in chains if c)
