"""A registry of input layouts: how a data set lies on disk.

A layout module declares, once, everything about one way data sets are
stored: how to recognise it (`detect`), what must exist for it to find any
input (`check_input`), how to list its inputs as small pointers (`list_inputs`,
a Beam PTransform run on the workers, so gs:// roots work on Dataflow) and how
to read one pointer into an example (`materialize`: the encoded image and its
instance mask or class name). It registers an instance with
`register_layout`; `--layout auto` asks each registered layout, in order of
`priority`, whether it recognises the input, then (`also_readable`) which
others could read it too (`has_files`: a format several layouts share, told
apart by the root's name or not at all), to say so. Adding a layout is one
module and one registration; no other file learns its name.

Every materialized example holds `image_id`, `source` and `image_bytes`, and
what the layout's `gives` lists (`mask_bytes`, `instance_mask`, `label`,
...); a pointer may carry `split` ("train"/"eval") when the layout fixes it.

This module is a leaf: it knows no layout. The built-in layouts register
themselves when `beam_prep.layouts` is imported.
"""

import dataclasses
from typing import Any, Dict, List, Optional, Tuple

from beam_prep import keys
from beam_prep.features import Feature

# What every layout gives every record: its image id (tracing, ordering, splits).
READ_FEATURES = {keys.IMAGE_ID: Feature("string", shape=(), role="metadata")}
# Keys every materialized example holds.
BASE_KEYS = (keys.IMAGE_ID, keys.SOURCE, keys.IMAGE_BYTES)
AUTO = "auto"

_LAYOUTS: Dict[str, "Layout"] = {}


class InputError(Exception):
  """The input holds nothing this layout can read; the message says what was expected."""


@dataclasses.dataclass(frozen=True)
class ReadOptions:
  """Settings of the input a layout may use.

  Attributes:
    root: the data root, or the file a file-based layout reads.
    image_root: the folder image paths in an annotation file are relative
      to ("" = the annotation file's folder), for layouts with `image_root`.
    allow_outside_root: let listed paths leave the data root.
  """

  root: str
  image_root: str = ""
  allow_outside_root: bool = False


class Layout:
  """What a layout module declares (subclass it and register an instance).

  Attributes:
    name: the `--layout` value.
    labels: what the layout's inputs carry: a subset of {"instances",
      "classes"} (see `Task.labels`).
    gives: keys its examples hold besides `BASE_KEYS`.
    expects: one line for `--help` and errors: what the input looks like.
    priority: `--layout auto` asks layouts in increasing priority.
    takes_image_root: whether `--image-root` means something to it.
  """

  name = ""
  labels: Tuple[str, ...] = ()
  gives: Tuple[str, ...] = ()
  expects = ""
  priority = 50
  takes_image_root = False

  def detect(self, root: str, offline: bool = False) -> bool:
    """Whether `root` looks like this layout (offline: judge by the name only)."""
    raise NotImplementedError

  def has_files(self, root: str) -> bool:
    """Whether `root` holds the files this layout reads, whatever its name
    (`detect` may also ask for a name); False unless a layout says.

    `--layout auto` asks it of the layouts it did not pick, to name those
    that could read the input too (formats shared by several layouts)."""
    del root
    return False

  def check_input(self, options: ReadOptions) -> None:
    """Raises InputError when a local input cannot hold any input of this layout."""

  def list_inputs(self, options: ReadOptions):
    """A PTransform from the pipeline's root to `(pointers, errors)`."""
    raise NotImplementedError

  def materialize(self, pointer: Dict[str, Any]) -> Dict[str, Any]:
    """Reads one pointer's files into an example (raises ExampleError)."""
    raise NotImplementedError

  def only_split(self, options: ReadOptions) -> Optional[str]:
    """The split of every input, when this input fixes one for all (a
    benchmark's evaluation list alone: "eval"); None otherwise."""
    del options
    return None


def register_layout(cls):
  """Registers a `Layout` subclass (decorator); returns the class."""
  layout = cls()
  if not layout.name.isidentifier() or layout.name == AUTO:
    raise ValueError(f"layout name {layout.name!r} must be an identifier other than {AUTO!r}")
  existing = _LAYOUTS.get(layout.name)
  if existing is not None and type(existing).__qualname__ != cls.__qualname__:
    raise ValueError(
      f"layout {layout.name!r} is already registered by {type(existing).__qualname__}"
    )
  _LAYOUTS[layout.name] = layout
  return cls


def layouts_for(labels: str = "") -> List[Layout]:
  """The registered layouts whose inputs carry `labels` (all for ""), by priority."""
  found = [lay for lay in _LAYOUTS.values() if not labels or labels in lay.labels]
  return sorted(found, key=lambda lay: (lay.priority, lay.name))


def layout_names(labels: str = "") -> List[str]:
  return [lay.name for lay in layouts_for(labels)]


def get_layout(name: str, labels: str = "") -> Layout:
  """The registered layout `name` (that carries `labels`, when given).

  Raises:
    ValueError: no such layout, or it does not carry `labels`.
  """
  layout = _LAYOUTS.get(name)
  if layout is None:
    raise ValueError(
      f"--layout must be {AUTO} or one of {', '.join(layout_names(labels))}, got {name!r}"
    )
  if labels and labels not in layout.labels:
    raise ValueError(
      f"the {name} layout gives {' or '.join(layout.labels)}, not the {labels} "
      f"this task needs; layouts that do: {', '.join(layout_names(labels))}"
    )
  return layout


def detect(root: str, labels: str = "", offline: bool = False) -> Optional[Layout]:
  """The first layout (by priority) that recognises `root`, else None."""
  for layout in layouts_for(labels):
    try:
      if layout.detect(root, offline):
        return layout
    except Exception:  # pylint: disable=broad-except
      continue  # A layout that cannot tell does not recognise it.
  return None


def also_readable(root: str, chosen: Layout, labels: str = "") -> List[Layout]:
  """The layouts other than `chosen` (by priority) whose files `root` holds
  (`Layout.has_files`)."""
  found = []
  for layout in layouts_for(labels):
    try:
      if layout is not chosen and layout.has_files(root):
        found.append(layout)
    except Exception:  # pylint: disable=broad-except
      continue  # A layout that cannot tell does not read it.
  return found


def describe(labels: str = "") -> str:
  """One line per layout: name and what it expects (for --help and errors)."""
  return "\n".join(f"  {lay.name:<10}{lay.expects}" for lay in layouts_for(labels))
