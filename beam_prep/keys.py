"""Feature keys: the only names `beam_prep` and `train` share.

This module imports nothing but the standard library, so the trainer, the
serving export and Dataflow workers can all read it cheaply.

Record contract (one `tf.train.Example` per object and click variant; the
tf.Transform *raw* schema, written to `PREP_OUTPUT/metadata/`):

| key                  | type            | content                                   |
|----------------------|-----------------|-------------------------------------------|
| `image_id`           | bytes           | stem of the source image                  |
| `object_id`          | int64           | instance id in the source mask (1..254)   |
| `variant`            | int64           | index of the click sampling (0..K-1)      |
| `height`, `width`    | int64           | stored size (the pipeline's image size)   |
| `image`              | bytes           | raw uint8 RGB, shape [height, width, 3]   |
| `distance_maps`      | bytes           | raw uint8, shape [height, width, 2]:      |
|                      |                 | channel 0 positive, 1 negative; Euclidean |
|                      |                 | distance to nearest click, capped at 255  |
| `mask`               | bytes           | raw uint8 [height, width]: 1 object,      |
|                      |                 | 0 background, 255 ignore                  |
| `positive_clicks`    | int64 list      | flattened (x, y) pairs, x = column        |
| `negative_clicks`    | int64 list      | flattened (x, y) pairs                    |
| `negative_strategy`  | int64           | 1, 2 or 3 (Xu et al. 2016), 0 if none     |
| `flipped`            | int64           | 1 if this variant is mirrored left-right  |

Transformed features (the exported tf.Transform graph's outputs):

| key                  | dtype   | shape          | value range                |
|----------------------|---------|----------------|----------------------------|
| `image`              | float32 | [H, W, 3]      | per-channel standardized   |
| `distance_maps`      | float32 | [H, W, 2]      | distance / 255, in [0, 1]  |
| `label`              | float32 | [H, W]         | 1 object, 0 otherwise      |
| `label_weight`       | float32 | [H, W]         | 0 on ignore pixels, else 1 |

Classification records (`beam-prep classification`): `image_id`, `height`,
`width`, `image` as above, and `label` (bytes, the class folder's name).
Transformed: `image` as above and `label` int64, the index of the class in
the tf.Transform vocabulary named `LABEL_VOCABULARY` (most frequent first).
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

# Transformed feature keys (outputs of the tf.Transform graph).
LABEL = "label"
LABEL_WEIGHT = "label_weight"
LABEL_VOCABULARY = "label"

# Mask values, as in Pascal VOC's SegmentationObject PNGs.
BACKGROUND = 0
IGNORE = 255

# Distance maps are stored as uint8 and capped here.
MAX_DISTANCE = 255

# Layout of a preprocessing output directory.
RECORDS_DIR = "records"
ERRORS_DIR = "errors"
TRANSFORM_DIR = "transform"  # holds transform_fn/, transformed_metadata/, metadata/
MANIFEST_FILE = "manifest.json"
CONFIG_FILE = "config.json"
PREVIEW_FILE = "preview.png"
TRAIN_SPLIT = "train"
EVAL_SPLIT = "eval"
RECORD_SUFFIX = ".tfrecord"
