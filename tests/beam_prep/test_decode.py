"""The decode op on every kind of input file: converted, or rejected with a reason."""

import numpy as np
import pytest
from PIL import Image

from beam_prep.ops import image as image_ops
from beam_prep.ops.image import decode
from beam_prep.ops.registry import ExampleError
from tests.helpers import encoded, png

MASK = png(np.pad(np.ones((6, 6), np.uint8), 2), "L")  # 10 x 10, one object


def _decode(image_bytes, mask_bytes=MASK, **kw):
  return decode(**kw)(
    {"image_id": "x", "image_bytes": image_bytes, "mask_bytes": mask_bytes, "mask_source": "m.png"}
  )


@pytest.mark.parametrize(
  "mode,fmt",
  [
    ("RGB", "PNG"),
    ("L", "PNG"),
    ("LA", "PNG"),
    ("RGBA", "PNG"),
    ("P", "PNG"),
    ("1", "PNG"),
    ("CMYK", "JPEG"),
    ("RGB", "JPEG"),
    ("L", "JPEG"),
    ("I;16", "PNG"),
    ("RGB", "BMP"),
    ("RGB", "TIFF"),
    ("CMYK", "TIFF"),
  ],
)
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


@pytest.mark.parametrize(
  "data,mask,reason",
  [
    (b"", MASK, "empty_image"),
    (b"hello, not an image", MASK, "not_an_image"),
    (
      png(np.random.default_rng(0).integers(0, 255, (10, 10, 3), dtype=np.uint8))[:200],
      MASK,
      "truncated_image",
    ),
    (encoded(Image.new("F", (10, 10)), "TIFF"), MASK, "unsupported_image_mode"),
    (encoded(Image.new("RGB", (10, 10))), None, "missing_mask"),
    (encoded(Image.new("RGB", (10, 10))), b"", "empty_mask"),
    (
      encoded(Image.new("RGB", (10, 10))),
      encoded(Image.new("RGB", (10, 10), (10, 200, 30))),
      "unsupported_mask",
    ),
    (encoded(Image.new("RGB", (12, 10))), MASK, "mask_size_mismatch"),
    (
      encoded(Image.new("RGB", (10, 10))),
      encoded(Image.fromarray(np.full((10, 10), 300, np.uint16))),
      "unsupported_mask",
    ),
  ],
)
def test_unusable_inputs_raise_with_their_reason(data, mask, reason):
  with pytest.raises(ExampleError) as e:
    _decode(data, mask)
  assert e.value.reason == reason and e.value.detail


def test_a_mask_of_another_size_names_its_file():
  with pytest.raises(ExampleError) as e:
    _decode(encoded(Image.new("RGB", (12, 10))))
  assert e.value.detail == "the image is 12x10 (width x height), its mask file m.png is 10x10"


def test_decompression_bomb_is_rejected_before_decoding():
  big = encoded(Image.new("1", (4000, 3000)))  # tiny file, 12 M pixels declared
  with pytest.raises(ExampleError) as e:
    _decode(big, max_pixels=1_000_000)
  assert e.value.reason == "decompression_bomb" and "4000x3000" in e.value.detail


def test_sixteen_bit_mask_with_small_ids_is_accepted():
  mask = encoded(Image.fromarray(np.pad(np.full((6, 6), 3, np.uint16), 2)))
  out = _decode(encoded(Image.new("RGB", (10, 10))), mask)
  assert set(np.unique(out["instance_mask"]).tolist()) == {0, 3}


def _binary():
  """A 10 x 10 black and white mask: 255 the object, 0 background."""
  return np.pad(np.full((6, 6), 255, np.uint8), 2)


def _mask_file(rgb, mode):
  """An RGB array saved as a `mode` PNG (RGBA and LA opaque; LA keeps the red channel)."""
  opaque = np.full(rgb.shape[:2] + (1,), 255, np.uint8)
  arr = {
    "RGB": rgb,
    "RGBA": np.concatenate([rgb, opaque], -1),
    "LA": np.concatenate([rgb[..., :1], opaque], -1),
  }[mode]
  return png(arr, mode)


def test_a_mask_of_only_0_and_255_is_one_object_and_voc_masks_are_unchanged():
  image = encoded(Image.new("RGB", (10, 10)))
  out = _decode(image, png(_binary(), "L"))
  np.testing.assert_array_equal(out["instance_mask"], _binary() // 255)
  voc = np.zeros((10, 10), np.uint8)
  voc[1:4, 1:4], voc[6:9, 6:9], voc[0, :], voc[5, :] = 1, 2, 255, 255  # 255: VOC's boundary
  np.testing.assert_array_equal(_decode(image, png(voc, "L"))["instance_mask"], voc)
  palette = Image.fromarray(voc, mode="P")
  palette.putpalette([0, 0, 0, 128, 0, 0, 0, 128, 0] + [0] * 759)
  np.testing.assert_array_equal(_decode(image, encoded(palette))["instance_mask"], voc)


def _soft_masks():
  """A disk (radius 20) in black and white, saved the ways that give it grey
  edges: resized, drawn anti-aliased, and as JPEG in grey and in RGB
  -> {name: (mask file bytes, its object: pixels >= 128)}."""
  import io  # pylint: disable=g-import-not-at-top

  yy, xx = np.mgrid[:64, :80]
  sharp = Image.fromarray(((yy - 30) ** 2 + (xx - 38) ** 2 <= 400).astype(np.uint8) * 255)
  smooth = np.clip(20.5 - np.hypot(yy - 30.3, xx - 38.6), 0, 1) * 255  # anti-aliased
  made = {
    "resized": sharp.resize((40, 32), Image.BILINEAR),
    "anti-aliased": Image.fromarray(np.round(smooth).astype(np.uint8)),
  }
  out = {name: (png(np.asarray(im), "L"), np.asarray(im) >= 128) for name, im in made.items()}
  for mode in ("L", "RGB"):
    buf = io.BytesIO()
    sharp.convert(mode).save(buf, "JPEG", quality=90)
    out[f"jpeg {mode}"] = (buf.getvalue(), np.asarray(sharp) >= 128)
  return out


def test_a_black_and_white_mask_with_grey_edges_is_one_object():
  """Resized, anti-aliased or JPEG-saved, a black and white mask is one
  object (its pixels of grey 128 and above), not an object per grey level;
  VOC masks, small or thin objects and their thick 255 bands included, are
  not read so."""
  for name, (data, want) in _soft_masks().items():
    got = _decode(encoded(Image.new("RGB", want.shape[::-1])), data)["instance_mask"]
    assert set(np.unique(got).tolist()) == {0, 1}, name
    assert (got == 1).sum() == pytest.approx(want.sum(), rel=0.02), name
  image = encoded(Image.new("RGB", (24, 24)))
  voc = np.full((24, 24), 255, np.uint8)  # Thick boundary bands, small objects.
  voc[:4], voc[4:8, 4:8], voc[14:17, 14:17], voc[16:22, 2:8] = 0, 1, 2, 3
  voc[20:, 12:] = 0
  thin = np.zeros((24, 24), np.uint8)  # A 2-pixel object in a thick 255 band.
  thin[1:23, 1:21], thin[5:19, 10:12] = 255, 1
  for ids in (voc, thin):
    np.testing.assert_array_equal(_decode(image, png(ids, "L"))["instance_mask"], ids)


@pytest.mark.parametrize(
  "mode,colour",
  [
    ("RGB", (200, 0, 0)),
    ("RGB", (255, 255, 0)),
    ("RGB", (1, 1, 1)),
    ("RGBA", (0, 0, 255)),
    ("RGBA", (100, 100, 100)),
    ("LA", (128, 128, 128)),
  ],
)
def test_a_black_and_white_colour_mask_is_one_object_and_a_coloured_one_refused(mode, colour):
  image = encoded(Image.new("RGB", (10, 10)))
  white = np.repeat(_binary()[..., None], 3, -1)
  out = _decode(image, _mask_file(white, mode))
  np.testing.assert_array_equal(out["instance_mask"], _binary() // 255)
  coloured = np.where(white > 0, np.array(colour, np.uint8), 0).astype(np.uint8)
  with pytest.raises(ExampleError) as e:
    _decode(image, _mask_file(coloured, mode))
  assert e.value.reason == "unsupported_mask" and repr(mode) in e.value.detail


def test_a_mask_painted_with_vocs_palette_is_its_instance_ids():
  """CVAT's "Segmentation mask" export and Datumaro write SegmentationObject
  in RGB, each instance id painted with Pascal VOC's palette: read back as
  the ids, 255 (ignore) included; one colour outside the palette is refused
  and named."""
  ids = np.zeros((12, 12), np.uint8)
  ids[1:5, 1:5], ids[6:11, 2:6], ids[2:10, 8:11], ids[11, :] = 1, 2, 19, 255
  palette = image_ops.voc_palette()
  assert palette[1].tolist() == [128, 0, 0] and palette[255].tolist() == [224, 224, 192]
  image = encoded(Image.new("RGB", (12, 12)))
  for mode in ("RGB", "RGBA"):
    out = _decode(image, _mask_file(palette[ids], mode))
    np.testing.assert_array_equal(out["instance_mask"], ids)
  painted = palette[ids]
  painted[0, 0] = (130, 0, 0)
  with pytest.raises(ExampleError) as e:
    _decode(image, _mask_file(painted, "RGB"))
  assert e.value.reason == "unsupported_mask" and "(130, 0, 0)" in e.value.detail


def _phone_photo(size=48):
  """A JPEG stored as the sensor saw it with EXIF orientation 6, and the mask
  an annotation tool drew on the displayed (rotated) picture."""
  import io  # pylint: disable=g-import-not-at-top

  shown = np.full((size, size, 3), (40, 90, 200), np.uint8)  # blue background
  shown[2:18, 4:30] = (230, 40, 30)  # a red object at the top of the displayed photo
  mask = np.zeros((size, size), np.uint8)
  mask[2:18, 4:30] = 1
  # Orientation 6: viewers rotate the stored pixels 90 degrees clockwise.
  stored = Image.fromarray(shown).transpose(Image.Transpose.ROTATE_90)
  exif = Image.Exif()
  exif[0x0112] = 6
  buf = io.BytesIO()
  stored.save(buf, format="JPEG", quality=95, exif=exif.tobytes())
  return buf.getvalue(), png(mask, "L"), shown


def test_exif_orientation_is_applied_so_photo_and_mask_align(tmp_path):
  from tests.helpers import examples, run_cli  # pylint: disable=g-import-not-at-top
  from beam_prep import keys  # pylint: disable=g-import-not-at-top

  jpeg, mask, shown = _phone_photo()
  out = _decode(jpeg, mask)
  obj = out[keys.INSTANCE_MASK] == 1
  assert np.abs(out[keys.IMAGE][obj].astype(int) - (230, 40, 30)).mean() < 25
  assert np.abs(out[keys.IMAGE][~obj].astype(int) - (40, 90, 200)).mean() < 25
  # The same through the Beam job, into the record ...
  root = tmp_path / "data"
  (root / "images").mkdir(parents=True)
  (root / "masks").mkdir()
  (root / "images" / "phone.jpg").write_bytes(jpeg)
  (root / "masks" / "phone.png").write_bytes(mask)
  prep = str(tmp_path / "prep")
  assert (
    run_cli(
      [
        "segmentation",
        "--input",
        str(root),
        "--output",
        prep,
        "--image-size",
        "48",
        "--variants",
        "1",
        "--eval-percent",
        "0",
      ]
    )
    == 0
  )
  ex = examples(prep)[0]
  image = ex[keys.IMAGE]
  label = ex[keys.MASK][..., 0] == 1
  assert np.abs(image[label].astype(int) - (230, 40, 30)).mean() < 25
  # ... and `beam-train predict` reads the photo the same way.
  from train.export.predict import load_image  # pylint: disable=g-import-not-at-top

  path = tmp_path / "phone.jpg"
  path.write_bytes(jpeg)
  np.testing.assert_array_equal(load_image(str(path)), out[keys.IMAGE])


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_twin_applies_every_exif_orientation_as_the_job_does(fmt):
  """The serving graph's decoder (the signatures that take encoded files) and
  the job's decoder give the same pixels for each of the 8 orientations, JPEG
  included (both with libjpeg's accurate DCT)."""
  import io  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from beam_prep.ops.image import decode_file, decode_twin  # pylint: disable=g-import-not-at-top

  stored = np.random.default_rng(0).integers(0, 255, (13, 21, 3), dtype=np.uint8)
  shapes = set()
  for orientation in [None, *range(1, 9)]:
    buf, exif = io.BytesIO(), Image.Exif()
    if orientation:
      exif[0x010F], exif[0x0112] = "camera", orientation  # orientation not the first tag
    Image.fromarray(stored).save(buf, format=fmt, exif=exif.tobytes())
    job = decode_file(buf.getvalue())
    twin = decode_twin({"image_bytes": tf.constant(buf.getvalue())})["image"].numpy()
    assert job.shape == twin.shape, orientation
    np.testing.assert_array_equal(job, twin, err_msg=f"orientation {orientation}")
    shapes.add(job.shape)
  assert shapes == {(13, 21, 3), (21, 13, 3)}
