"""`ListInputs` and `ReadExamples`: the inputs of any registered layout.

The layouts themselves (folders, voc, classes, manifest, coco, and any a
team registers) live in `beam_prep.layouts`, one module each. `ListInputs`
lists a layout's inputs as small pointers (on the workers, so gs:// roots
work on Dataflow); the job reads each pointer's files where its shard is
written (`beam_prep.shards`), so no encoded file crosses a shuffle.
`ReadExamples` (for pipelines of one's own) reads them right away, after a
Reshuffle that spreads the reading over workers. Each input yields one
example dict: `image_id`, `source`, `image_bytes`, and what its layout gives
(`mask_bytes`, `instance_mask`, `label`, `split`, ...).

Inputs that cannot even be listed or read (a manifest row without an image,
a path that leaves the data root, a listed file that does not exist) go to
the errors output with a reason, like every other failure.
"""

import logging
from typing import Tuple

import apache_beam as beam
from apache_beam.metrics import Metrics

from beam_prep import layouts
from beam_prep.kernel import Kernel, Tally
from beam_prep.layouts.common import ERRORS_TAG
from beam_prep.layouts.registry import also_readable

# The logger `beam-prep` prints (pipelines.logs).
LOGGER = "beam_prep"


def resolve_layout(
  root: str, layout: str, labels: str = "", offline: bool = False
) -> layouts.Layout:
  """The layout named, or for "auto" the first registered one that recognises `root`
  (and a log line naming any other that could read it: `also_readable`).

  Raises:
    layouts.InputError: nothing recognises `root`; the message lists what
      each layout expects.
    ValueError: an unknown layout name.
  """
  if layout != layouts.AUTO:
    return layouts.get_layout(layout, labels)
  found = layouts.detect(root, labels, offline)
  if found is not None:
    if not offline:  # Offline, nothing may be read: no other layout can be asked.
      _say_also_readable(root, found, labels)
    return found
  hint = ""
  parent = root.rstrip("/").rsplit("/", 1)[0] if "/" in root.rstrip("/") else ""
  if parent and layouts.detect(parent, labels, offline) is not None:
    hint = f" (its parent {parent} is one: did you mean --input {parent}?)"
  raise layouts.InputError(
    f"no input layout recognises {root}{hint}; expected one of:\n{layouts.describe(labels)}"
  )


def _say_also_readable(root: str, chosen: layouts.Layout, labels: str) -> None:
  """Logs, in one line, the other layouts that could read `root` and their
  flags: where several layouts share a format, auto's pick may be the wrong
  reading, and the records would not say so."""
  others = also_readable(root, chosen, labels)
  if not others:
    return
  ways = "; or as ".join(
    f"{lay.name}: give --layout {lay.name} for that ({lay.expects})" for lay in others
  )
  logging.getLogger(LOGGER).info(
    "--layout auto: %s read as %s (%s); it could also be read as %s",
    root,
    chosen.name,
    chosen.expects,
    ways,
  )


class _ReadFn(beam.DoFn):
  """Reads the files a pointer names; what cannot be read is an error."""

  def __init__(self, kernel: Kernel):
    self._kernel = kernel

  def setup(self):
    self._kernel.setup()
    self._read = Metrics.counter("beam_prep", "inputs_read")

  def process(self, pointer):
    self._read.inc()
    ex, errors = self._kernel.read(pointer, Tally())
    for error in errors:
      yield beam.pvalue.TaggedOutput(ERRORS_TAG, error)
    if ex is not None:
      yield ex


class ListInputs(beam.PTransform):
  """Lists the inputs of a layout as small pointers (no file is read but the
  listings: see the module docstring).

  Args:
    root: data root, or the file a file-based layout reads.
    layout: a registered layout's name, or "auto".
    allow_outside_root: let listed paths leave the data root.
    image_root: for layouts that take one (coco): the folder the listed
      image paths are relative to.

  Returns:
    `(pointers, errors)`.
  """

  def __init__(
    self,
    root: str,
    layout: str = layouts.AUTO,
    allow_outside_root: bool = False,
    image_root: str = "",
  ):
    super().__init__()
    self._layout = resolve_layout(root, layout)
    self._options = layouts.ReadOptions(root, image_root, allow_outside_root)

  @property
  def layout(self) -> str:
    return self._layout.name

  def expand(self, pbegin: beam.pvalue.PBegin) -> Tuple[beam.PCollection, beam.PCollection]:
    return pbegin | f"List{self._layout.name.title()}" >> self._layout.list_inputs(self._options)


class ReadExamples(ListInputs):
  """Reads examples from any registered layout: `ListInputs`, then the files
  of each pointer, spread over workers.

  Returns:
    `(examples, errors)`.
  """

  def expand(self, pbegin: beam.pvalue.PBegin) -> Tuple[beam.PCollection, beam.PCollection]:
    pointers, list_errors = super().expand(pbegin)
    kernel = Kernel(self._layout.name, (), "", None)
    read = (
      pointers
      | "Spread" >> beam.Reshuffle()
      | "ReadFiles" >> beam.ParDo(_ReadFn(kernel)).with_outputs(ERRORS_TAG, main="examples")
    )
    errors = (list_errors, read[ERRORS_TAG]) | "ReadErrors" >> beam.Flatten()
    return read.examples, errors
