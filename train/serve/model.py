"""The exported model as TF Serving describes it.

`RestModel` is the one client of an export (`train.export.served.ServedModel`) with
what TF Serving's REST API adds: a name and a version, the metadata JSON,
and `predict`, which refuses more clicks than the server's
limit (--max-clicks) before running the graph, REST's and the page's alike,
and turns the graph refusing a request's inputs into a 400 with its reason.

The version is the export folder's name, a number, as TF Serving reads
versions; a folder named otherwise is served as version 1. Which version
serves, and the status of each, is `train.serve.versions`'.
"""

import os
import re
from typing import Any, Dict, Mapping

import numpy as np
import tensorflow as tf
from google.protobuf import json_format
from tensorflow.core.protobuf import saved_model_pb2

from train import model_layout
from train.export.served import InvalidInput, ServedModel
from train.serve.rest import RequestError, check_clicks


def default_name(model: str) -> str:
  """The model's name when none is given: its folder's name, skipping the
  export/ and version folders (`runs/cat/export/17` -> `cat`)."""
  parts = [p for p in os.path.abspath(model).split(os.sep) if p]
  while len(parts) > 1 and (parts[-1].isdigit() or parts[-1] == model_layout.EXPORT_DIR):
    parts.pop()
  return parts[-1] if parts else "model"


def version_of(export: str) -> int:
  """An export folder's version: its name, a number, as TF Serving reads
  versions; 1 for a folder named otherwise."""
  base = os.path.basename(os.path.normpath(export))
  return int(base) if base.isdigit() else 1


class RestModel(ServedModel):
  """One loaded export, named as TF Serving's URLs name it.

  Args:
    model: a model dir (its newest export) or one export folder.
    name: the model's name in URLs, TF Serving's MODEL_NAME.
    max_clicks: the most clicks a call may hold (`rest.check_clicks`; 0: any).

  Raises:
    FileNotFoundError: no SavedModel there (`latest_export`'s message).
    ValueError: a name TF Serving's URLs cannot hold.
  """

  def __init__(self, model: str, name: str, max_clicks: int = 0):
    if not re.fullmatch(r"[^/:\s]+", name):
      raise ValueError(f"--model-name {name!r}: a model name has no '/', ':' or spaces")
    super().__init__(model)
    self.name, self.max_clicks = name, max_clicks
    self.version = version_of(self.path)
    self._signature_defs = self._read_signature_defs()

  def _read_signature_defs(self) -> Dict[str, Any]:
    """saved_model.pb's SignatureDefMap as JSON (TF Serving prints it so)."""
    sm = saved_model_pb2.SavedModel()
    with tf.io.gfile.GFile(os.path.join(self.path, "saved_model.pb"), "rb") as f:
      sm.ParseFromString(f.read())
    graph = next(g for g in sm.meta_graphs if "serve" in g.meta_info_def.tags)
    return {
      k: json_format.MessageToDict(
        v, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
      )
      for k, v in graph.signature_def.items()
    }

  def metadata(self) -> Dict[str, Any]:
    """TF Serving's GetModelMetadataResponse JSON: the SignatureDefMap."""
    return {
      "model_spec": {"name": self.name, "signature_name": "", "version": str(self.version)},
      "metadata": {"signature_def": {"signature_def": self._signature_defs}},
    }

  def predict(self, signature: str, inputs: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Runs one signature; too many clicks, or the graph refusing the inputs,
    is a 400 with its reason."""
    check_clicks({k: [v] for k, v in inputs.items()}, self.max_clicks)
    try:
      return super().predict(signature, inputs)
    except InvalidInput as e:
      raise RequestError(str(e)) from None
