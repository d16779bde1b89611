"""The decode op on every kind of input file: converted, or rejected with a reason."""

import numpy as np
import pytest
from PIL import Image

from beam_prep.ops.image import decode
from beam_prep.ops.registry import ExampleError
from tests.helpers import encoded, png

MASK = png(np.pad(np.ones((6, 6), np.uint8), 2), "L")  # 10 x 10, one object


def _decode(image_bytes, mask_bytes=MASK, **kw):
  return decode(**kw)({"image_id": "x", "image_bytes": image_bytes, "mask_bytes": mask_bytes,
                       "mask_source": "m.png"})


@pytest.mark.parametrize("mode,fmt", [
    ("RGB", "PNG"), ("L", "PNG"), ("LA", "PNG"), ("RGBA", "PNG"), ("P", "PNG"), ("1", "PNG"),
    ("CMYK", "JPEG"), ("RGB", "JPEG"), ("L", "JPEG"), ("I;16", "PNG"), ("RGB", "BMP"),
    ("RGB", "TIFF"), ("CMYK", "TIFF")])
def test_convertible_modes_become_uint8_rgb(mode, fmt):
  im = Image.new(mode, (10, 10))
  out = _decode(encoded(im, fmt))
  assert out["image"].shape == (10, 10, 3) and out["image"].dtype == np.uint8
  assert out["instance_mask"].shape == (10, 10)
  assert "image_bytes" not in out and "mask_bytes" not in out


def test_sixteen_bit_grey_is_scaled_not_clipped():
  arr = np.array([[0, 257 * 128, 65535]], np.uint16)
  im = Image.fromarray(arr)
  out = decode(require_mask=False)({"image_bytes": encoded(im)})
  assert out["image"][0, :, 0].tolist() == [0, 128, 255]


@pytest.mark.parametrize("data,mask,reason", [
    (b"", MASK, "empty_image"),
    (b"hello, not an image", MASK, "not_an_image"),
    (png(np.random.default_rng(0).integers(0, 255, (10, 10, 3), dtype=np.uint8))[:200], MASK,
     "truncated_image"),
    (encoded(Image.new("F", (10, 10)), "TIFF"), MASK, "unsupported_image_mode"),
    (encoded(Image.new("RGB", (10, 10))), None, "missing_mask"),
    (encoded(Image.new("RGB", (10, 10))), b"", "empty_mask"),
    (encoded(Image.new("RGB", (10, 10))), encoded(Image.new("RGB", (10, 10))), "unsupported_mask"),
    (encoded(Image.new("RGB", (12, 10))), MASK, "mask_size_mismatch"),
    (encoded(Image.new("RGB", (10, 10))), encoded(Image.fromarray(
        np.full((10, 10), 300, np.uint16))), "unsupported_mask"),
])
def test_unusable_inputs_raise_with_their_reason(data, mask, reason):
  with pytest.raises(ExampleError) as e:
    _decode(data, mask)
  assert e.value.reason == reason and e.value.detail


def test_decompression_bomb_is_rejected_before_decoding():
  big = encoded(Image.new("1", (4000, 3000)))  # tiny file, 12 M pixels declared
  with pytest.raises(ExampleError) as e:
    _decode(big, max_pixels=1_000_000)
  assert e.value.reason == "decompression_bomb" and "4000x3000" in e.value.detail


def test_sixteen_bit_mask_with_small_ids_is_accepted():
  mask = encoded(Image.fromarray(np.pad(np.full((6, 6), 3, np.uint16), 2)))
  out = _decode(encoded(Image.new("RGB", (10, 10))), mask)
  assert set(np.unique(out["instance_mask"]).tolist()) == {0, 3}
