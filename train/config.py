"""`TrainConfig`: one frozen object holding everything a training run needs.

Resolution order: defaults, then `--preset`, then `--config FILE` (JSON), then
flags. The resolved config is written to `MODEL_DIR/config.json`.
"""

import dataclasses
import json
from typing import Any, Dict, Tuple


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """A training run.

  Attributes:
    data: a beam_prep output directory (records/, transform/, manifest.json).
    model_dir: checkpoints, TensorBoard logs, metrics.json and export/.
    model: registered model name; "" picks the task's default
      (segmentation_fcn, or cnn_classifier for classification records).
    model_module: module (or comma-separated modules) to import first; it
      registers models of one's own (`from train import register_model`).
    model_args: keyword arguments of the model factory (a JSON object).
    width: built-in models: channels of the first convolution block.
    depth: built-in models: number of down-sampling blocks.
    backbone_weights: models on a keras.applications backbone: "imagenet"
      (downloaded), "none" (random), or a weights file of the backbone.
    steps: total training steps for the model directory (a resumed run trains
      until the global step reaches it).
    batch_size: examples per replica per step (global batch = this x replicas).
    learning_rate: Adam learning rate (the peak, with a schedule).
    lr_schedule: "constant", or "cosine": from the learning rate down to 5%
      of it over `steps`, along a cosine.
    scale_learning_rate: multiply the learning rate by the replica count.
    shuffle_buffer: examples in the shuffle buffer.
    checkpoint_every: save a checkpoint every N steps (and at the end).
    log_every: progress and TensorBoard scalars every N steps.
    histogram_every: weight and gradient histograms, predicted masks, every N
      steps (0: never).
    eval_batches: eval batches at the end (0: the whole eval split).
    noc_clicks: segmentation: at the end, the NoC evaluation (`train.noc`)
      with up to this many simulated clicks per eval object (0: skip it).
    noc_objects: evaluate NoC on the first N eval objects only (0: all).
    seed: seed of model initialization and input shuffling.
    export: write a SavedModel to MODEL_DIR/export/<version>/ at the end.
    init_from: a checkpoint (or model dir) whose weights start a new run.
    freeze: regular expression; layers whose name matches are not trained.
    mixed_precision: "", "mixed_float16" or "mixed_bfloat16".
    xla: compile the training step with XLA.
    memory_growth: let GPU memory grow instead of taking it all up front.
    gpu_memory_limit_mb: cap each GPU's memory (0: no cap).
    intra_op_threads: TensorFlow intra-op threads (0: TensorFlow decides).
    inter_op_threads: TensorFlow inter-op threads (0: TensorFlow decides).
    cpu_replicas: split the CPU into N logical devices and mirror over them
      (tests multi-replica code without GPUs; 0: off).
    profile_steps: (first, last) global steps to trace with the profiler.
    skip_corrupt_records: skip unreadable records instead of stopping.
  """
  data: str
  model_dir: str
  model: str = ""
  model_module: str = ""
  model_args: Dict[str, Any] = dataclasses.field(default_factory=dict)
  width: int = 16
  depth: int = 3
  backbone_weights: str = "imagenet"
  steps: int = 300
  batch_size: int = 8
  learning_rate: float = 2e-3
  lr_schedule: str = "constant"
  scale_learning_rate: bool = False
  shuffle_buffer: int = 256
  checkpoint_every: int = 100
  log_every: int = 25
  histogram_every: int = 100
  eval_batches: int = 0
  noc_clicks: int = 20
  noc_objects: int = 0
  seed: int = 0
  export: bool = True
  init_from: str = ""
  freeze: str = ""
  mixed_precision: str = ""
  xla: bool = False
  memory_growth: bool = True
  gpu_memory_limit_mb: int = 0
  intra_op_threads: int = 0
  inter_op_threads: int = 0
  cpu_replicas: int = 0
  profile_steps: Tuple[int, ...] = ()
  skip_corrupt_records: bool = False

  def __post_init__(self):
    for name in ("steps", "batch_size", "width", "depth", "checkpoint_every", "log_every"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
    if self.lr_schedule not in ("constant", "cosine"):
      raise ValueError(f"lr_schedule must be 'constant' or 'cosine', got {self.lr_schedule!r}")
    if self.noc_clicks < 0:
      raise ValueError(f"noc_clicks must be >= 0, got {self.noc_clicks}")
    if not isinstance(self.model_args, dict):
      raise ValueError(f"model_args must be a JSON object, got {self.model_args!r}")
    if self.learning_rate <= 0:
      raise ValueError(f"learning_rate must be positive, got {self.learning_rate}")
    if self.mixed_precision not in ("", "mixed_float16", "mixed_bfloat16"):
      raise ValueError("mixed_precision must be '', 'mixed_float16' or 'mixed_bfloat16', "
                       f"got {self.mixed_precision!r}")
    if self.profile_steps:
      if len(self.profile_steps) != 2 or not 0 < self.profile_steps[0] <= self.profile_steps[1]:
        raise ValueError(f"profile_steps must be two steps A <= B, got {self.profile_steps}")
    if self.freeze:
      import re  # pylint: disable=g-import-not-at-top
      try:
        re.compile(self.freeze)
      except re.error as e:
        raise ValueError(f"freeze is not a regular expression: {e}") from None

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

  @classmethod
  def from_dict(cls, d: Dict[str, Any]) -> "TrainConfig":
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - names
    if unknown:
      raise ValueError(f"unknown config keys: {sorted(unknown)}; known: {sorted(names)}")
    d = dict(d)
    if "profile_steps" in d and d["profile_steps"] is not None:
      d["profile_steps"] = tuple(int(v) for v in d["profile_steps"])
    return cls(**d)
