"""`TrainConfig`: one frozen object holding everything a training run needs.

Resolution order: defaults, then `--preset`, then `--config FILE` (JSON), then
flags. The resolved config is written to `MODEL_DIR/config.json`.
"""

import dataclasses
import json
from typing import Any, Dict, Optional


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """A training run.

  Attributes:
    data: a beam_prep output directory (records/, transform/, manifest.json).
    model_dir: checkpoints, TensorBoard logs, metrics.json and export/.
    model: registered model name.
    width: channels of the first convolution block.
    depth: number of down-sampling blocks.
    steps: total training steps for the model directory (a resumed run trains
      until the global step reaches it).
    batch_size: examples per replica per step.
    learning_rate: Adam learning rate (for the global batch as given).
    scale_learning_rate: multiply the learning rate by the replica count.
    shuffle_buffer: examples in the shuffle buffer.
    checkpoint_every: save a checkpoint every N steps (and at the end).
    log_every: progress line and TensorBoard scalars every N steps.
    eval_batches: eval batches at the end (0: the whole eval split).
    seed: seed of model initialization and input shuffling.
    export: write a SavedModel to MODEL_DIR/export/<version>/ at the end.
  """
  data: str
  model_dir: str
  model: str = "segmentation_fcn"
  width: int = 16
  depth: int = 3
  steps: int = 300
  batch_size: int = 8
  learning_rate: float = 2e-3
  scale_learning_rate: bool = False
  shuffle_buffer: int = 256
  checkpoint_every: int = 100
  log_every: int = 25
  eval_batches: int = 0
  seed: int = 0
  export: bool = True

  def __post_init__(self):
    for name in ("steps", "batch_size", "width", "depth", "checkpoint_every", "log_every"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
    if self.learning_rate <= 0:
      raise ValueError(f"learning_rate must be positive, got {self.learning_rate}")

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

  @classmethod
  def from_dict(cls, d: Dict[str, Any]) -> "TrainConfig":
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - names
    if unknown:
      raise ValueError(f"unknown config keys: {sorted(unknown)}; known: {sorted(names)}")
    return cls(**d)


PRESETS: Dict[str, Dict[str, Any]] = {
    # What the demo and the tests run: a few hundred small steps on CPU.
    "smoke": {"width": 12, "depth": 3, "steps": 240, "batch_size": 8,
              "checkpoint_every": 80, "log_every": 40},
    "default": {},
}


def preset(name: Optional[str]) -> Dict[str, Any]:
  if not name:
    return {}
  try:
    return dict(PRESETS[name])
  except KeyError:
    raise ValueError(f"unknown preset {name!r}; choose from {sorted(PRESETS)}") from None
