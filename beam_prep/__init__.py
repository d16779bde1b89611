"""beam_prep: heavy per-example preprocessing computed once by Apache Beam.

Public surface (composite PTransforms and the op registry):

    from beam_prep import (ListInputs, ReadExamples, DecodeExamples, SampleClicks,
                           ComputeDistanceMaps, ApplyOps, AnalyzeAndTransform,
                           PlanShards, WriteShards, register_op, Feature, ExampleError)

`ListInputs` -> `PlanShards` -> `WriteShards` is how the job writes records
without moving pixels through a shuffle (`beam_prep.shards`, around the
per-input `beam_prep.kernel`); the per-op transforms are for pipelines of
one's own. Input layouts (`beam_prep.layouts`) and tasks (`beam_prep.tasks`)
are registries like the ops: one module and one registration each.

An op declares the features it produces (`register_op(name, produces={key:
Feature(...)}, twin=...)`); the records, tf.Transform graph, trainer input and
serving graph follow from those declarations (`beam_prep.features`).

Importing `beam_prep` alone is cheap: Beam and TensorFlow load on first use of
a transform.
"""

from beam_prep.features import Feature, FeatureTable
from beam_prep.ops.registry import ExampleError, register_op, registered_ops
from beam_prep.version import __version__

_TRANSFORMS = {
  "ListInputs": "readers",
  "ReadExamples": "readers",
  "DecodeExamples": "transforms",
  "SampleClicks": "transforms",
  "ComputeDistanceMaps": "transforms",
  "ApplyOps": "transforms",
  "AnalyzeAndTransform": "transforms",
  "PlanShards": "shards.plan",
  "WriteShards": "shards.write",
}

__all__ = [
  "ExampleError",
  "Feature",
  "FeatureTable",
  "register_op",
  "registered_ops",
  "__version__",
] + sorted(_TRANSFORMS)


def __getattr__(name):
  if name in _TRANSFORMS:
    import importlib  # pylint: disable=g-import-not-at-top

    return getattr(importlib.import_module(f"beam_prep.{_TRANSFORMS[name]}"), name)
  raise AttributeError(f"module 'beam_prep' has no attribute {name!r}")
