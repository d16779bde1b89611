"""The serving export: raw inputs in, predictions out, preprocessing in-graph.

Layout, as TensorFlow Serving expects: `MODEL_DIR/export/<version>/`, the
version being the Unix time of the export. The SavedModel is self-contained:
the tf.Transform graph (and its vocabulary) and the TensorFlow twins of the
ops are traced into it, so it keeps working after the preprocessing output is
deleted, without the ops module.

The serving graph follows the chain of the prep output's `features.json`:
every op of the chain that produces or changes a model input runs through its
TensorFlow twin (`register_op(..., twin=...)`), in chain order, on the
request; then each model input becomes the raw bytes the records hold, the
exported tf.Transform layer normalizes them, and the model predicts. With the
default chain: `decode` (decoded pixels pass), `resize` to the records' size
(bilinear, half-pixel centres, rounded to uint8; clicks moved to the pixel of
nearest centre), `sample_clicks` (the request's clicks stand in for sampled
ones), `distance_maps` (and/or `click_disks`), then any user op. An op that
changes a model input without a twin stops the export (and `fit`, before
training) with an error naming it (`ServingPlanError`).

Segmentation, signature `serving_default` (one image per request):
  inputs   image            uint8 [H, W, 3], any size
           positive_clicks  int32 [P, 2], (x, y) = (column, row); P >= 1
           negative_clicks  int32 [N, 2], same; N may be 0
  outputs  probabilities    float32 [H, W], object probability
           mask             uint8 [H, W], 1 object, 0 background
The image is a decoded uint8 array rather than PNG/JPEG bytes so that the
graph sees exactly the pixels the Beam job saw (no second JPEG decoder that
may round differently); `beam-train predict` decodes files for you. Clicks
outside the image are clamped to its border; no positive click, or an empty
image, is an InvalidArgument error for that request.

Segmentation, signature `serve_examples` (batch scoring, TFX convention):
  inputs   examples         string [B]: serialized tf.Examples in the raw
                            schema; `image` (raw uint8 bytes at the records'
                            size), `positive_clicks`, `negative_clicks` are
                            read, anything else is ignored
  outputs  probabilities    float32 [B, S, S]; mask uint8 [B, S, S]

Classification, signature `serving_default`:
  inputs   image_bytes      string [B]: encoded PNG/JPEG/BMP/GIF files
  outputs  probabilities    float32 [B, C]; label string [B]; classes string [C]
"""

import os
import time
from typing import Dict

import keras
import tensorflow as tf
import tensorflow_transform as tft

from beam_prep import keys
from beam_prep.features import FeatureTable
from beam_prep.preprocessing import decode_feature
from train import models
from train.prep_output import PrepOutput
# ServingPlanError and to_raw_bytes are imported from here too (the twins'
# tests, the benchmark), though they live in train.serving_inputs.
from train.serving_inputs import ServingPlanError, to_raw_bytes  # pylint: disable=unused-import
from train.serving_inputs import Example, model_inputs, run_plan, serving_plan
from train.tasks import make_task


class _Server(tf.Module):
  """Holds the Keras 3 model, the tf.Transform (tf_keras) layer and the twins."""

  def __init__(self, model, tft_output: tft.TFTransformOutput, table: FeatureTable):
    super().__init__()
    self.model = model
    # Keras 3 variables wrap tf.Variables. Saved only through the wrappers,
    # the SavedModel loads in TF2 but not in session-based loaders
    # (TensorFlow Serving, saved_model_cli run: "Could not find variable").
    # Tracking the underlying tf.Variables as well fixes both.
    self.model_tf_variables = [v.value if hasattr(v, "value") else v for v in model.variables]
    self.tft_layer = tft_output.transform_features_layer()
    self._table = table
    self._plan = serving_plan(table)

  def raw_model_input(self, ex: Example) -> Dict[str, tf.Tensor]:
    """One request example -> {model input key: raw bytes scalar}, by the twins."""
    return run_plan(self._plan, self._table, ex)

  def model_input(self, raw: Dict[str, tf.Tensor]) -> tf.Tensor:
    """[B] raw bytes per model input -> the model's input [B, H, W, C]."""
    return model_inputs(self._table, self.tft_layer(raw))

  def batched_raw(self, elems, fn):
    """`fn` (one request example -> raw model inputs) mapped over a batch `elems`."""
    keys_ = self._table.keys("model_input")
    sig = {k: tf.TensorSpec([], tf.string) for k in keys_}
    return tf.map_fn(fn, elems, fn_output_signature=sig)


class SegmentationServer(_Server):
  """Image and clicks in, mask out."""

  def _predict(self, inputs):
    logits = self.model(inputs, training=False)
    return tf.sigmoid(tf.cast(logits, tf.float32))[..., 0]

  @tf.function(input_signature=[
      tf.TensorSpec([None, None, 3], tf.uint8, name="image"),
      tf.TensorSpec([None, 2], tf.int32, name="positive_clicks"),
      tf.TensorSpec([None, 2], tf.int32, name="negative_clicks"),
  ])
  def serve(self, image, positive_clicks, negative_clicks):
    h, w = tf.shape(image)[0], tf.shape(image)[1]
    with tf.control_dependencies([
        tf.debugging.assert_positive(h * w, message="image is empty"),
        tf.debugging.assert_positive(tf.shape(positive_clicks)[0],
                                     message="at least one positive click is required")]):
      image = tf.identity(image)
    ex = {keys.IMAGE: image,
          keys.POSITIVE_CLICKS: tf.cast(positive_clicks, tf.int64),
          keys.NEGATIVE_CLICKS: tf.cast(negative_clicks, tf.int64)}
    raw = {k: v[None] for k, v in self.raw_model_input(ex).items()}
    prob = self._predict(self.model_input(raw))
    prob = tf.image.resize(prob[..., None], tf.stack([h, w]), method="bilinear")[0, :, :, 0]
    return {"probabilities": prob, "mask": tf.cast(prob > 0.5, tf.uint8)}

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
  def serve_examples(self, examples):
    spec = self._table.raw_feature_spec(
        [keys.IMAGE, keys.POSITIVE_CLICKS, keys.NEGATIVE_CLICKS])
    parsed = tf.io.parse_example(examples, spec)
    images = decode_feature(parsed[keys.IMAGE], self._table[keys.IMAGE], self._table.image_size)

    def one(args):
      image, pos, neg = args
      return self.raw_model_input({keys.IMAGE: image,
                                   keys.POSITIVE_CLICKS: tf.reshape(pos, [-1, 2]),
                                   keys.NEGATIVE_CLICKS: tf.reshape(neg, [-1, 2])})

    raw = self.batched_raw((images, tf.RaggedTensor.from_sparse(parsed[keys.POSITIVE_CLICKS]),
                             tf.RaggedTensor.from_sparse(parsed[keys.NEGATIVE_CLICKS])), one)
    prob = self._predict(self.model_input(raw))
    return {"probabilities": prob, "mask": tf.cast(prob > 0.5, tf.uint8)}

  def signatures(self):
    return {"serving_default": self.serve, "serve_examples": self.serve_examples}


class ClassificationServer(_Server):
  """Encoded images in; class probabilities and label strings out."""

  def __init__(self, model, tft_output: tft.TFTransformOutput, table: FeatureTable):
    super().__init__(model, tft_output, table)
    self.classes = tf.constant(tft_output.vocabulary_by_name(keys.LABEL_VOCABULARY))

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")])
  def serve(self, image_bytes):
    raw = self.batched_raw(image_bytes,
                            lambda data: self.raw_model_input({keys.IMAGE_BYTES: data}))
    logits = self.model(self.model_input(raw), training=False)
    prob = tf.nn.softmax(tf.cast(logits, tf.float32), axis=-1)
    return {"probabilities": prob, "label": tf.gather(self.classes, tf.argmax(prob, axis=-1)),
            "classes": self.classes}

  def signatures(self):
    return {"serving_default": self.serve}


SERVERS = {"segmentation": SegmentationServer, "classification": ClassificationServer}


def export_model(model, tft_output: tft.TFTransformOutput, table: FeatureTable,
                 export_base: str) -> str:
  """Writes `EXPORT_BASE/<unix time>/` for the table's task and returns its path."""
  server = SERVERS[table.task](model, tft_output, table)
  version = int(time.time())
  while tf.io.gfile.exists(os.path.join(export_base, str(version))):
    version += 1
  path = os.path.join(export_base, str(version))
  tf.saved_model.save(server, path, signatures=server.signatures())
  return path


def export_trained(data_dir: str, output: str, model_file: str = "", model_dir: str = "",
                   model_module: str = "") -> str:
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

  Raises:
    ValueError: the model cannot be loaded, or does not take the records'
      inputs or give the task's outputs (the message says which).
  """
  if bool(model_file) == bool(model_dir):
    raise ValueError("give one of --model-file (a .keras file) or --model-dir (a beam-train "
                     "fit model dir)")
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
      raise ValueError(f"cannot load the Keras model {model_file}: {type(e).__name__}: {e} "
                       "(a custom layer's module goes in --model-module)") from None
    name = model_file
  task.check_model(model, name)
  return export_model(model, prep.tft_output, prep.table, output)


def latest_export(model: str) -> str:
  """An export folder: `model` itself, or the newest version under `model` or
  model/export/."""
  if tf.io.gfile.exists(os.path.join(model, "saved_model.pb")):
    return model
  for base in (model, os.path.join(model, "export")):
    versions = ([v.rstrip("/") for v in tf.io.gfile.listdir(base)]
                if tf.io.gfile.isdir(base) else [])
    versions = sorted((int(v) for v in versions if v.isdigit()
                       and tf.io.gfile.exists(os.path.join(base, v, "saved_model.pb"))),
                      reverse=True)
    if versions:
      return os.path.join(base, str(versions[0]))
  raise FileNotFoundError(f"no SavedModel at {model}, and no version under it or under "
                          f"{os.path.join(model, 'export')}")
