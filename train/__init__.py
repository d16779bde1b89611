"""train: the trainer for records written by beam_prep, and the serving export.

`train` and `beam_prep` share only the feature keys (`beam_prep.keys`, a
standard-library-only module) and the artifacts on disk: records,
`transform/` (tf.Transform output) and `manifest.json`.
"""
