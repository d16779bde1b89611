"""Portable exports: the click signatures as TFLite and ONNX files.

`beam-train export --format tflite --format onnx` (or `--format all`) writes,
beside the SavedModel in `EXPORT_BASE/<version>/`, one file per signature
and format:

  serving_default.tflite   serving_default.onnx
  serve_iterative.tflite   serve_iterative.onnx

Each holds the SavedModel signature's own graph (`train.export.servers`), with its
input and output names and dtypes (`train.export.signatures`):
  inputs   image            uint8 [H, W, 3], any size
           positive_clicks  int32 [P, 2], (x, y); P >= 1
           negative_clicks  int32 [N, 2]; N may be 0
           previous_mask    uint8 [H, W] (serve_iterative only; all 0: none)
  outputs  probabilities    float32 [H, W]
           mask             uint8 [H, W], 1 on the object

TFLite files use TFLite's builtin ops only (no Flex delegate: the runtime
wheels have none); ONNX files are made by tf2onnx (opset `ONNX_OPSET`). The
graph converts because it applies the exported transform to tensors
(`serving_inputs.transform_tables`) and does its crop arithmetic in int32; a
transform that is not a table of each pixel's value is refused before
anything is written, naming the input.

Every file written is run once on a made-up request and compared with the
SavedModel's function (`check_file`): an export whose file answers
otherwise (a probability more than `PARITY_ATOL` apart) fails. The files
keep no assertions (neither format has them):
`train.export.portable_model.PortableModel` checks a request before the call;
`runner` runs a file as it is.
Box prompts, encoded files and `serve_examples` stay in the SavedModel.

The converters and runtimes are the `portable` extra (tf2onnx, onnxruntime,
ai-edge-litert), imported here only when a portable format is asked for;
a Dataflow worker never installs them.
"""

import importlib.util
import logging
import os
import shutil
import tempfile
import traceback
from typing import Dict, List, Sequence, Tuple

import numpy as np
import tensorflow as tf

from train.evaluate import protocol
from train.export import signatures as sig

SAVEDMODEL, TFLITE, ONNX = "savedmodel", "tflite", "onnx"
FORMATS = (SAVEDMODEL, TFLITE, ONNX)
# The file suffix of each portable format.
SUFFIXES = {TFLITE: ".tflite", ONNX: ".onnx"}
# The signatures written as portable files.
SIGNATURES = (sig.SERVING_DEFAULT, sig.SERVE_ITERATIVE)
ONNX_OPSET = 17
# What each portable format needs installed: {format: [(module, pip name)]}.
PACKAGES = {
  TFLITE: [("ai_edge_litert", "ai-edge-litert")],
  ONNX: [("tf2onnx", "tf2onnx"), ("onnxruntime", "onnxruntime")],
}
# A portable file is at parity with the SavedModel (`at_parity`) when no
# probability differs by more than this (float32 arithmetic in another order,
# other resize kernels: differences of 1e-7 to 1e-3, measured); so a mask
# pixel differs only where the probability was that near the threshold.
PARITY_ATOL = 0.01


def parse_formats(values: Sequence[str]) -> Tuple[str, ...]:
  """`--format` values (repeated, comma-separated, or `all`) -> formats in
  `FORMATS` order; none given: the SavedModel alone.

  Raises:
    ValueError: an unknown format.
  """
  asked = {v.strip().lower() for value in values for v in value.split(",") if v.strip()}
  if "all" in asked:
    return FORMATS
  unknown = sorted(asked - set(FORMATS))
  if unknown:
    raise ValueError(
      f"--format {', '.join(unknown)}: unknown; one of {', '.join(FORMATS)} or all (repeatable)"
    )
  return tuple(f for f in FORMATS if f in asked) or (SAVEDMODEL,)


def file_name(signature: str, fmt: str) -> str:
  """The portable file of `signature` in format `fmt`, in its export folder."""
  return signature + SUFFIXES[fmt]


def check_possible(server, formats: Sequence[str]) -> None:
  """Raises ValueError when `server` cannot be written in `formats`: not a
  click model, a transform that is no table, or a converter not installed."""
  portable = [f for f in formats if f in SUFFIXES]
  if not portable:
    return
  if not all(name in server.signatures() for name in SIGNATURES):
    raise ValueError(
      f"--format {', '.join(portable)}: only segmentation models (image and clicks in) "
      "go to portable formats"
    )
  if server.not_portable:
    raise ValueError(
      f"--format {', '.join(portable)}: the serving graph cannot apply this transform to "
      f"tensors ({server.not_portable}); the SavedModel serves it"
    )
  missing = [pip for f in portable for module, pip in PACKAGES[f] if not _installed(module)]
  if missing:
    raise ValueError(
      f"--format {', '.join(portable)} needs {', '.join(missing)}: "
      "pip install 'beam-prep[portable]'"
    )


def _installed(module: str) -> bool:
  return importlib.util.find_spec(module) is not None


def write(server, export_dir: str, saved_model_dir: str, formats: Sequence[str]) -> List[str]:
  """Writes the portable files of `formats` into `export_dir`, each checked
  (`check_file`), and returns their paths. `saved_model_dir` holds the
  server saved as a SavedModel (TFLite converts from it)."""
  paths = []
  for fmt in (f for f in formats if f in SUFFIXES):
    for signature in SIGNATURES:
      data = _convert(fmt, server, saved_model_dir, signature)
      path = os.path.join(export_dir, file_name(signature, fmt))
      with tf.io.gfile.GFile(path, "wb") as f:
        f.write(data)
      check_file(path, server.signatures()[signature])
      paths.append(path)
  return paths


def _convert(fmt: str, server, saved_model_dir: str, signature: str) -> bytes:
  if fmt == TFLITE:
    return to_tflite(saved_model_dir, signature)
  return to_onnx(server.signatures()[signature], signature)


def to_tflite(saved_model_dir: str, signature: str) -> bytes:
  """One signature of a SavedModel as a TFLite file of builtin ops.

  Raises:
    ValueError: an op has no TFLite builtin (the converter's list of them).
  """
  converter = tf.lite.TFLiteConverter.from_saved_model(saved_model_dir, signature_keys=[signature])
  converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
  try:
    return converter.convert()
  except Exception as e:  # pylint: disable=broad-except  (the converter's own error types)
    raise ValueError(f"TFLite cannot convert {signature}: {_converter_reason(e)}") from None


def _converter_reason(e: Exception) -> str:
  """The lines of a converter error that say which ops failed, not its IR dump."""
  lines = [line.strip() for line in str(e).splitlines()]
  said = [
    line
    for line in lines
    if line.startswith(("TF Select ops:", "tf.", "Some ops are not supported"))
  ]
  return " ".join(said[:8]) or (lines[-1] if lines else type(e).__name__)


def to_onnx(function, signature: str) -> bytes:
  """A signature's tf.function as an ONNX model (tf2onnx, `ONNX_OPSET`).

  tf2onnx copies the whole graph before each of its optimizers, to keep it
  should that optimizer fail: about 3/4 of a conversion's time. The first
  try goes without the copies; only if an optimizer fails is it converted
  again tf2onnx's way.

  Raises:
    ValueError: tf2onnx cannot convert it (its reason).
  """
  try:
    try:
      proto = _tf2onnx(function, keep_on_failure=False)
    except Exception as e:  # pylint: disable=broad-except
      if not _raised_in(e, "optimizer"):
        raise
      proto = _tf2onnx(function, keep_on_failure=True)
  except Exception as e:  # pylint: disable=broad-except  (tf2onnx's errors have no common type)
    raise ValueError(f"tf2onnx cannot convert {signature}: {type(e).__name__}: {e}") from None
  return proto.SerializeToString(deterministic=True)


def _tf2onnx(function, keep_on_failure: bool):
  """tf2onnx's model proto of a tf.function, its optimizers' copies as asked.
  tf2onnx reads that setting from the environment: unset, it copies; set to
  FALSE, it does not (tf2onnx 1.17 reads any value as FALSE)."""
  from tf2onnx import constants, convert  # pylint: disable=g-import-not-at-top

  logging.getLogger("tf2onnx").setLevel(logging.WARNING)
  name = constants.ENV_TF2ONNX_CATCH_ERRORS
  before = os.environ.pop(name, None)
  if not keep_on_failure:
    os.environ[name] = "FALSE"
  try:
    proto, _ = convert.from_function(
      function, input_signature=function.input_signature, opset=ONNX_OPSET
    )
  finally:
    os.environ.pop(name, None)
    if before is not None:
      os.environ[name] = before
  return proto


def _raised_in(e: Exception, package: str) -> bool:
  """Whether `e` was raised inside tf2onnx's `package` (a folder of it)."""
  frames = traceback.extract_tb(e.__traceback__)
  return any(f"tf2onnx{os.sep}{package}{os.sep}" in frame.filename for frame in frames)


def _tflite_runner(path: str, threads: int):
  """(run(inputs) -> outputs, input names) of a TFLite file's one signature."""
  try:
    from ai_edge_litert.interpreter import Interpreter  # pylint: disable=g-import-not-at-top
  except ImportError:
    Interpreter = tf.lite.Interpreter  # noqa: N806
  interpreter = Interpreter(model_path=path, num_threads=threads or None)
  (name, spec), *more = interpreter.get_signature_list().items()
  if more:
    raise ValueError(f"{path}: holds {len(more) + 1} signatures; a portable file holds one")
  signature_runner = interpreter.get_signature_runner(name)
  return (lambda inputs: signature_runner(**inputs)), list(spec["inputs"])


def _onnx_runner(path: str, threads: int):
  """(run(inputs) -> outputs, input names) of an ONNX file."""
  import onnxruntime as ort  # pylint: disable=g-import-not-at-top

  options = ort.SessionOptions()
  options.intra_op_num_threads = threads
  options.log_severity_level = 3  # Errors only.
  session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
  outputs = [o.name for o in session.get_outputs()]

  def run(inputs):
    return dict(zip(outputs, session.run(outputs, dict(inputs))))

  return run, [i.name for i in session.get_inputs()]


def runner(path: str, threads: int = 0):
  """(run(inputs by name) -> outputs by name, input names) of a portable
  file: a .tflite file in LiteRT (`ai_edge_litert`; TensorFlow's own
  `tf.lite.Interpreter` when LiteRT is not installed), an .onnx file in
  onnxruntime; `threads` 0: the runtime's default (every core)."""
  make = _tflite_runner if path.lower().endswith(SUFFIXES[TFLITE]) else _onnx_runner
  return make(path, threads)


def probe_request(function) -> Dict[str, np.ndarray]:
  """A made-up request for a click signature: an odd-sized image with an
  object-like square, a positive click on it, a negative one off it and, for
  `serve_iterative`, a previous mask around the click."""
  rng = np.random.default_rng(0)
  image = rng.integers(0, 256, (83, 117, 3), dtype=np.uint8)
  image[20:60, 30:80] = (200, 60, 40)
  request = {
    sig.IMAGE: image,
    sig.POSITIVE_CLICKS: np.array([[50, 40]], np.int32),
    sig.NEGATIVE_CLICKS: np.array([[5, 70]], np.int32),
  }
  names = [spec.name for spec in function.input_signature]
  if sig.PREVIOUS_MASK in names:
    previous = np.zeros(image.shape[:2], np.uint8)
    previous[25:55, 35:70] = 1
    request[sig.PREVIOUS_MASK] = previous
  return request


def parity(want: Dict[str, np.ndarray], got: Dict[str, np.ndarray]) -> Tuple[float, float]:
  """(share of mask pixels equal, largest distance from the threshold of a
  differing pixel's probability, 0 when none differs) of a portable file's
  outputs `got` against the SavedModel's `want`."""
  differ = np.asarray(want[sig.MASK]) != np.asarray(got[sig.MASK])
  near = np.abs(np.asarray(want[sig.PROBABILITIES])[differ] - protocol.PRED_THR)
  return 1.0 - float(differ.mean()), float(near.max()) if near.size else 0.0


def at_parity(want: Dict[str, np.ndarray], got: Dict[str, np.ndarray]) -> bool:
  """Whether `got` answers as `want`: the same size, and no probability
  further than `PARITY_ATOL` from the SavedModel's."""
  p, q = np.asarray(want[sig.PROBABILITIES]), np.asarray(got[sig.PROBABILITIES])
  return p.shape == q.shape and float(np.max(np.abs(p - q), initial=0.0)) <= PARITY_ATOL


def check_file(path: str, function) -> None:
  """Runs the portable file at `path` on `probe_request` and compares it with
  the SavedModel's `function`.

  Raises:
    ValueError: it is not at parity (`at_parity`).
  """
  request = probe_request(function)
  want = function(**{k: tf.constant(v) for k, v in request.items()})
  want = {k: v.numpy() for k, v in want.items()}
  got = {k: np.asarray(v) for k, v in runner(path)[0](request).items()}
  if not at_parity(want, got):
    shapes = (np.shape(want[sig.PROBABILITIES]), np.shape(got[sig.PROBABILITIES]))
    said = (
      f"probabilities {shapes[1]}, {shapes[0]} expected"
      if shapes[0] != shapes[1]
      else f"{parity(want, got)[0]:.2%} of the mask's pixels equal, probabilities up to "
      f"{np.max(np.abs(want[sig.PROBABILITIES] - got[sig.PROBABILITIES])):.3g} apart "
      f"(at most {PARITY_ATOL})"
    )
    raise ValueError(f"{path} answers a test request otherwise than the SavedModel: {said}")


def export_formats(server, export_dir: str, formats: Sequence[str], save) -> List[str]:
  """Writes `server` in `formats` into `export_dir`: `save(dir)` writes its
  SavedModel (into `export_dir` when asked for, else into a temporary folder
  the TFLite converter reads), then the portable files. Returns the paths of
  the portable files."""
  check_possible(server, formats)
  if SAVEDMODEL in formats:
    save(export_dir)
    return write(server, export_dir, export_dir, formats)
  tf.io.gfile.makedirs(export_dir)
  scratch = tempfile.mkdtemp(prefix="savedmodel-")
  try:
    save(scratch)
    return write(server, export_dir, scratch, formats)
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
