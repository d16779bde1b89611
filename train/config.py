"""`TrainConfig`: one frozen object holding everything a training run needs;
`EvalConfig`, `PredictConfig`, `ExportConfig`: those of the other commands.

Resolution order: defaults, then `--preset`, then `--config FILE` (JSON), then
flags. The resolved config is written to `MODEL_DIR/config.json`.
"""

import dataclasses
import json
import os
from typing import Any, ClassVar, Dict, List, Tuple

from beam_prep.kit import CommandConfig, check_known, option
from train.fit import augment
from train import model_layout
from train.evaluate import protocol


# The training half of each preset (`beam_prep.config.PREP_PRESETS` holds the
# preprocessing half of the same name).
# The `beam-train fit` options of each task's training side, each added by
# `train.tasks.register_trainer` (this module imports no task).
TASK_OPTIONS: List[type] = []

TRAIN_PRESETS: Dict[str, Dict[str, Any]] = {
  # What the tests run: a few hundred small steps on CPU.
  "smoke": {
    "width": 12,
    "depth": 3,
    "steps": 240,
    "batch_size": 8,
    "checkpoint_every": 80,
    "log_every": 40,
    "histogram_every": 120,
  },
  # What `make demo` runs: a cosine learning rate, NoC on 24 objects.
  "demo": {
    "width": 8,
    "depth": 3,
    "steps": 300,
    "batch_size": 8,
    "learning_rate": 2e-3,
    "lr_schedule": "cosine",
    "noc_objects": 24,
    "checkpoint_every": 100,
    "log_every": 50,
    "histogram_every": 0,
  },
  # Real photographs in about 15 minutes on 2 CPU cores (1100 steps at batch
  # 16: 13.5 minutes with the NoC and the export on COCO-MVal; 500 steps left
  # a model that selects a blob after one click: docs/evaluation.md, "What
  # limits the first click"): mask guidance and corrective clicks (RITM's
  # iterative training), normalized focal loss (NoC@90 12.83 and 13.18 in two
  # runs against 13.93 with bce_iou, 800 steps), a cosine learning rate.
  "real": {
    "steps": 1100,
    "batch_size": 16,
    "learning_rate": 2e-3,
    "lr_schedule": "cosine",
    "loss": "normalized_focal",
    "mask_rounds": 3,
    "corrective_clicks": True,
    "noc_objects": 40,
    "checkpoint_every": 100,
    "log_every": 50,
    "histogram_every": 0,
  },
  # The field's scale (RITM's recipe): a ResNet-50 U-Net from ImageNet
  # weights, batch 28, Adam 5e-4, normalized focal loss, up to 3 corrective
  # rounds, the colour jitter; for a GPU.
  "field": {
    "model": "unet_resnet50",
    "backbone_weights": "imagenet",
    "steps": 60000,
    "batch_size": 28,
    "learning_rate": 5e-4,
    "lr_schedule": "cosine",
    "loss": "normalized_focal",
    "mask_rounds": 3,
    "corrective_clicks": True,
    "augment": "flip,colour",
    "checkpoint_every": 2000,
    "log_every": 100,
    "histogram_every": 1000,
  },
  "default": {},
}


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """A training run. Each option field is also a `beam-train fit` flag
  (`beam_prep.kit`); its help is the field's declaration below.

  Attributes:
    model_args: keyword arguments of the model factory (`--model-args`, a
      JSON object).
    profile_steps: (first, last) global steps to trace with the profiler
      (`--profile-steps A,B`).
    task_options: the settings of the tasks' own `fit` options (their
      training sides' `options`, e.g. segmentation's `noc_clicks`); the
      run's task takes those it has. Flat in a dict (`from_dict`, config
      files), beside the others.
  """

  data: str = option("", "beam_prep output directory", required=True)
  model_dir: str = option("", "checkpoints, logs, metrics, export", required=True)
  model: str = option(
    "",
    "registered model name ('': the task's: segmentation_fcn, or "
    "cnn_classifier for classification records)",
    show_default=False,
  )
  model_module: str = option(
    "",
    "module (or comma-separated modules) to import first; it "
    "registers models with train.register_model (searched on the "
    "Python path and in the current folder)",
  )
  model_args: Dict[str, Any] = dataclasses.field(default_factory=dict)
  width: int = option(16, "built-in models: channels of the first block")
  depth: int = option(3, "built-in models: down-sampling blocks")
  backbone_weights: str = option(
    "imagenet",
    "unet_mobilenetv2 / unet_resnet50: ImageNet "
    "weights (downloaded), none, or a weights file of the "
    "backbone",
    metavar="imagenet|none|PATH",
  )
  steps: int = option(
    300,
    "total steps for the model directory (a resumed run trains until the global step reaches it)",
  )
  max_minutes: float = option(
    0.0,
    "stop after this many minutes of training even before "
    "--steps, then evaluate and export as at the end (0: no limit)",
  )
  batch_size: int = option(8, "examples per replica per step")
  learning_rate: float = option(2e-3, "Adam learning rate (the peak, with a schedule)")
  lr_schedule: str = option(
    "constant",
    "constant, or cosine decay to 5%% of the learning rate over --steps",
    choices=("constant", "cosine"),
  )
  warmup_steps: int = option(
    0,
    "the learning rate rises linearly to its value over this run's first N steps "
    "(0: none); for fine-tuning (--init-from): Adam's first steps move every "
    "weight by about the learning rate, undoing what the model learnt",
  )
  scale_learning_rate: bool = option(False, "multiply the learning rate by the replica count")
  shuffle_buffer: int = option(256, "examples in the shuffle buffer")
  augment: str = option(
    augment.DEFAULT,
    "the step's augmentation, comma-separated: flip "
    "(left-right), colour (the field's brightness/contrast and RGB shift "
    "of the image), or none",
  )
  checkpoint_every: int = option(100, "a checkpoint every N steps (and at the end)")
  log_every: int = option(25, "progress and TensorBoard scalars every N steps")
  histogram_every: int = option(
    100, "weight/gradient histograms and predicted masks every N steps (0: off)"
  )
  eval_batches: int = option(0, "eval batches at the end (0: the whole eval split)")
  seed: int = option(0, "seed of model initialization and input shuffling")
  export: bool = option(
    True, "train without writing the serving SavedModel to MODEL_DIR/export/<version>/"
  )
  init_from: str = option("", "checkpoint or model dir whose weights start a new run")
  freeze: str = option("", "regular expression of layer names not to train")
  mixed_precision: str = option(
    "", "mixed precision policy", none="", choices=("none", "mixed_float16", "mixed_bfloat16")
  )
  xla: bool = option(
    False,
    "compile the training step's rounds, model and gradient with "
    "XLA (the parse, the transform and the optimizer's step stay outside)",
  )
  memory_growth: bool = option(
    True, "take GPU memory as needed (--no-memory-growth: TensorFlow takes it all up front)"
  )
  gpu_memory_limit_mb: int = option(0, "cap each GPU's memory, in MB (0: no cap)")
  intra_op_threads: int = option(0, "TensorFlow intra-op threads (0: TensorFlow decides)")
  inter_op_threads: int = option(0, "TensorFlow inter-op threads (0: TensorFlow decides)")
  cpu_replicas: int = option(
    0, "mirror over N logical CPU devices (multi-replica without GPUs; 0: off)"
  )
  profile_steps: Tuple[int, ...] = ()
  skip_corrupt_records: bool = option(False, "skip unreadable records instead of stopping")
  task_options: Dict[str, Any] = dataclasses.field(default_factory=dict)
  PRESETS: ClassVar[Dict[str, Dict[str, Any]]] = TRAIN_PRESETS

  def __post_init__(self):
    if not (self.data and self.model_dir):
      raise ValueError("--data and --model-dir are required")
    for name in ("steps", "batch_size", "width", "depth", "checkpoint_every", "log_every"):
      if getattr(self, name) < 1:
        raise ValueError(f"{_flag(name)} must be at least 1, got {getattr(self, name)}")
    for name in ("lr_schedule", "mixed_precision"):
      allowed = _choices(name)
      if getattr(self, name) not in allowed:
        raise ValueError(f"{_flag(name)} must be one of {allowed}, got {getattr(self, name)!r}")
    if self.warmup_steps < 0:
      raise ValueError(f"--warmup-steps must be at least 0, got {self.warmup_steps}")
    if not isinstance(self.model_args, dict):
      raise ValueError(f"--model-args must be a JSON object, got {self.model_args!r}")
    augment.parse(self.augment)
    if not 0 < self.learning_rate < float("inf"):  # NaN too.
      raise ValueError(f"--learning-rate must be a positive number, got {self.learning_rate}")
    if self.max_minutes < 0:
      raise ValueError(f"--max-minutes must be 0 (no limit) or more, got {self.max_minutes}")
    if self.profile_steps:
      if len(self.profile_steps) != 2 or not 0 < self.profile_steps[0] <= self.profile_steps[1]:
        raise ValueError(f"--profile-steps must be two steps A <= B, got {self.profile_steps}")
    if self.freeze:
      import re  # pylint: disable=g-import-not-at-top

      try:
        re.compile(self.freeze)
      except re.error as e:
        raise ValueError(f"--freeze is not a regular expression: {e}") from None

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

  @classmethod
  def from_dict(cls, d: Dict[str, Any]) -> "TrainConfig":
    """Builds a config from a plain dict; the tasks' own settings sit beside
    the others (each checked by its task's options) or in `task_options`."""
    d = dict(d)
    own = dict(d.pop("task_options", None) or {})
    for options in TASK_OPTIONS:
      names = {f.name for f in dataclasses.fields(options)}
      own.update({k: d.pop(k) for k in list(d) if k in names})
      options(**{k: v for k, v in own.items() if k in names})  # Checked now.
    check_known(cls, d)
    d["task_options"] = own
    if "profile_steps" in d and d["profile_steps"] is not None:
      d["profile_steps"] = tuple(int(v) for v in d["profile_steps"])
    return cls(**d)


def _flag(name: str) -> str:
  return "--" + name.replace("_", "-")


def _choices(name: str) -> Tuple[Any, ...]:
  """The values field `name` takes (its option's choices, "none" as its value)."""
  meta = next(f for f in dataclasses.fields(TrainConfig) if f.name == name).metadata
  return tuple(meta["none"] if c == "none" else c for c in meta["choices"])


def _text(thresholds) -> str:
  return ",".join(f"{t:.2f}" for t in thresholds)


@dataclasses.dataclass(frozen=True)
class EvalConfig(CommandConfig):
  """`beam-train evaluate`: NoC of a model (or of the baseline alone) on a prep output."""

  model: str = option(
    "", "a beam-train fit model dir or an export (none: the nearest-click baseline alone)"
  )
  data: str = option(
    "", "beam_prep output, e.g. a benchmark set (default: the one the model was trained on)"
  )
  resolution: str = option(
    "auto",
    "source: the eval images at their own size (the field's "
    "protocol); records: the records' size, with the model dir's Keras "
    "model; auto: source when the data holds source records",
    choices=("auto", "source", "records"),
  )
  max_clicks: int = option(
    protocol.NOC_MAX_CLICKS, "clicks per object at most; NoC counts this when never reached"
  )
  iou: str = option(_text(protocol.NOC_IOU_THRESHOLDS), "IoU thresholds, comma-separated")
  max_objects: int = option(0, "evaluate the first N eval objects only (0: all)")
  batch_size: int = option(16, "objects per batch (records resolution)")
  min_area: int = option(
    0,
    "source resolution: leave out objects under N pixels, listed in "
    "noc.json's skipped_objects (0: every object, the field's protocol)",
  )
  pred_thr: float = option(
    protocol.PRED_THR, "a pixel is object where the model's probability exceeds this (RITM's)"
  )
  output: str = option(
    "", "report folder (default: MODEL/eval; required without --model)", show_default=False
  )
  flip: bool = option(
    False,
    "source resolution: average each prediction with the mirrored "
    "image's (noc.json's extras say so)",
  )

  @property
  def thresholds(self) -> Tuple[float, ...]:
    try:
      return tuple(float(v) for v in self.iou.split(",") if v.strip())
    except ValueError:
      raise ValueError(f"--iou takes thresholds in (0, 1], got {self.iou!r}") from None

  def __post_init__(self):
    t = self.thresholds
    checks = [
      (t and all(0 < v <= 1 for v in t), f"--iou takes thresholds in (0, 1], got {self.iou!r}"),
      (self.max_clicks >= 1, f"--max-clicks must be at least 1, got {self.max_clicks}"),
      (self.batch_size >= 1, f"--batch-size must be at least 1, got {self.batch_size}"),
      (self.max_objects >= 0, f"--max-objects must be 0 (all) or more, got {self.max_objects}"),
      (0 < self.pred_thr < 1, f"--pred-thr must be in (0, 1), got {self.pred_thr}"),
      (self.model or self.data, "--data is required without --model"),
      (self.model or self.output, "--output is required without --model"),
      (
        self.model or self.resolution != "records",
        "--resolution records needs --model (a model dir)",
      ),
      (
        not self.min_area or self.resolution != "records",
        "--min-area is for the images' own size, not --resolution records",
      ),
      (
        not self.flip or self.resolution != "records",
        "--flip is for the images' own size, not --resolution records",
      ),
    ]
    for ok, message in checks:
      if not ok:
        raise ValueError(message)


@dataclasses.dataclass(frozen=True)
class PredictConfig(CommandConfig):
  """`beam-train predict`: one image and its clicks through the export."""

  model: str = option(
    "",
    "model dir (newest export), one export dir, or a .tflite / .onnx file of beam-train "
    "export --format",
    required=True,
  )
  image: str = option("", "image file (PNG, JPEG, ...; EXIF orientation applied)", required=True)
  positive: Tuple[str, ...] = option(
    (), "a click on the object (x = column, y = row); repeat for more", metavar="X,Y"
  )
  negative: Tuple[str, ...] = option((), "a click off the object; repeat for more", metavar="X,Y")
  output: str = option("", "mask PNG to write (segmentation)")


@dataclasses.dataclass(frozen=True)
class ExportConfig(CommandConfig):
  """`beam-train export`: the serving SavedModel of a trained model."""

  data: str = option("", "the beam_prep output the model was trained on", required=True)
  model_file: str = option("", "a Keras model file (.keras)")
  model_dir: str = option("", "or a beam-train fit model dir (model.json and checkpoints)")
  model_module: str = option("", "module(s) to import first (custom layers, registered models)")
  output: str = option(
    "",
    "export base; the SavedModel goes to OUTPUT/<version>/ (default: "
    "MODEL_DIR/export with --model-dir)",
    show_default=False,
  )
  format: Tuple[str, ...] = option(
    (),
    "savedmodel, tflite, onnx or all; repeat for more (TFLite and ONNX: "
    "serving_default.tflite / .onnx and serve_iterative's beside the SavedModel; "
    "default: savedmodel)",
    metavar="FORMAT",
  )

  def __post_init__(self):
    if not (self.output or self.model_dir):
      raise ValueError("--output is required with --model-file")

  @property
  def export_base(self) -> str:
    return self.output or os.path.join(self.model_dir, model_layout.EXPORT_DIR)
