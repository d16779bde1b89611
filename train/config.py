"""`TrainConfig`: one frozen object holding everything a training run needs.

Resolution order: defaults, then `--preset`, then `--config FILE` (JSON), then
flags. The resolved config is written to `MODEL_DIR/config.json`.
"""

import dataclasses
import json
from typing import Any, Dict, Tuple

from beam_prep.config import check_known, option


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """A training run. Each option field is also a `beam-train fit` flag
  (`pipelines.kit`); its help is the field's declaration below.

  Attributes:
    model_args: keyword arguments of the model factory (`--model-args`, a
      JSON object).
    profile_steps: (first, last) global steps to trace with the profiler
      (`--profile-steps A,B`).
  """
  data: str = option("", "beam_prep output directory", required=True)
  model_dir: str = option("", "checkpoints, logs, metrics, export", required=True)
  model: str = option("", "registered model name ('': the task's: segmentation_fcn, or "
                      "cnn_classifier for classification records)", show_default=False)
  model_module: str = option("", "module (or comma-separated modules) to import first; it "
                             "registers models with train.register_model (searched on the "
                             "Python path and in the current folder)")
  model_args: Dict[str, Any] = dataclasses.field(default_factory=dict)
  width: int = option(16, "built-in models: channels of the first block")
  depth: int = option(3, "built-in models: down-sampling blocks")
  backbone_weights: str = option("imagenet", "unet_mobilenetv2 / unet_resnet50: ImageNet "
                                 "weights (downloaded), none, or a weights file of the "
                                 "backbone", metavar="imagenet|none|PATH")
  steps: int = option(300, "total steps for the model directory (a resumed run trains until "
                      "the global step reaches it)")
  batch_size: int = option(8, "examples per replica per step")
  learning_rate: float = option(2e-3, "Adam learning rate (the peak, with a schedule)")
  lr_schedule: str = option("constant", "constant, or cosine decay to 5%% of the learning rate "
                            "over --steps", choices=("constant", "cosine"))
  scale_learning_rate: bool = option(False, "multiply the learning rate by the replica count")
  shuffle_buffer: int = option(256, "examples in the shuffle buffer")
  checkpoint_every: int = option(100, "a checkpoint every N steps (and at the end)")
  log_every: int = option(25, "progress and TensorBoard scalars every N steps")
  histogram_every: int = option(100, "weight/gradient histograms and predicted masks every N "
                                "steps (0: off)")
  eval_batches: int = option(0, "eval batches at the end (0: the whole eval split)")
  noc_clicks: int = option(20, "segmentation: NoC evaluation at the end with up to N "
                           "simulated clicks per eval object (0: skip it)")
  noc_objects: int = option(0, "NoC on the first N eval objects only (0: all)")
  seed: int = option(0, "seed of model initialization and input shuffling")
  export: bool = option(True, "train without writing the serving SavedModel to "
                        "MODEL_DIR/export/<version>/")
  init_from: str = option("", "checkpoint or model dir whose weights start a new run")
  freeze: str = option("", "regular expression of layer names not to train")
  mixed_precision: str = option("", "mixed precision policy", none="",
                                choices=("none", "mixed_float16", "mixed_bfloat16"))
  xla: bool = option(False, "compile the training step with XLA")
  memory_growth: bool = option(True, "let TensorFlow take all GPU memory up front")
  gpu_memory_limit_mb: int = option(0, "cap each GPU's memory, in MB (0: no cap)")
  intra_op_threads: int = option(0, "TensorFlow intra-op threads (0: TensorFlow decides)")
  inter_op_threads: int = option(0, "TensorFlow inter-op threads (0: TensorFlow decides)")
  cpu_replicas: int = option(0, "mirror over N logical CPU devices (multi-replica without "
                             "GPUs; 0: off)")
  profile_steps: Tuple[int, ...] = ()
  skip_corrupt_records: bool = option(False, "skip unreadable records instead of stopping")

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
    if self.noc_clicks < 0:
      raise ValueError(f"--noc-clicks must be >= 0, got {self.noc_clicks}")
    if not isinstance(self.model_args, dict):
      raise ValueError(f"--model-args must be a JSON object, got {self.model_args!r}")
    if self.learning_rate <= 0:
      raise ValueError(f"--learning-rate must be positive, got {self.learning_rate}")
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
    check_known(cls, d)
    d = dict(d)
    if "profile_steps" in d and d["profile_steps"] is not None:
      d["profile_steps"] = tuple(int(v) for v in d["profile_steps"])
    return cls(**d)


def _flag(name: str) -> str:
  return "--" + name.replace("_", "-")


def _choices(name: str) -> Tuple[Any, ...]:
  """The values field `name` takes (its option's choices, "none" as its value)."""
  meta = next(f for f in dataclasses.fields(TrainConfig) if f.name == name).metadata
  return tuple(meta["none"] if c == "none" else c for c in meta["choices"])
