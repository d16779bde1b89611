"""The exported SavedModel, loaded once, as TF Serving describes it.

`ServedModel` holds one export (`MODEL_DIR/export/<version>/`, or that folder
itself): its signatures' input specs, its TF Serving status and metadata
JSON, and `predict`, which calls a signature's concrete function (safe to
call from several threads at once) and turns the graph's InvalidArgument
errors into 400s.

The version is the export folder's name, a number, as TF Serving reads
versions; a folder named otherwise is served as version 1.
"""

import os
import re
from typing import Any, Dict, Mapping

import numpy as np
import tensorflow as tf
from google.protobuf import json_format
from tensorflow.core.protobuf import saved_model_pb2

from train.export import latest_export
from train.serve.rest import RequestError


def default_name(model: str) -> str:
  """The model's name when none is given: its folder's name, skipping the
  export/ and version folders (`runs/cat/export/17` -> `cat`)."""
  parts = [p for p in os.path.abspath(model).split(os.sep) if p]
  while len(parts) > 1 and (parts[-1].isdigit() or parts[-1] == "export"):
    parts.pop()
  return parts[-1] if parts else "model"


class ServedModel:
  """One loaded export.

  Args:
    model: a model dir (its newest export) or one export folder.
    name: the model's name in URLs, TF Serving's MODEL_NAME.

  Raises:
    FileNotFoundError: no SavedModel there (`latest_export`'s message).
    ValueError: a name TF Serving's URLs cannot hold.
  """

  def __init__(self, model: str, name: str):
    if not re.fullmatch(r"[^/:\s]+", name):
      raise ValueError(f"--model-name {name!r}: a model name has no '/', ':' or spaces")
    self.path = latest_export(model)
    self.name = name
    base = os.path.basename(os.path.normpath(self.path))
    self.version = int(base) if base.isdigit() else 1
    self._loaded = tf.saved_model.load(self.path)
    self._functions = dict(self._loaded.signatures)
    self.signatures: Dict[str, Dict[str, tf.TensorSpec]] = {
        k: dict(fn.structured_input_signature[1]) for k, fn in self._functions.items()}
    self._signature_defs = self._read_signature_defs()

  def _read_signature_defs(self) -> Dict[str, Any]:
    """saved_model.pb's SignatureDefMap as JSON (TF Serving prints it so)."""
    sm = saved_model_pb2.SavedModel()
    with tf.io.gfile.GFile(os.path.join(self.path, "saved_model.pb"), "rb") as f:
      sm.ParseFromString(f.read())
    graph = next(g for g in sm.meta_graphs if "serve" in g.meta_info_def.tags)
    return {k: json_format.MessageToDict(v, preserving_proto_field_name=True,
                                         always_print_fields_with_no_presence=True)
            for k, v in graph.signature_def.items()}

  def check(self, name: str, version: int = None) -> None:
    """Raises a 404 RequestError unless `name` (and `version`) is this model."""
    if name != self.name or (version is not None and version != self.version):
      want = f"Latest({name})" if version is None else f"Specific({name}, {version})"
      raise RequestError(f"Servable not found for request: {want} (this server holds "
                         f"{self.name!r} version {self.version})", status=404)

  def status(self) -> Dict[str, Any]:
    """TF Serving's GetModelStatusResponse JSON."""
    return {"model_version_status": [{"version": str(self.version), "state": "AVAILABLE",
                                      "status": {"error_code": "OK", "error_message": ""}}]}

  def metadata(self) -> Dict[str, Any]:
    """TF Serving's GetModelMetadataResponse JSON: the SignatureDefMap."""
    return {"model_spec": {"name": self.name, "signature_name": "",
                           "version": str(self.version)},
            "metadata": {"signature_def": {"signature_def": self._signature_defs}}}

  def predict(self, signature: str, inputs: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Runs one signature; the graph refusing the inputs is a 400 with its message."""
    fn = self._functions[signature]
    try:
      out = fn(**{k: tf.constant(v, dtype=self.signatures[signature][k].dtype)
                  for k, v in inputs.items()})
    except (tf.errors.InvalidArgumentError, ValueError, TypeError) as e:
      message = getattr(e, "message", str(e)).strip()
      asserted = re.search(r"assertion failed: \[([^\]]*)\]", message)
      lines = [l for l in message.splitlines() if l.strip() and "Graph execution" not in l]
      raise RequestError(asserted.group(1).strip() if asserted else
                         (lines[0].strip() if lines else message)) from None
    return {k: v.numpy() for k, v in out.items()}
