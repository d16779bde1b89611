"""Image classification: one record per image, labelled with its class name."""

from typing import List

from beam_prep.tasks.plan import decode_chain, join
from beam_prep.tasks.registry import EXAMPLE, INPUT, Stage, Task, register_task


@register_task
class Classification(Task):
  name = "classification"
  summary = "records for image classification"
  labels = "classes"

  def stages(self, config) -> List[Stage]:
    """Decode (per image), then check the label and run the user's ops (per record)."""
    return [
      Stage(
        "DecodeExamples",
        decode_chain(config.image_size, config.max_pixels, require_mask=False),
        INPUT,
      ),
      Stage("CheckLabels", join("require_label", config.ops), EXAMPLE),
    ]

  def examples_per_unit(self, config) -> int:
    del config
    return 1
