"""train: the trainer for records written by beam_prep, and the serving export.

`train` reads what a prep run wrote: records, `transform/` (tf.Transform
output), `manifest.json` and `features.json`. From `beam_prep` it uses the
feature declarations (`beam_prep.features`, `beam_prep.keys`) and the op
registry, whose TensorFlow twins build the serving graph; `beam_prep` never
imports `train`.

Packages and modules, each importing only those on the lines below it:

  cli             beam-train's commands (imports the rest when a command runs)
  serve           beam-train serve: TF Serving's REST API, the page, the label store
  engine          beam-train engine: a data engine round (labels -> records -> model)
  fit             beam-train fit: the loop, the reader, the step and its inputs
  evaluate        beam-train evaluate: NoC, the simulated user, the protocol
  export          beam-train export and predict: the serving graph, SavedModel,
                  TFLite and ONNX files
  tasks, models   what differs by task (labels, loss, metrics, its server and
                  evaluators); the models
  graphs          the graph functions of training and serving, declared once
  config, logs    TrainConfig and the other commands' configs; the log
  model_layout    the files of a model directory

Each package's `__init__` says what it owns. Imports cross the packages
(fit reads export's model input, NoC runs export's servers, the served
model clicks with evaluate's clicker), never in a circle of modules.

Public API for one's own training code (imported lazily: `import train`
does not load TensorFlow):

    from train import dataset, register_model
"""

__all__ = ["dataset", "register_model"]


def __getattr__(name):
  if name == "dataset":
    from train.fit.data import dataset  # pylint: disable=g-import-not-at-top

    return dataset
  if name == "register_model":
    from train.models import register_model  # pylint: disable=g-import-not-at-top

    return register_model
  raise AttributeError(f"module 'train' has no attribute {name!r}")
