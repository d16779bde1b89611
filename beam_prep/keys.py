"""Feature keys and the layout of a preprocessing output: the names
`beam_prep` and `train` share.

This module imports nothing but the standard library, so the trainer, the
serving export and Dataflow workers can all read it cheaply.

What a record holds is not listed here: each op declares the features it
produces (`register_op(..., produces={key: Feature(...)})`), and every run
writes the resulting table to `PREP_OUTPUT/features.json` (key, dtype,
shape, role, normalization, in order). With the default segmentation chain
an example is one (object, click variant), and a record holds one object with
all its examples (`beam_prep.features`: the features listed as stacked below
hold one value per variant, the others are stored once):

| key                  | declared by    | content                                  |
|----------------------|----------------|------------------------------------------|
| `image_id`           | read           | stem of the source image                 |
| `image`              | decode,        | uint8 [S, S, 3] RGB; model input: the    |
|                      | crop_objects   | object's crop (`crop_box`) resized to S, |
|                      |                | padded black where the box leaves the    |
|                      |                | image (`--crop none`: `resize`, the whole|
|                      |                | image fitted with its aspect ratio kept, |
|                      |                | long side S, padded at bottom or right)  |
| `height`, `width`    | decode         | the source image's size                  |
| `object_id`          | crop_objects   | instance id in the source mask (1..254)  |
| `mask`               | crop_objects   | uint8 [S, S, 1]: 1 object, 0 background, |
|                      |                | 255 ignore (the padding too); the label  |
| `crop_box`           | crop_objects   | int64 [4]: (x0, y0, x1, y1) of the crop  |
|                      |                | in source pixels (x1, y1 exclusive)      |
| `positive_clicks`    | sample_clicks  | int64 list of (x, y) pairs, x = column   |
| `negative_clicks`    | sample_clicks  | same                                     |
| `negative_strategy`, `variant`, `flipped` | sample_clicks | int64          |
| `distance_maps`      | distance_maps  | uint8 [S, S, 2]: distance to the nearest |
|                      |                | positive / negative click, capped at 255 |
| `click_disks`        | click_disks    | uint8 [S, S, 2]: 1 within the radius of  |
|                      |                | a positive / negative click              |

Stacked (one value per variant): the clicks, `negative_strategy`, `variant`,
the click encodings, and with `flip_variants` also `image`, `mask` and
`flipped`. Per-pixel features are stored as the raw bytes of the array, or
zlib-compressed where their op declares it (the mask, the click encodings);
the trainer and the serving graph see the raw bytes either way. The exported
tf.Transform graph outputs every model input under its own key (float32,
normalized as declared) and, from the label, `label` and `label_weight`
(segmentation: float32 [S, S, 1], weight 0 on ignore pixels) or `label`
(classification: int64 index into the vocabulary `LABEL_VOCABULARY`).
"""

IMAGE_ID = "image_id"
OBJECT_ID = "object_id"
VARIANT = "variant"
HEIGHT = "height"
WIDTH = "width"
IMAGE = "image"
DISTANCE_MAPS = "distance_maps"
MASK = "mask"
POSITIVE_CLICKS = "positive_clicks"
NEGATIVE_CLICKS = "negative_clicks"
NEGATIVE_STRATEGY = "negative_strategy"
FLIPPED = "flipped"
CLICK_DISKS = "click_disks"
PREV_MASK = "prev_mask"  # The previous prediction as a model input (`ops.previous`).
CROP_BOX = "crop_box"
LABEL = "label"

# Keys of examples inside the job that records do not keep: what a layout's
# pointer names (the image's and mask's paths or URLs, the split its input
# list fixes, if any) and the bytes read from them.
SOURCE = "source"
MASK_SOURCE = "mask_source"
SPLIT = "split"
IMAGE_BYTES = "image_bytes"
MASK_BYTES = "mask_bytes"
INSTANCE_MASK = "instance_mask"
SOURCE_AREAS = "source_areas"  # int64 [256]: pixels of each instance id at the source
# Serving: the mask of the previous prediction, at the request's size (the
# crop is derived from it; the geometric op's twin moves it into the records'
# frame for `prev_mask`).
PREVIOUS_MASK = "previous_mask"
# Serving: the mask a crop is cut around when there is no previous one yet.
CROP_MASK = "crop_mask"

# Transformed feature keys (outputs of the tf.Transform graph).
LABEL_WEIGHT = "label_weight"
LABEL_VOCABULARY = "label"

# Mask values, as in Pascal VOC's SegmentationObject PNGs.
BACKGROUND = 0
IGNORE = 255

# File names of the images a folder is listed for (the page's picker, the
# DirectRunner's input count); the decoder itself goes by the bytes.
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")

# Distance maps are stored as uint8 and capped here.
MAX_DISTANCE = 255

# Images declaring more pixels are refused before they are decoded: larger
# than any photograph a segmentation data set holds (8k x 8k), far below what
# would exhaust a worker's memory when decoded.
MAX_PIXELS = 64_000_000

# Layout of a preprocessing output directory.
RECORDS_DIR = "records"
ERRORS_DIR = "errors"
TRANSFORM_DIR = "transform"  # holds transform_fn/, transformed_metadata/, metadata/
MANIFEST_FILE = "manifest.json"
# A job's temp folders in its output, removed when it ends (or by the next --add).
TEMP_PREFIX = ".temp-"
CONFIG_FILE = "config.json"
PREVIEW_FILE = "preview.png"
# Written last by the job: the output is complete (the trainer refuses one without it).
SUCCESS_FILE = "_SUCCESS"
TRAIN_SPLIT = "train"
EVAL_SPLIT = "eval"
RECORD_SUFFIX = ".tfrecord"
GZIP_SUFFIX = ".gz"

# A model directory's settings file (`beam-train fit --model-dir`): beam-prep
# reads the data a model was trained on from it (`PrepOutput.of_model`); the
# rest of a model directory's layout is the trainer's (`train.model_layout`).
MODEL_CONFIG_FILE = "config.json"


def is_remote(path: str) -> bool:
  """Whether a path is a URL (gs://, s3://, ...) rather than on this machine's disk."""
  return "://" in path


def record_pattern(output_dir: str, split: str) -> str:
  """Glob of a split's shards in a preprocessing output (local or gs://)."""
  return f"{output_dir.rstrip('/')}/{RECORDS_DIR}/{split}-*{RECORD_SUFFIX}*"


def compression_of(path: str) -> str:
  """TFRecord compression of a shard, from its name: "GZIP" or ""."""
  return "GZIP" if path.endswith(GZIP_SUFFIX) else ""
