"""train: the trainer for records written by beam_prep, and the serving export.

`train` reads what a prep run wrote: records, `transform/` (tf.Transform
output), `manifest.json` and `features.json`. From `beam_prep` it uses the
feature declarations (`beam_prep.features`, `beam_prep.keys`) and the op
registry, whose TensorFlow twins build the serving graph; `beam_prep` never
imports `train`.
"""
