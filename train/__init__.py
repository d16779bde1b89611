"""train: the trainer for records written by beam_prep, and the serving export.

`train` reads what a prep run wrote: records, `transform/` (tf.Transform
output), `manifest.json` and `features.json`. From `beam_prep` it uses the
feature declarations (`beam_prep.features`, `beam_prep.keys`) and the op
registry, whose TensorFlow twins build the serving graph; `beam_prep` never
imports `train`.

Modules, each importing only those on the lines below it:

  cli             beam-train's commands (imports the rest when a command runs)
  serve           beam-train serve: TF Serving's REST API and the click-and-see page
  loop            fit: setup, the step loop, evaluation, NoC, export
  noc, predict    NoC evaluation and its report; beam-train predict
  export          the serving SavedModel
  data            the input path (Decoder, Parser, InputReader, `dataset`)
  tasks, models   what differs by task (labels, loss, metrics, its server and
                  evaluators); the models
  servers         each task's serving tf.Module and its signatures
  prep_output     PrepOutput: a beam-prep output, opened in one place
  serving_inputs  the model input from records or from a request (twins)
  clicker         the simulated user's clicks, the nearest-click baseline, IoU
  drawing         a mask and clicks drawn on an image (Pillow only)
  devices         threads, GPU memory, precision, the distribution strategy
  config, logs    TrainConfig; the log

Public API for one's own training code (imported lazily: `import train`
does not load TensorFlow):

    from train import dataset, register_model
"""

__all__ = ["dataset", "register_model"]


def __getattr__(name):
  if name == "dataset":
    from train.data import dataset  # pylint: disable=g-import-not-at-top

    return dataset
  if name == "register_model":
    from train.models import register_model  # pylint: disable=g-import-not-at-top

    return register_model
  raise AttributeError(f"module 'train' has no attribute {name!r}")
