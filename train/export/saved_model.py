"""The serving export: raw inputs in, predictions out, preprocessing in-graph.

Layout, as TensorFlow Serving expects: `MODEL_DIR/export/<version>/`, the
version being the Unix time of the export. The SavedModel is self-contained:
the tf.Transform graph (and its vocabulary) and the TensorFlow twins of the
ops are traced into it, so it keeps working after the preprocessing output is
deleted, without the ops module.

The serving graph follows the chain of the prep output's `features.json`:
every op of the chain that produces or changes a model input runs through its
TensorFlow twin (`register_op(..., twin=...)`), in chain order, on the
request; then the exported transform normalizes each model input (looked up
in the table of its values the transform gives, `serving_inputs.
transform_tables`; or, for a transform that is no such table, written as the
raw bytes the records hold for the tf.Transform layer), and the model
predicts. `train.export.portable` writes the click signatures as TFLite and ONNX
files (`--format`). With the
default chain: `decode` (decoded pixels pass), `crop_objects` (the box of the
previous mask and the positive clicks, cut and resized exactly as the Beam
job cut its objects; clicks moved into it: `beam_prep.ops.crop`), or with
`--crop none` `resize` (the whole image with the aspect ratio kept),
`sample_clicks` (the request's clicks stand in for sampled ones),
`distance_maps` (and/or `click_disks`), then any user op. An op that changes
a model input without a twin stops the export (and `fit`, before training)
with an error naming it (`ServingPlanError`).

Segmentation, signature `serving_default` (one image per request):
  inputs   image            uint8 [H, W, 3], any size
           positive_clicks  int32 [P, 2], (x, y) = (column, row); P >= 1
           negative_clicks  int32 [N, 2], same; N may be 0
  outputs  probabilities    float32 [H, W], object probability
           mask             uint8 [H, W], 1 object (probability > 0.49, the NoC
                            protocol's threshold: train.evaluate.clicker.PRED_THR), 0 background
Crop records: without a previous mask (the first click) the crop is cut around
the whole image (`beam_prep.ops.crop.CropServing`, the op's serving side),
else around the previous mask and the positive clicks; the crop's
probabilities are placed back in its box, 0 outside. Whole-image records: the
model's output at the records' size is cropped to the region the image fills
there (`beam_prep.ops.image.fitted_size`; the padding is dropped), then
resized to H x W. Either way the probabilities are then refined by the image
where the model saw it (`train.export.guided_filter`).
The image is the decoded pixels as shown (EXIF orientation applied, as the
Beam job and `beam-train predict` decode files); `serve_encoded` takes the
file instead. Clicks outside the image are clamped to its border; no
positive click, or an empty image, is an InvalidArgument error for that
request.

Segmentation, signature `serve_iterative`: the inputs of `serving_default`
plus `previous_mask` uint8 [H, W] (the previous click's mask; all 0: none),
the same outputs.

Segmentation, signatures `serve_encoded` and `serve_iterative_encoded`
(batched, TF Serving's convention for files: REST sends `{"b64": ...}`):
  inputs   image_bytes      string [B]: encoded PNG/JPEG/GIF/BMP/WebP files
           positive_clicks  int32 [B, P, 2]; negative_clicks int32 [B, N, 2]
           previous_mask    uint8 [B, H, W] (`serve_iterative_encoded` only)
  outputs  mask_bytes       string [B]: PNG files, greyscale uint8 0 / 255, the
                            protocol's mask (exactly `serving_default`'s mask)
           probabilities_bytes  string [B]: PNG files, greyscale uint8
                            round(p * 255) of the probabilities (the float
                            probabilities are the array signatures')
Each file is decoded in the graph by the twin of the chain's op that reads
image files (`serving_inputs.image_decoder`: EXIF orientation applied;
JPEGs with libjpeg's accurate DCT, the pixels PIL gives the Beam job) and given to
`serving_default`'s (`serve_iterative`'s)
own function, so each answer is that signature's on the decoded pixels,
encoded. Each image keeps its own size.

Segmentation, signature `serve_examples` (batch scoring, TFX convention):
  inputs   examples         string [B]: serialized tf.Examples in the raw
                            schema, one (object, variant) each (the example
                            view, `RecordCodec.encode`; a job's records, which
                            stack an object's variants, give these through
                            `decode_examples`); `image` (raw uint8 bytes at the
                            records' size), `positive_clicks`,
                            `negative_clicks` are read, anything else is ignored
  outputs  probabilities    float32 [B, S, S]; mask uint8 [B, S, S], at the
                            records' size, padding included
An example without those features, of an image of other bytes than S x S x 3,
or with no positive click is refused with a message naming the feature; the
job's records themselves are too (their clicks are bytes lists, one per
variant: `train.export.served.parse_message` says so).

Classification, signature `serving_default`:
  inputs   image_bytes      string [B]: encoded PNG/JPEG/GIF/BMP/WebP files
  outputs  probabilities    float32 [B, C]; label string [B]; classes string [C]
"""

import os
import time
from typing import Sequence

import keras
import tensorflow as tf
import tensorflow_transform as tft

from beam_prep.features import FeatureTable
from beam_prep.prep_output import PrepOutput
from train import graphs, model_layout, models
from train.export import portable

# ServingPlanError and to_raw_bytes are imported from here too (the twins'
# tests, the benchmark), though they live in train.export.serving_inputs.
from train.export.serving_inputs import ServingPlanError, to_raw_bytes  # noqa: F401
from train.export.serving_inputs import serving_plan
from train.export.servers import ClassificationServer, SegmentationServer  # noqa: F401  (importers)
from train.tasks import make_task, task_class


def export_model(
  model,
  tft_output: tft.TFTransformOutput,
  table: FeatureTable,
  export_base: str,
  formats: Sequence[str] = (portable.SAVEDMODEL,),
) -> str:
  """Writes `EXPORT_BASE/<unix time>/` for the table's task, in `formats`
  (`train.export.portable`: the SavedModel, and TFLite and ONNX files of the click
  signatures), and returns its path.

  Raises:
    ValueError: a portable format cannot be written (the reason), before
      anything is.
  """
  server = task_class(table.task).server(model, tft_output, table)
  version = int(time.time())
  while tf.io.gfile.exists(os.path.join(export_base, str(version))):
    version += 1
  path = os.path.join(export_base, str(version))

  def save(folder):
    with graphs.explained(f"export to {path}"):
      tf.saved_model.save(server, folder, signatures=server.signatures())

  portable.export_formats(server, path, formats, save)
  return path


def export_trained(
  data_dir: str,
  output: str,
  model_file: str = "",
  model_dir: str = "",
  model_module: str = "",
  formats: Sequence[str] = (portable.SAVEDMODEL,),
) -> str:
  """`beam-train export`: serves a trained Keras model with the records' preprocessing.

  Args:
    data_dir: the beam-prep output the model was trained on (its features.json
      and transform/ are what the serving graph carries).
    output: export base; the SavedModel goes to OUTPUT/<unix time>/.
    model_file: a Keras 3 model file (`model.save("x.keras")`), trained
      anywhere (for example on `train.dataset(...)`).
    model_dir: or a `beam-train fit` model dir: its model is rebuilt from
      model.json and its newest checkpoint.
    model_module: modules to import first (custom layers of the model file).
    formats: what to write (`train.export.portable.FORMATS`).

  Raises:
    ValueError: the model cannot be loaded, or does not take the records'
      inputs or give the task's outputs (the message says which).
  """
  if bool(model_file) == bool(model_dir):
    raise ValueError(
      "give one of --model-file (a .keras file) or --model-dir (a beam-train fit model dir)"
    )
  prep = PrepOutput(data_dir)
  task = make_task(prep.table, prep.tft_output)
  serving_plan(prep.table)  # An op without a twin fails before the model is loaded.
  models.import_model_modules(model_module)
  if model_dir:
    model, name = models.rebuild(model_dir), model_dir
  else:
    if not tf.io.gfile.exists(model_file):
      raise FileNotFoundError(f"no model file at {model_file}")
    try:
      model = keras.saving.load_model(model_file, compile=False)
    except Exception as e:  # pylint: disable=broad-except
      raise ValueError(
        f"cannot load the Keras model {model_file}: {type(e).__name__}: {e} "
        "(a custom layer's module goes in --model-module)"
      ) from None
    name = model_file
  task.check_model(model, name)
  return export_model(model, prep.tft_output, prep.table, output, formats)


def latest_export(model: str) -> str:
  """An export folder: `model` itself, or the newest version under `model` or
  model/export/."""
  if tf.io.gfile.exists(os.path.join(model, "saved_model.pb")):
    return model
  for base in (model, os.path.join(model, model_layout.EXPORT_DIR)):
    versions = [v.rstrip("/") for v in tf.io.gfile.listdir(base)] if tf.io.gfile.isdir(base) else []
    versions = sorted(
      (
        int(v)
        for v in versions
        if v.isdigit() and tf.io.gfile.exists(os.path.join(base, v, "saved_model.pb"))
      ),
      reverse=True,
    )
    if versions:
      return os.path.join(base, str(versions[0]))
  raise FileNotFoundError(
    f"no SavedModel at {model}, and no version under it or under "
    f"{os.path.join(model, model_layout.EXPORT_DIR)}"
  )
