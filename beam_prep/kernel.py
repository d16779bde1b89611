"""The per-input kernel: one input pointer -> records, dead letters, counts.

One plain function of one input, with no Beam inside: the job's shard writer
(`beam_prep.shards.write`), `ApplyOps`/`ReadExamples` and the benchmark loop
all call it. It reads the pointer's files through the run's input layout,
runs the task's op stages in order, encodes each finished example with the
run's `FeatureTable`, and counts what happened at the level it happened:

| level   | found                         | failed                          |
|---------|-------------------------------|---------------------------------|
| input   | `inputs_read` (pointers)      | `images_failed` (read, decode)  |
| object  | `objects_found` (fan-out of   | `objects_failed` (click         |
|         | the input stages, failed      | sampling, failed annotations,   |
|         | annotations, objects of       | objects of images that failed)  |
|         | images that failed)           |                                 |
| example | `examples_made` (fan-out of   | `example_errors` (encodings,    |
|         | the object stages)            | the user's ops)                 |

so `images_used + images_failed == inputs_read` and `objects_used +
objects_failed == objects_found` hold by construction, and `examples_written
+ example_errors == examples_made == units used x examples per unit` is what
`Tally.accounting` checks.

A record is one unit (an object, or an image when nothing fans out) with the
examples it finished (`RecordCodec.encode_unit`: the variants stacked, a
failed one absent). `examples/SPLIT` counts the examples written, as
(object, variant) pairs, so the accounting above is unchanged;
`records/SPLIT` counts the records that hold them.

`images_known` counts the inputs of a job that adds to an output (`--add`)
whose image the output holds already (`beam_prep.image_index`): read and
skipped, so outside `images_used` and every count below the input level;
`images_relabelled` those of them held with other labels.

`objects_box_only` counts annotations that mark an object by its box alone
(a layout's pointer says how many, `objects_box_only`): the layout makes
their boxes ignore pixels. They are not objects to train on and did not
fail, so they are outside `objects_found`.

`OBJECT_NOTES` are counts of used objects that an op marks on their examples:
`objects_margin_reduced` counts the objects with no pixel `d_margin` from
their boundary, whose positive clicks keep the largest margin they allow
(`beam_prep.ops.clicks`). Each object is counted once, when it fans out into
its examples.

An op that raises the same unexpected exception on each of the first
`OP_BUG_AFTER` examples it meets, before any record was made, has a bug (a
key it reads that nothing provides, say): the kernel raises `OpBugError`,
which stops the job, instead of dead-lettering every example.
"""

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple

from beam_prep import image_index, keys, layouts, source_records
from beam_prep.dead_letters import READ_STAGE, error_record
from beam_prep.ops import registry
from beam_prep.ops.clicks import MARGIN_REDUCED
from beam_prep.ops.registry import ExampleError, OpBugError
from beam_prep.tasks.registry import EXAMPLE, INPUT, OBJECT, Stage
from beam_prep.record_codec import RecordCodec

OP_BUG_AFTER = 8
OP_ERROR = "op_error"
_FOUND = {OBJECT: "objects_found", EXAMPLE: "examples_made"}
_FAILED = {INPUT: "images_failed", OBJECT: "objects_failed", EXAMPLE: "example_errors"}
# {example key: count}: objects whose examples hold a true value under the key.
OBJECT_NOTES = {MARGIN_REDUCED: "objects_margin_reduced"}
COUNTS = (
  "inputs_read",
  "images_failed",
  "objects_found",
  "objects_failed",
  "objects_of_failed_images",
  "objects_box_only",
  *OBJECT_NOTES.values(),
  "examples_made",
  "example_errors",
  "images_known",
  "images_relabelled",
)


def _sample_order(error: Dict[str, Any]) -> Tuple:
  return (
    error.get(keys.SOURCE, ""),
    error.get(keys.IMAGE_ID, ""),
    error.get(keys.OBJECT_ID, -1),
    error.get(keys.VARIANT, -1),
  )


class Tally:
  """Counts of one input, a group or a whole job; sums with `merge`.

  Attributes:
    counts: the `COUNTS`, plus `examples/SPLIT` examples and `records/SPLIT`
      records written per split.
    reasons: dead letters per reason.
    samples: one dead letter per reason (the first in a stable order), for
      the job's closing lines.
  """

  def __init__(self):
    self.counts: Dict[str, int] = {}
    self.reasons: Dict[str, int] = {}
    self.samples: Dict[str, Dict[str, Any]] = {}

  def add(self, key: str, n: int = 1) -> None:
    if n:
      self.counts[key] = self.counts.get(key, 0) + n

  def fail(self, error: Dict[str, Any], level: Optional[str]) -> None:
    """Counts one dead letter, and its unit at `level` as failed (None: no unit)."""
    if level is not None:
      self.add(_FAILED[level])
    reason = error["reason"]
    self.reasons[reason] = self.reasons.get(reason, 0) + 1
    kept = self.samples.get(reason)
    if kept is None or _sample_order(error) < _sample_order(kept):
      self.samples[reason] = error

  def merge(self, other: "Tally") -> "Tally":
    for k, v in other.counts.items():
      self.add(k, v)
    for reason, n in other.reasons.items():
      self.reasons[reason] = self.reasons.get(reason, 0) + n
      kept = self.samples.get(reason)
      sample = other.samples[reason]
      if kept is None or _sample_order(sample) < _sample_order(kept):
        self.samples[reason] = sample
    return self

  def written(self) -> Dict[str, int]:
    return {s: self.counts.get(f"examples/{s}", 0) for s in (keys.TRAIN_SPLIT, keys.EVAL_SPLIT)}

  def accounting(self, per_unit: int, splits_objects: bool) -> Dict[str, Any]:
    """The manifest's counts, and whether they add up (`accounted`)."""
    c = {k: self.counts.get(k, 0) for k in COUNTS}
    written = self.written()
    images_used = c["inputs_read"] - c["images_failed"] - c["images_known"]
    objects_used = c["objects_found"] - c["objects_failed"]
    units = objects_used if splits_objects else images_used
    total = sum(written.values())
    return {
      "inputs_read": c["inputs_read"],
      "images_used": images_used,
      "images_failed": c["images_failed"],
      **({k: c[k] for k in ("images_known", "images_relabelled")} if c["images_known"] else {}),
      "objects_found": c["objects_found"],
      "objects_used": objects_used,
      "objects_failed": c["objects_failed"],
      "objects_of_failed_images": c["objects_of_failed_images"],
      "objects_box_only": c["objects_box_only"],
      **{k: c[k] for k in OBJECT_NOTES.values()},
      "examples_made": c["examples_made"],
      "example_errors": c["example_errors"],
      "examples_written": written,
      "records_written": {
        s: self.counts.get(f"records/{s}", 0) for s in (keys.TRAIN_SPLIT, keys.EVAL_SPLIT)
      },
      "source_records": self.counts.get(f"examples/{source_records.SPLIT}", 0),
      "errors_by_reason": dict(sorted(self.reasons.items())),
      "errors_total": sum(self.reasons.values()),
      "accounted": (
        total + c["example_errors"] == c["examples_made"] == units * per_unit
        and min(images_used, objects_used) >= 0
      ),
    }


@dataclasses.dataclass
class Result:
  """What one input became."""

  records: List[bytes]
  errors: List[Dict[str, Any]]
  tally: Tally
  row: Optional[bytes]  # The image's row for tf.Transform's analysis.
  source: Optional[bytes] = None  # An eval image at its own size (`source_records`).
  index: Optional[Dict[str, Any]] = None  # The image's line of the image index.


class Kernel:
  """Turns one input pointer into its records, dead letters and counts.

  Args:
    layout: name of the run's input layout (registered).
    stages: the task's `Stage`s.
    ops_module: module(s) the workers import first (user ops).
    table: the run's FeatureTable.
    summary_rows: the image's analysis row is its summary
      (`RecordCodec.summary_row`, for the default preprocessing_fn), else
      its first record.
    held_by: (output, sets, one label per image): skip the images these
      shard sets of a prep output hold (`image_index.held`), counting them
      as `images_known`.
  """

  def __init__(
    self,
    layout: str,
    stages: Sequence[Stage],
    ops_module: str,
    table,
    summary_rows: bool = True,
    held_by: Optional[Tuple[str, Tuple[str, ...], bool]] = None,
  ):
    self.layout_name = layout
    self.stages = [s for s in stages if s.chain]
    self.ops_module = ops_module
    self.table = table
    self.codec = RecordCodec(table)
    self.summary_rows = summary_rows
    self.held_by = held_by
    self._held: Optional[image_index.Held] = None
    self._fns = None
    self._layout = None
    self._bugs: Dict[Tuple[str, str], int] = {}
    self._made_records = False

  def setup(self) -> None:
    if self._fns is None:
      registry.import_ops_modules(self.ops_module)
      self._layout = layouts.get_layout(self.layout_name) if self.layout_name else None
      self._fns = [registry.build_chain(s.chain) for s in self.stages]
    if self.held_by is not None and self._held is None:
      self._held = image_index.held(*self.held_by)

  # ---- reading -------------------------------------------------------------

  def read(
    self, pointer: Dict[str, Any], tally: Tally, digests: Optional[Dict[str, str]] = None
  ) -> Tuple[Optional[Dict[str, Any]], List[Dict[str, Any]]]:
    """The pointer's example as its layout reads it (None when that failed),
    and the dead letters of reading; everything is counted in `tally`.

    With `digests` (a dict to fill), the image's digests (`image_index`), and
    None with no dead letter for an image the output held already."""
    self.setup()
    errors = list(pointer.get("object_errors", ()))  # Objects that failed when listed.
    if pointer.get("no_image"):
      self._objects_failed(errors, tally)
      return None, errors
    tally.add("inputs_read")
    error = pointer.get("read_error")
    if error is None:
      try:
        ex = self._layout.materialize(pointer)
      except ExampleError as e:
        error = error_record(READ_STAGE, e.reason, e.detail, pointer)
      else:
        if digests is not None and self._is_held(ex, tally, digests):
          return None, []
    tally.add("objects_box_only", int(pointer.get("objects_box_only", 0)))
    if error is not None:
      self._objects_failed(errors, tally)
      self._image_failed(pointer, error, tally, len(errors))
      return None, errors + [error]
    errors += ex.pop("object_errors", [])
    self._objects_failed(errors, tally)
    return ex, errors

  def _is_held(self, ex: Dict[str, Any], tally: Tally, digests: Dict[str, str]) -> bool:
    """Fills `digests` of a read example (`image_index`); whether the output
    it is added to holds its image already (counted as known, and relabelled
    when held with other labels)."""
    digests[image_index.DIGEST] = image_index.image_digest(ex[keys.IMAGE_BYTES])
    digests[image_index.LABELS] = image_index.labels_digest(ex, self._layout.gives)
    if self._held is None:  # Not a job that adds to an output.
      return False
    found = image_index.status(
      self._held,
      ex[keys.IMAGE_ID],
      digests[image_index.DIGEST],
      digests[image_index.LABELS],
    )
    if found == image_index.NEW:
      return False
    tally.add("images_known")
    tally.add("images_relabelled", int(found == image_index.RELABELLED))
    return True

  @staticmethod
  def _objects_failed(errors, tally: Tally) -> None:
    for error in errors:
      tally.add("objects_found")
      tally.fail(error, OBJECT)

  @staticmethod
  def _image_failed(pointer, error, tally: Tally, counted: int) -> None:
    """An image failed: it, and the objects listed with it not yet counted."""
    tally.fail(error, INPUT)
    lost = max(int(pointer.get("objects_listed", 0)) - counted, 0)
    for key in ("objects_found", "objects_failed", "objects_of_failed_images"):
      tally.add(key, lost)

  # ---- the op stages -------------------------------------------------------

  def apply(
    self, ex: Dict[str, Any], tally: Tally, counted: int = 0
  ) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]], Optional[Dict[str, Any]]]:
    """Runs the stages on one read example -> (finished examples, dead letters,
    the example after the `source` stage, or None).

    `counted`: objects of this image already counted (failed when listed).
    """
    finished, errors, source = self.apply_units(ex, tally, counted)
    return [out for unit in finished for out in unit], errors, source

  def apply_units(
    self, ex: Dict[str, Any], tally: Tally, counted: int = 0
  ) -> Tuple[List[List[Dict[str, Any]]], List[Dict[str, Any]], Optional[Dict[str, Any]]]:
    """`apply`, with the finished examples grouped by unit: a unit is an item
    entering the first stage past the input level (an object, or an image
    when nothing fans out); units that finished no example are left out."""
    self.setup()
    current, errors, source = [(0, ex)], [], None
    level = INPUT
    for i, (stage, fn) in enumerate(zip(self.stages, self._fns)):
      if level == INPUT and stage.level != INPUT:
        current = [(n, item) for n, (_, item) in enumerate(current)]
      level = stage.level
      after = []
      for unit, item in current:
        outputs, failures = fn(item)
        for f in failures:
          error = error_record(f.stage, f.reason, f.detail, f.example)
          errors.append(error)
          if stage.level == INPUT:
            self._image_failed(ex, error, tally, counted)
          else:
            tally.fail(error, stage.level)
          self._watch(f, error)
        after.extend((unit, out) for out in outputs)
      current = after
      if stage.source and current:
        source = current[0][1]
      nxt = self.stages[i + 1].level if i + 1 < len(self.stages) else EXAMPLE
      if nxt != stage.level:
        tally.add(_FOUND[nxt], len(current))
        for key, count in OBJECT_NOTES.items():
          tally.add(count, len({unit for unit, item in current if item.get(key)}))
    if level == INPUT:  # Nothing past the input level: each example its own unit.
      current = list(enumerate(item for _, item in current))
    units: Dict[int, List[Dict[str, Any]]] = {}
    for unit, item in current:
      units.setdefault(unit, []).append(item)
    return list(units.values()), errors, source

  def _watch(self, failure, error) -> None:
    """Stops the job when an op fails the same way on the first examples it meets."""
    if failure.reason != OP_ERROR or self._made_records:
      return
    key = (failure.stage, failure.detail)
    self._bugs[key] = self._bugs.get(key, 0) + 1
    if self._bugs[key] >= OP_BUG_AFTER:
      where = error[keys.SOURCE] + "".join(
        f", {k} {error[k]}" for k in (keys.OBJECT_ID, keys.VARIANT) if k in error
      )
      raise OpBugError(
        f"op {failure.stage!r} raised {failure.detail} on each of the first "
        f"{self._bugs[key]} examples that reached it (the first: {where}). That is a bug in "
        "the op or the chain, not bad data, so the job stopped. An op that declares the keys "
        "it reads (register_op(..., reads=(...))) is checked before the job starts."
      )

  # ---- the whole input -----------------------------------------------------

  def process(self, pointer: Dict[str, Any], split: str = keys.TRAIN_SPLIT) -> Result:
    """One input pointer -> its records, dead letters, counts and analysis row,
    and for an eval input, its source record (when a stage keeps one).

    Its records are counted as written to `split`.
    """
    tally, digests = Tally(), {}
    ex, read_errors = self.read(pointer, tally, digests)
    if ex is None:
      return Result([], read_errors, tally, None)
    units, errors, source = self.apply_units(ex, tally, counted=len(read_errors))
    records = [self.codec.encode_unit(unit) for unit in units]
    tally.add(f"examples/{split}", sum(len(unit) for unit in units))
    tally.add(f"records/{split}", len(records))
    row = None
    if records:
      self._made_records = True
      first = units[0][0]
      row = self.codec.summary_row(first) if self.summary_rows else self.codec.encode(first)
    # The image index lists an image the output holds: in records, or as a
    # source record alone (objects too small for the records' size).
    index = image_index.entry({**pointer, **digests}, split, len(records))
    if source is None or split != keys.EVAL_SPLIT or tally.counts.get("images_failed"):
      return Result(records, read_errors + errors, tally, row, index=index if records else None)
    tally.add(f"examples/{source_records.SPLIT}")
    encoded = source_records.encode(source)
    return Result(records, read_errors + errors, tally, row, encoded, index)
