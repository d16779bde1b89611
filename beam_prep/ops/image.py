"""Image ops: decode files into arrays, resize, measure and split a scene into
objects.

Data contract of the examples these ops read and write (declared features in
bold are kept by the records; see `produces` of each op):

| key              | dtype / shape        | meaning                                   |
|------------------|----------------------|-------------------------------------------|
| `image_id`       | str                  | stem of the image file (declared by read) |
| `source`         | str                  | path of the image file                    |
| `image_bytes`    | bytes                | encoded image file (input of `decode`)    |
| `mask_bytes`     | bytes                | encoded mask file (input of `decode`)     |
| **`image`**      | uint8 [H, W, 3]      | RGB; model input, standardized            |
| **`height`**, **`width`** | int         | the image's size before `resize`          |
| `instance_mask`  | uint8 [H, W]         | 0 background, 1..254 instance, 255 ignore |
|                  |                      | (decoded, or drawn by the coco reader)    |
| `source_areas`   | int64 [256]          | pixels of each instance id before resize  |
|                  |                      | (`object_areas`)                          |
| **`object_id`**  | int                  | instance id of this example's object      |
| **`mask`**       | uint8 [H, W]         | 1 object, 0 background, 255 ignore; label |
| **`label`**      | str                  | class name (classification); label        |

`resize` keeps the aspect ratio: the image is fitted into the S x S frame
(`fitted_size`: the long side becomes S) at its top-left corner, and the rest
is padding: black pixels (`IMAGE_PAD`) and ignore (255) in the instance mask,
so that the label never calls padding background and evaluation never counts
it. `height` and `width` keep the size before the resize, from which the
valid region and the scale follow.

`decode` and `resize` have TensorFlow twins for the serving graph: the serving
model receives decoded pixels (or, for classification, encoded files) and
resizes and pads them exactly as the Beam job did.
"""

import io
import warnings

import numpy as np
from PIL import Image

from beam_prep import keys
from beam_prep.features import Feature
from beam_prep.ops.registry import ExampleError, register_op
from beam_prep.ops.serving import ServingSide

# One declaration of each image feature, shared by every op that writes it.
IMAGE = Feature("uint8", channels=3, role="model_input", normalize="standardize")
MASK = Feature("uint8", channels=1, role="label", encoding="zlib")
SIZE = Feature("int64", shape=(), role="metadata")
SIZE_FEATURES = {keys.HEIGHT: SIZE, keys.WIDTH: SIZE}
OBJECT_ID = Feature("int64", shape=(), role="metadata")


def _open(data: bytes, what: str, max_pixels: int) -> Image.Image:
  """Opens and fully decodes an image, turning every failure into a reason."""
  if not data:
    raise ExampleError(f"empty_{what}", f"the {what} file is empty")
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("error", Image.DecompressionBombWarning)
      im = Image.open(io.BytesIO(data))
      w, h = im.size
      if w * h > max_pixels:
        raise ExampleError(
          "decompression_bomb",
          f"the {what} declares {w}x{h} = {w * h} pixels, over the limit of "
          f"{max_pixels} (raise --max-pixels if this is real)",
        )
      im.load()
  except ExampleError:
    raise
  except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
    raise ExampleError("decompression_bomb", f"the {what}: {e}") from None
  except Image.UnidentifiedImageError:
    raise ExampleError("not_an_image", f"the {what} file is not an image PIL can read") from None
  except (OSError, SyntaxError, ValueError) as e:
    raise ExampleError(f"truncated_{what}", f"the {what} cannot be decoded: {e}") from None
  return im


def displayed(im: Image.Image) -> Image.Image:
  """The image as viewers show it: its EXIF orientation applied.

  Phones store pixels as the sensor saw them plus an orientation tag, and
  annotation tools draw masks on the displayed image; without this, such a
  photo and its mask would be silently misaligned. Masks are used as stored.
  """
  from PIL import ImageOps  # pylint: disable=g-import-not-at-top

  return ImageOps.exif_transpose(im)


def image_to_rgb(im: Image.Image) -> np.ndarray:
  """Converts a decoded PIL image to uint8 RGB, or raises with a reason.

  Converted: RGB, grey (L, 1), grey+alpha, RGBA (alpha dropped), palette,
  CMYK, YCbCr, LAB, HSV, and 16- or 32-bit integer grey (scaled to 8 bits by
  the file's bit depth). Rejected: floating-point images, whose value range is
  not defined by the file.
  """
  mode = im.mode
  if mode == "RGB":
    return np.asarray(im, dtype=np.uint8)
  if mode in ("I;16", "I;16B", "I;16L", "I;16N"):
    arr = np.asarray(im).astype(np.uint32)
    grey = (arr * 255 + 32767) // 65535
    return np.repeat(grey.astype(np.uint8)[..., None], 3, axis=-1)
  if mode == "I":
    arr = np.asarray(im).astype(np.int64)
    if arr.min() < 0:
      raise ExampleError("unsupported_image_mode", "32-bit image with negative values")
    top = 255 if arr.max() <= 255 else 65535 if arr.max() <= 65535 else 2**32 - 1
    grey = (arr * 255 + top // 2) // top
    return np.repeat(grey.astype(np.uint8)[..., None], 3, axis=-1)
  if mode == "F":
    raise ExampleError(
      "unsupported_image_mode", "floating-point image (mode F) has no defined value range"
    )
  if mode in (
    "L",
    "1",
    "LA",
    "La",
    "RGBA",
    "RGBX",
    "RGBa",
    "P",
    "PA",
    "CMYK",
    "YCbCr",
    "LAB",
    "HSV",
  ):
    return np.asarray(im.convert("RGB"), dtype=np.uint8)
  raise ExampleError("unsupported_image_mode", f"image mode {mode!r}")


# The id of the one object of a binary mask (only 0 and 255, some 255).
BINARY_OBJECT = 1
# A black and white mask with grey edges (anti-aliased, resampled or saved as
# JPEG): its object is the pixels at this grey level or above.
SOFT_OBJECT_LEVEL = 128
# Colour modes whose mask is read when it is black and white (all colour
# channels equal): a binary mask saved as RGB is common. Alpha is dropped.
_COLOUR_CHANNELS = {"RGB": 3, "RGBA": 3, "LA": 1}
# How far apart a grey pixel's channels may be in a colour mask with grey
# edges: a JPEG's colour conversion moves them a few levels.
_GREY_SPREAD = 8


def mask_to_ids(im: Image.Image) -> np.ndarray:
  """Reads instance ids from a mask image: palette or grey, 8 or 16 bits.

  The coding is Pascal VOC's: 0 background, 1..254 objects, 255 ignore. A
  mask of only 0 and 255 (some 255) is a binary mask, as most single-object
  sets and tools save theirs: one object, 255 -> `BINARY_OBJECT` (read as
  VOC, it would hold no object). So is a black and white mask with grey
  edges (`_has_soft_edges`: resized, anti-aliased or saved as JPEG, as many
  saliency sets are): its object is the pixels of `SOFT_OBJECT_LEVEL` and
  above (read as VOC, each grey level of its edge would be an object). A
  16-bit mask is accepted when every value fits in 8 bits. An RGB, RGBA or
  LA mask is accepted when it is such a binary mask in grey (its colour
  channels equal; within `_GREY_SPREAD` levels with grey edges), or when
  every colour it holds is one of Pascal VOC's palette (`voc_palette`):
  instance ids painted, as CVAT's "Segmentation mask" export and Datumaro
  write SegmentationObject. Any other is rejected: its colours are not
  instance ids.
  """
  ids = _mask_values(im)
  if _is_binary(ids):
    return np.where(ids == keys.IGNORE, BINARY_OBJECT, keys.BACKGROUND).astype(np.uint8)
  if _has_soft_edges(ids):
    return np.where(ids >= SOFT_OBJECT_LEVEL, BINARY_OBJECT, keys.BACKGROUND).astype(np.uint8)
  return ids


def _is_binary(ids: np.ndarray) -> bool:
  """Whether uint8 `ids` hold only 0 and 255, and some 255."""
  counts = np.bincount(ids.ravel(), minlength=keys.IGNORE + 1)
  return counts[keys.IGNORE] > 0 and not counts[keys.BACKGROUND + 1 : keys.IGNORE].any()


def _solid(values: np.ndarray, where: np.ndarray) -> float:
  """The share of the pixels `where` whose 4 neighbours hold their value
  (an image's border repeated)."""
  if not where.any():
    return 0.0
  p = np.pad(values, 1, mode="edge")
  c = p[1:-1, 1:-1]
  same = (c == p[:-2, 1:-1]) & (c == p[2:, 1:-1]) & (c == p[1:-1, :-2]) & (c == p[1:-1, 2:])
  return float((same & where).sum() / where.sum())


def _has_soft_edges(ids: np.ndarray) -> bool:
  """Whether uint8 `ids` are a black and white mask with grey edges rather
  than instance ids: the grey levels between 0 and 255 lie in thin bands
  (almost none of their pixels share their 4 neighbours' value), where
  instance ids fill regions, small ones too; and the pixels of
  `SOFT_OBJECT_LEVEL` and above make a solid object, not lines only."""
  grey = (ids > keys.BACKGROUND) & (ids < keys.IGNORE)
  core = ids >= SOFT_OBJECT_LEVEL
  if not grey.any() or ids[grey].max() < SOFT_OBJECT_LEVEL:
    return False  # Instance ids are small numbers; grey edges reach up to white.
  return _solid(ids, grey) < 0.2 and _solid(core, core) >= 0.5


def _mask_values(im: Image.Image) -> np.ndarray:
  """A mask image's values, uint8 [H, W], before the binary reading."""
  if im.mode in ("P", "L"):
    return np.asarray(im, dtype=np.uint8)
  if im.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
    arr = np.asarray(im)
    if arr.min() < 0 or arr.max() > 255:
      raise ExampleError(
        "unsupported_mask", f"{im.mode} mask holds values outside 0..255 (max {arr.max()})"
      )
    return arr.astype(np.uint8)
  if im.mode in _COLOUR_CHANNELS:
    colour = np.asarray(im, dtype=np.uint8)[..., : _COLOUR_CHANNELS[im.mode]]
    grey = np.round(colour.mean(-1)).astype(np.uint8)
    spread = int(np.abs(colour.astype(np.int16) - grey[..., None]).max())
    if (spread == 0 and _is_binary(grey)) or (spread <= _GREY_SPREAD and _has_soft_edges(grey)):
      return grey
    painted = _painted_ids(colour) if colour.shape[-1] == 3 else None
    if painted is not None:
      return painted
  raise ExampleError(
    "unsupported_mask",
    f"mask mode {im.mode!r}{_first_colour_outside_the_palette(im)}: a mask must be "
    "single-channel instance ids (palette or grey PNG, as Pascal VOC's "
    "SegmentationObject), instance ids painted with Pascal VOC's palette (as "
    "CVAT and Datumaro export them), or black and white (0 background, 255 the object)",
  )


def voc_palette() -> np.ndarray:
  """Pascal VOC's palette, uint8 [256, 3]: id i's colour spreads i's bits
  over the channels, three at a time from the high bit down (bit 0 ->
  red's 128, bit 1 -> green's 128, bit 2 -> blue's 128, bit 3 -> red's 64,
  ...): 1 is (128, 0, 0), 255 (ignore) is (224, 224, 192)."""
  ids = np.arange(256)
  palette = np.zeros((256, 3), np.int64)
  for level in range(8):
    for channel in range(3):
      palette[:, channel] |= ((ids >> (3 * level + channel)) & 1) << (7 - level)
  return palette.astype(np.uint8)


def _colour_codes(colour: np.ndarray) -> np.ndarray:
  """uint8 RGB [..., 3] -> one int per colour (0xRRGGBB)."""
  c = colour.astype(np.int64)
  return (c[..., 0] << 16) | (c[..., 1] << 8) | c[..., 2]


_PALETTE_CODES = _colour_codes(voc_palette())
_PALETTE_ORDER = np.argsort(_PALETTE_CODES)


def _palette_ids(codes: np.ndarray) -> np.ndarray:
  """Colour codes -> their ids in Pascal VOC's palette (-1: not in it)."""
  sorted_codes = _PALETTE_CODES[_PALETTE_ORDER]
  at = np.clip(np.searchsorted(sorted_codes, codes), 0, len(sorted_codes) - 1)
  return np.where(sorted_codes[at] == codes, _PALETTE_ORDER[at], -1)


def _painted_ids(colour: np.ndarray):
  """uint8 [H, W] instance ids of an RGB mask painted with Pascal VOC's
  palette, or None when some colour is not the palette's."""
  codes, inverse = np.unique(_colour_codes(colour), return_inverse=True)
  ids = _palette_ids(codes)
  if (ids < 0).any():
    return None
  return ids[inverse].reshape(colour.shape[:2]).astype(np.uint8)


def _first_colour_outside_the_palette(im: Image.Image) -> str:
  """For the error of a colour mask: the first colour (in code order)
  that is not Pascal VOC's palette's, and how many colours it holds."""
  if im.mode not in _COLOUR_CHANNELS or _COLOUR_CHANNELS[im.mode] != 3:
    return ""
  codes = np.unique(_colour_codes(np.asarray(im, dtype=np.uint8)[..., :3]))
  outside = codes[_palette_ids(codes) < 0]
  if not outside.size:
    return ""
  r, g, b = (int(outside[0]) >> shift & 0xFF for shift in (16, 8, 0))
  return f" with {len(codes)} colours, ({r}, {g}, {b}) not of Pascal VOC's palette"


def decode_file(data: bytes, max_pixels: int = keys.MAX_PIXELS) -> np.ndarray:
  """An encoded image file -> uint8 RGB [H, W, 3] as viewers show it (EXIF
  orientation applied): the one decoder of the Beam job, `beam-train predict`
  and `beam-train serve`.

  Raises:
    ExampleError: empty, not an image, truncated, an unsupported mode, or
      over `max_pixels` (a decompression bomb); the detail says which.
  """
  return image_to_rgb(displayed(_open(data, "image", max_pixels)))


# The formats the serving graph's decoder (`decode_image_tf`) reads, as PIL
# names them (`Image.format`).
SERVED_FORMATS = ("PNG", "JPEG", "GIF", "BMP", "WEBP")


def declared_pixels(data: bytes) -> int:
  """The pixels an encoded image declares in its header (nothing decoded), or
  ValueError: not an image, or a format the serving graph does not decode."""
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", Image.DecompressionBombWarning)
      im = Image.open(io.BytesIO(data))
  except Image.DecompressionBombError as e:
    raise ValueError(f"a decompression bomb: {e}") from None
  except (Image.UnidentifiedImageError, OSError, SyntaxError, ValueError):
    raise ValueError("not an image file (PNG, JPEG, GIF, BMP or WebP)") from None
  if im.format not in SERVED_FORMATS:
    raise ValueError(f"a {im.format} file; the serving graph decodes {', '.join(SERVED_FORMATS)}")
  return im.size[0] * im.size[1]


def decode_image_tf(data):
  """`decode_file` in TensorFlow: a scalar string, an encoded file -> uint8
  RGB [H, W, 3] as viewers show it, the file's EXIF orientation applied.

  JPEGs are decoded with libjpeg's accurate integer DCT, as PIL decodes them,
  so both decoders give the same pixels (TensorFlow's default, the fast DCT,
  differs by a few levels); other formats are lossless.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  image = tf.cond(
    tf.io.is_jpeg(data),
    lambda: tf.io.decode_jpeg(data, channels=3, dct_method="INTEGER_ACCURATE"),
    lambda: tf.io.decode_image(data, channels=3, expand_animations=False),
  )
  image.set_shape([None, None, 3])
  return _orient(image, _exif_orientation(data))


def decode_twin(ex, max_pixels: int = keys.MAX_PIXELS, require_mask: bool = True):
  """`decode` in TensorFlow: `image_bytes` (an encoded file) -> `image`
  (`decode_image_tf`: the same pixels, EXIF orientation applied).

  A request that already holds decoded pixels (`image`) passes unchanged.
  """
  del max_pixels, require_mask  # The serving graph decodes images only.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  out = dict(ex)
  if keys.IMAGE_BYTES in ex:
    out[keys.IMAGE] = decode_image_tf(ex[keys.IMAGE_BYTES])
    del out[keys.IMAGE_BYTES]
  shape = tf.shape(out[keys.IMAGE])
  out[keys.HEIGHT], out[keys.WIDTH] = tf.cast(shape[0], tf.int64), tf.cast(shape[1], tf.int64)
  return out


# Where an EXIF block (a TIFF header) starts: after JPEG's APP1 "Exif\0\0"
# or PNG's eXIf chunk type. Both sit before the pixel data, near the start.
_EXIF_MARKERS = (b"Exif\x00\x00", b"eXIf")
_EXIF_SEARCH_BYTES = 1 << 17
_ORIENTATION_TAG = 0x0112


def _exif_orientation(data):
  """The EXIF orientation (1..8) of an encoded image, in TensorFlow; 1 when
  the file has none. Reads IFD0 of the first EXIF block, as PIL does."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  head = tf.strings.substr(data, 0, _EXIF_SEARCH_BYTES)
  n = tf.strings.length(head)
  tiff = tf.reduce_min(tf.stack([_find(head, m) + len(m) for m in _EXIF_MARKERS]))
  found = tiff < n
  tiff = tf.minimum(tiff, n)
  body = tf.cast(tf.io.decode_raw(tf.strings.substr(head, tiff, n - tiff), tf.uint8), tf.int32)
  body = tf.concat([body, tf.zeros([12 * 64 + 16], tf.int32)], 0)
  little = tf.equal(body[0], ord("I"))
  found &= (little | tf.equal(body[0], ord("M"))) & tf.equal(body[0], body[1])
  weights = {
    size: tf.where(
      little,
      tf.constant([1 << (8 * i) for i in range(size)]),
      tf.constant([1 << (8 * i) for i in reversed(range(size))]),
    )
    for size in (2, 4)
  }

  def uint(at, size):
    """The unsigned integers of `size` bytes at offsets `at` (any shape) of the block."""
    at = tf.minimum(at[..., None] + tf.range(size), tf.shape(body)[0] - 1)
    return tf.reduce_sum(tf.gather(body, at) * weights[size], -1)

  # An offset past the block (or over 2**31, read negative) reads nothing.
  ifd = tf.clip_by_value(uint(tf.constant(4), 4), 0, tf.shape(body)[0] - 2)
  entries = ifd + 2 + 12 * tf.range(tf.minimum(uint(ifd, 2), 64))
  hits = tf.cast(tf.equal(uint(entries, 2), _ORIENTATION_TAG), tf.int32)
  # The first entry of the tag, else the value 1 after the entries.
  first = tf.argmax(tf.concat([hits, [1]], 0), output_type=tf.int32)
  value = tf.concat([uint(entries + 8, 2), [1]], 0)[first]
  ok = found & (value >= 1) & (value <= 8)
  return tf.where(ok, value, 1)


def _find(head, marker: bytes):
  """Index of the first `marker` in the string `head`, or its length."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  before = tf.strings.split(head, sep=marker, maxsplit=1)
  return tf.strings.length(tf.concat([before, [""]], 0)[0])


def _orient(image, orientation):
  """`image` as viewers show it under EXIF `orientation` (PIL's exif_transpose)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  # Transposes and reversals only: tf.image.rot90 adds a cond and an assert
  # per call, functions the SavedModel loads.
  t = lambda im: tf.transpose(im, [1, 0, 2])
  ways = [
    lambda: image,  # 1
    lambda: tf.reverse(image, [1]),  # 2: mirrored
    lambda: tf.reverse(image, [0, 1]),  # 3: turned 180 degrees
    lambda: tf.reverse(image, [0]),  # 4
    lambda: t(image),  # 5: transposed
    lambda: tf.reverse(t(image), [1]),  # 6: turned 90 degrees clockwise
    lambda: tf.reverse(t(image), [0, 1]),  # 7: transversed
    lambda: t(tf.reverse(image, [1])),  # 8: turned 90 degrees counter-clockwise
  ]
  return tf.switch_case(orientation - 1, ways)


@register_op(
  "decode",
  reads=(keys.IMAGE_BYTES,),
  produces={keys.IMAGE: IMAGE, **SIZE_FEATURES},
  intermediate=(keys.INSTANCE_MASK,),
  twin=decode_twin,
)
def decode(max_pixels: int = keys.MAX_PIXELS, require_mask: bool = True):
  """Decodes `image_bytes` (and `mask_bytes`) into `image` (and `instance_mask`).

  Args:
    max_pixels: images or masks declaring more pixels are rejected.
    require_mask: segmentation needs a mask: a missing one is an error. With
      False (classification), a mask is neither needed nor read.
  """

  def fn(ex):
    image = decode_file(ex["image_bytes"], max_pixels)
    out = {k: v for k, v in ex.items() if k not in (keys.IMAGE_BYTES, keys.MASK_BYTES)}
    out[keys.IMAGE] = image
    out[keys.HEIGHT], out[keys.WIDTH] = image.shape[:2]
    if not require_mask:
      return out
    mask = ex.get(keys.INSTANCE_MASK)  # Drawn by the layout from annotations, else a file.
    named = f" {ex[keys.MASK_SOURCE]}" if ex.get(keys.MASK_SOURCE) else ""
    what = "the annotations were drawn at" if mask is not None else f"its mask file{named} is"
    if mask is None:
      if ex.get(keys.MASK_BYTES) is None:
        raise ExampleError("missing_mask", f"no mask found at {ex.get(keys.MASK_SOURCE)}")
      mask = mask_to_ids(_open(ex[keys.MASK_BYTES], "mask", max_pixels))
    if mask.shape != image.shape[:2]:
      raise ExampleError(
        "mask_size_mismatch",
        f"the image is {image.shape[1]}x{image.shape[0]} (width x height), {what} "
        f"{mask.shape[1]}x{mask.shape[0]}",
      )
    out[keys.INSTANCE_MASK] = mask
    return out

  return fn


def _bilinear_weights(in_size: int, out_size: int):
  # Same arithmetic as TensorFlow's ResizeBilinear with half-pixel centers
  # (what tf.image.resize(method="bilinear", antialias=False) runs), in
  # float32, so that the serving graph reproduces this op.
  scale = np.float32(in_size) / np.float32(out_size)
  src = (np.arange(out_size, dtype=np.float32) + np.float32(0.5)) * scale - np.float32(0.5)
  floor = np.floor(src)
  lower = np.maximum(floor.astype(np.int64), 0)
  upper = np.minimum(np.ceil(src).astype(np.int64), in_size - 1)
  return lower, upper, (src - floor).astype(np.float32)


def resize_bilinear(image: np.ndarray, height: int, width: int) -> np.ndarray:
  """Resizes uint8 [H, W, C] to [height, width, C] as tf.image.resize does.

  Returns float32 values before rounding; `resize_image` rounds to uint8.
  """
  if image.shape[:2] == (height, width):
    return image.astype(np.float32)
  return bilinear_from(
    lambda ys, xs: image[ys][:, xs], image.shape[0], image.shape[1], height, width
  )


def bilinear_from(take, in_height: int, in_width: int, height: int, width: int) -> np.ndarray:
  """TensorFlow's bilinear resize (half-pixel centres, float32) of an
  in_height x in_width array read through `take(rows, cols)` -> [len(rows),
  len(cols), C] (its pixels at those indices): only the pixels the output
  needs are read and cast."""
  y0, y1, fy = _bilinear_weights(in_height, height)
  x0, x1, fx = _bilinear_weights(in_width, width)
  fx = fx[None, :, None]
  f32 = lambda ys, xs: take(ys, xs).astype(np.float32)  # pylint: disable=unnecessary-lambda-assignment
  top_left, bottom_left = f32(y0, x0), f32(y1, x0)
  top = top_left + (f32(y0, x1) - top_left) * fx
  bottom = bottom_left + (f32(y1, x1) - bottom_left) * fx
  return top + (bottom - top) * fy[:, None, None]


def resize_image(image: np.ndarray, height: int, width: int) -> np.ndarray:
  """Bilinear resize of uint8 RGB, rounded half to even back to uint8."""
  return np.clip(np.rint(resize_bilinear(image, height, width)), 0, 255).astype(np.uint8)


def nearest_indices(in_size: int, out_size: int) -> np.ndarray:
  """Source index of each output pixel for nearest resize (half-pixel centers)."""
  scale = np.float32(in_size) / np.float32(out_size)
  src = np.floor((np.arange(out_size, dtype=np.float32) + np.float32(0.5)) * scale)
  return np.minimum(src.astype(np.int64), in_size - 1)


def resize_nearest(mask: np.ndarray, height: int, width: int) -> np.ndarray:
  """Nearest-neighbour resize of a label map (ids are never blended)."""
  if mask.shape[:2] == (height, width):
    return mask
  return mask[nearest_indices(mask.shape[0], height)][:, nearest_indices(mask.shape[1], width)]


# The pad value of image pixels outside a fitted image: black. A fixed value,
# known before tf.Transform's analysis (the data set's mean is known only
# after it), and the same in numpy and TensorFlow. The label marks the same
# pixels ignore (255), so padding is never taught as background and never
# counted as an error.
IMAGE_PAD = 0


def fitted_size(in_height, in_width, height, width, xp=np):
  """The (h, w) an in_height x in_width image takes in a height x width frame
  when resized with its aspect ratio kept: the limiting side fills the
  frame, the other is rounded to the nearest pixel (halves up), at least 1.

  Integer arithmetic only, so that the Beam job (`xp=np`, Python or numpy
  integers) and the serving graph (`xp=tf`, int32 tensors: TFLite's builtins
  divide no int64) agree exactly.
  The image sits at the frame's top-left corner: a pixel (x, y) of the frame
  is valid when x < w and y < h.
  """
  # The computed term first: TensorFlow takes the dtype from the first argument.
  h = xp.maximum(xp.minimum((2 * in_height * width + in_width) // (2 * in_width), height), 1)
  w = xp.maximum(xp.minimum((2 * in_width * height + in_height) // (2 * in_height), width), 1)
  return h, w


def pad_to(array: np.ndarray, height: int, width: int, value: int) -> np.ndarray:
  """`array` [h, w, ...] at the top-left of a height x width frame filled with `value`."""
  out = np.full((height, width) + array.shape[2:], value, array.dtype)
  out[: array.shape[0], : array.shape[1]] = array
  return out


def resize_twin(ex, size: int, width: int = None):
  """`resize` in TensorFlow: the same fitted size, bilinear with half-pixel
  centres and rounding half to even, the same padding.

  Clicks in the example (given in the input image's pixels at serving time)
  move to the pixel of nearest centre in the fitted image, clamped into it.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  height, width = int(size), int(width or size)
  image = ex[keys.IMAGE]
  # int32 sizes and float32 pixels until the end: what TFLite's builtins
  # divide, pad and resize (no int64 division, no uint8 padding).
  in_shape = tf.shape(image)
  in_h, in_w = in_shape[0], in_shape[1]
  fit_h, fit_w = fitted_size(in_h, in_w, height, width, xp=tf)
  fitted = tf.stack([fit_h, fit_w])
  resized = tf.image.resize(tf.cast(image, tf.float32)[None], fitted, "bilinear")[0]
  resized = tf.clip_by_value(tf.round(resized), 0, 255)
  out = dict(ex)
  padding = tf.stack(
    [tf.stack([0, height - fit_h]), tf.stack([0, width - fit_w]), tf.zeros([2], tf.int32)]
  )
  out[keys.IMAGE] = tf.cast(tf.pad(resized, padding, constant_values=IMAGE_PAD), tf.uint8)
  out[keys.IMAGE].set_shape([height, width, 3])
  out[keys.HEIGHT], out[keys.WIDTH] = tf.cast(in_h, tf.int64), tf.cast(in_w, tf.int64)
  for key in (keys.POSITIVE_CLICKS, keys.NEGATIVE_CLICKS):
    if key in ex:
      out[key] = scale_clicks(ex[key], in_h, in_w, fit_h, fit_w)
  if keys.PREVIOUS_MASK in ex:  # Into the records' frame, nearest, padded with none.
    previous = tf.expand_dims(tf.cast(tf.cast(ex[keys.PREVIOUS_MASK], tf.bool), tf.float32), -1)
    previous = tf.image.resize(previous[None], fitted, method="nearest")[0, ..., 0]
    out[keys.PREVIOUS_MASK] = tf.pad(previous, padding[:2]) > 0
  return out


def scale_clicks(clicks_xy, in_height, in_width, height, width):
  """Clicks (x, y) in an in_height x in_width image -> the pixel of nearest
  centre in the height x width image, clamped into it (TensorFlow; the sizes
  may be tensors)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  c = tf.cast(tf.reshape(clicks_xy, [-1, 2]), tf.float32)
  f = lambda v: tf.cast(v, tf.float32)  # pylint: disable=unnecessary-lambda-assignment
  x = tf.clip_by_value(tf.floor((c[:, 0] + 0.5) * f(width) / f(in_width)), 0.0, f(width) - 1)
  y = tf.clip_by_value(tf.floor((c[:, 1] + 0.5) * f(height) / f(in_height)), 0.0, f(height) - 1)
  return tf.cast(tf.stack([x, y], axis=1), tf.int64)


class ResizeServing(ServingSide):
  """`resize` at serving (built with the op's arguments): the model's output
  at the records' size is cut to the region the request's image fills there
  (`fitted_size`; the padding is dropped), then resized to the request's
  size."""

  def __init__(self, size: int, width: int = None):
    self.height, self.width = int(size), int(width or size)
    self.size = (self.height, self.width)

  def to_request(self, prob, out, height, width):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    height, width = tf.cast(height, tf.int32), tf.cast(width, tf.int32)
    fit_h, fit_w = fitted_size(height, width, self.height, self.width, xp=tf)
    valid = tf.expand_dims(prob[:fit_h, :fit_w], -1)
    return tf.image.resize(valid, tf.stack([height, width]), method="bilinear")[..., 0]


@register_op(
  "resize",
  reads=(keys.IMAGE,),
  produces={keys.IMAGE: IMAGE, **SIZE_FEATURES},
  intermediate=(keys.INSTANCE_MASK,),
  twin=resize_twin,
  serving=ResizeServing,
)
def resize(size: int, width: int = None):
  """Fits `image` into a size x width frame with its aspect ratio kept.

  The image is resized (bilinear) to `fitted_size` and padded at the bottom
  and right with `IMAGE_PAD`; `instance_mask` is resized (nearest) the same
  way and padded with ignore (255). `height` and `width` keep the size of
  the image before the resize (the source's, after `decode`), from which
  `fitted_size` gives the valid region and the scale.
  """
  height, width = int(size), int(width or size)

  def fn(ex):
    in_h, in_w = ex[keys.IMAGE].shape[:2]
    fit_h, fit_w = (int(v) for v in fitted_size(in_h, in_w, height, width))
    out = dict(ex)
    out[keys.IMAGE] = pad_to(resize_image(ex[keys.IMAGE], fit_h, fit_w), height, width, IMAGE_PAD)
    out[keys.HEIGHT], out[keys.WIDTH] = in_h, in_w
    if keys.INSTANCE_MASK in ex:
      out[keys.INSTANCE_MASK] = pad_to(
        resize_nearest(ex[keys.INSTANCE_MASK], fit_h, fit_w), height, width, keys.IGNORE
      )
    return out

  return fn


def instance_areas(instance_mask: np.ndarray) -> np.ndarray:
  """int64 [256]: the pixels of each instance id of a uint8 instance mask."""
  return np.bincount(instance_mask.ravel(), minlength=keys.IGNORE + 1).astype(np.int64)


@register_op("object_areas", reads=(keys.INSTANCE_MASK,), intermediate=(keys.SOURCE_AREAS,))
def object_areas():
  """Measures every instance before `resize` changes its size.

  Writes `source_areas`: int64 [256], the pixels of each id of
  `instance_mask` as the op finds it (placed after `decode`: at the source
  resolution). `split_objects` lists objects by it and `require_min_area`
  reads it.
  """

  def fn(ex):
    out = dict(ex)
    out[keys.SOURCE_AREAS] = instance_areas(ex[keys.INSTANCE_MASK])
    return out

  return fn


def listed_objects(ex, max_objects: int = 0):
  """The object ids of a scene, ascending: those of `source_areas` when
  `object_areas` measured them, else those of `instance_mask`; at most
  `max_objects` (the largest; 0: all).

  Raises:
    ExampleError: no object (only background and ignore pixels).
  """
  if keys.SOURCE_AREAS in ex:
    counts = np.asarray(ex[keys.SOURCE_AREAS])
    ids = np.flatnonzero(counts)
    counts = counts[ids]
  else:
    ids, counts = np.unique(ex[keys.INSTANCE_MASK], return_counts=True)
  keep = (ids != keys.BACKGROUND) & (ids != keys.IGNORE)
  ids, counts = ids[keep], counts[keep]
  if ids.size == 0:
    raise ExampleError("mask_has_no_object", "the mask holds only background and ignore pixels")
  order = np.argsort(-counts, kind="stable")
  if max_objects:
    order = order[:max_objects]
  return sorted(ids[order].tolist())


def object_label(instance_mask: np.ndarray, object_id: int) -> np.ndarray:
  """uint8 [H, W], an object's label: 1 where `instance_mask` holds
  `object_id`, keys.IGNORE where it holds IGNORE, 0 elsewhere (other objects
  are background)."""
  ignore = instance_mask == keys.IGNORE
  return np.where(ignore, keys.IGNORE, instance_mask == object_id).astype(np.uint8)


@register_op(
  "split_objects",
  reads=(keys.INSTANCE_MASK,),
  produces={keys.OBJECT_ID: OBJECT_ID, keys.MASK: MASK},
)
def split_objects(max_objects: int = 0):
  """Fans a scene out into one example per object instance.

  Objects are the ids of `instance_mask`; when the example holds
  `source_areas` (`object_areas` ran before `resize`), they are the ids
  measured there, so an object the resize erased is still listed (its mask
  holds no object pixel, and an op after says why it cannot be used), and
  "largest" means largest at the source.

  Args:
    max_objects: keep at most this many objects per image (largest first);
      0 keeps all.
  """

  def fn(ex):
    inst = ex[keys.INSTANCE_MASK]
    out = []
    for i in listed_objects(ex, max_objects):
      obj = dict(ex)
      obj[keys.OBJECT_ID] = int(i)
      obj[keys.MASK] = object_label(inst, i)
      out.append(obj)
    return out

  return fn


@register_op("require_min_area", reads=(keys.OBJECT_ID, keys.SOURCE_AREAS))
def require_min_area(min_area: int):
  """An object covering fewer than `min_area` pixels at the source resolution
  (`source_areas`, measured by `object_areas` before `resize`) is an error
  with reason `object_below_min_area`, its area in the detail."""
  min_area = int(min_area)

  def fn(ex):
    area = int(ex[keys.SOURCE_AREAS][int(ex[keys.OBJECT_ID])])
    if area < min_area:
      raise ExampleError(
        "object_below_min_area",
        f"object {int(ex[keys.OBJECT_ID])} covers {area} pixels at the source "
        f"resolution, under --min-object-area {min_area}",
      )
    return ex

  return fn


@register_op(
  "require_label", reads=(), produces={keys.LABEL: Feature("string", shape=(), role="label")}
)
def require_label():
  """Classification: an example without a `label` is an error, not a guess."""

  def fn(ex):
    if not ex.get("label"):
      raise ExampleError("missing_label", "no class label (folder name or manifest column)")
    return ex

  return fn
