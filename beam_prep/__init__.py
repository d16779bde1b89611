"""beam_prep: heavy per-example preprocessing computed once by Apache Beam.

Public surface (composite PTransforms and the op registry):

    from beam_prep import (ReadExamples, DecodeExamples, SampleClicks,
                           ComputeDistanceMaps, ApplyOps, EncodeExamples,
                           WriteExamples, AnalyzeAndTransform, WriteDeadLetters,
                           register_op, Feature, ExampleError)

An op declares the features it produces (`register_op(name, produces={key:
Feature(...)}, twin=...)`); the records, tf.Transform graph, trainer input and
serving graph follow from those declarations (`beam_prep.features`).

Importing `beam_prep` alone is cheap: Beam and TensorFlow load on first use of
a transform.
"""

from beam_prep.features import Feature, FeatureTable
from beam_prep.ops.registry import ExampleError, register_op, registered_ops
from beam_prep.version import __version__

__all__ = ["ExampleError", "Feature", "FeatureTable", "register_op", "registered_ops",
           "__version__", "ReadExamples",
           "DecodeExamples", "SampleClicks", "ComputeDistanceMaps", "ApplyOps", "EncodeExamples",
           "WriteExamples", "AnalyzeAndTransform", "WriteDeadLetters"]

_TRANSFORMS = ("ReadExamples", "DecodeExamples", "SampleClicks", "ComputeDistanceMaps",
               "ApplyOps", "EncodeExamples", "WriteExamples", "AnalyzeAndTransform",
               "WriteDeadLetters")


def __getattr__(name):
  if name in _TRANSFORMS:
    from beam_prep import transforms  # pylint: disable=g-import-not-at-top
    return getattr(transforms, name)
  raise AttributeError(f"module 'beam_prep' has no attribute {name!r}")
