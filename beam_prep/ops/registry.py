"""A registry of heavy per-example ops: small pure functions on numpy dicts.

An op is registered by name on a *factory*, with the features it produces:

    @register_op("distance_maps",
                 produces={"distance_maps": Feature("uint8", channels=2, normalize=255)},
                 twin=distance_maps_twin)
    def distance_maps_op(): ...

The factory takes only literal arguments (numbers, strings, tuples) and returns
a function of one example dict of numpy arrays. That function returns one
example dict or a list of them (fan-out: one image into its objects, one object
into its click variants). It never drops an example silently: an example that
cannot be used raises `ExampleError` with a reason, and the pipeline routes it
to the dead letters.

`reads` names the keys the op needs in its input, so a chain is checked before
any data is read: a key that neither the input layout nor an earlier op
provides is refused, naming the op and the key (`check_chain`). An op that
does not declare `reads` is checked at run time instead: one that fails the
same way on the first examples it meets stops the job (`beam_prep.kernel`).

`produces` (see `beam_prep.features`) is what the records will hold: an op that
adds a key or changes an existing feature (say `image`) lists it. Keys that
later ops read but the records do not keep are listed in `intermediate`. An
op that writes an array it did not declare is a bug in the op: the chain stops
with an error naming the op and the key, instead of dropping the array or
filling the dead letters with one entry per example.

`twin` is the op in TensorFlow, for the serving graph (and usable in
tf.data): called as `twin(example, *args, **kwargs)` with a dict of one
example's tensors (same keys, unbatched) and the op's own chain arguments, it
returns the dict with its outputs added or changed. Every op of a chain that
produces or changes a model input needs one before a model can be exported.
An op that changes the image's geometry also declares its `serving` side
(`beam_prep.ops.serving`): the serving graph asks it how to frame a request
and how to place a prediction back, and never names the op.

A chain is written as a string, ops separated by `|`, arguments in Python
literal syntax:

    "decode|resize(128)|split_objects(max_objects=20)|sample_clicks(variants=2)"

A user extends the plugin by registering an op in their own module (imported
before the pipeline is built, e.g. via `--ops-module my_ops`) and naming it in
the chain; nothing in `beam_prep` needs to change.

This module is a leaf: it knows no op. The built-in ops register themselves
when `beam_prep.ops` is imported (which importing this module also does).
"""

import ast
import contextlib
import dataclasses
import inspect
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from beam_prep import plugins
from beam_prep.features import Feature, FeatureError

Example = Dict[str, Any]
OpFn = Callable[[Example], Union[Example, List[Example]]]
OpFactory = Callable[..., OpFn]


@dataclasses.dataclass(frozen=True)
class OpEntry:
  """A registered op: its factory, declarations and TensorFlow twin."""

  name: str
  factory: OpFactory
  produces: Mapping[str, Feature]
  twin: Optional[Callable[..., Any]] = None
  intermediate: Tuple[str, ...] = ()
  reads: Optional[Tuple[str, ...]] = None  # None: not declared (checked at run time)
  serving: Optional[Callable[..., Any]] = None  # The serving side of a geometric op.
  add_click: Optional[Callable[..., Any]] = None  # A click encoding's update by one click.

  @property
  def provides(self) -> Tuple[str, ...]:
    """Every key the op adds or changes: records' features and intermediates."""
    return tuple(self.produces) + self.intermediate


_REGISTRY: Dict[str, OpEntry] = {}


class OpBugError(FeatureError):
  """An op fails the same way on every example it meets: a bug in the op (or
  in the chain), not bad data. It stops the job, naming the op and the error."""


class ExampleError(Exception):
  """An example cannot be used; `reason` is a short, stable, countable code.

  Attributes:
    reason: a short machine-readable code, e.g. "mask_size_mismatch"; errors
      are counted by it.
    detail: a sentence for a person, naming what was wrong.
  """

  def __init__(self, reason: str, detail: str = ""):
    super().__init__(f"{reason}: {detail}" if detail else reason)
    self.reason = reason
    self.detail = detail


def _check_declaration(name: str, produces: Mapping[str, Feature], twin, intermediate) -> None:
  """`register_op`'s arguments, checked (its Raises)."""
  if not name.isidentifier():
    raise ValueError(f"op name {name!r} is not an identifier")
  for key, feature in produces.items():
    if not isinstance(feature, Feature):
      raise FeatureError(
        f"op {name!r}: produces[{key!r}] must be a beam_prep.Feature, got {type(feature).__name__}"
      )
  overlap = set(produces) & set(intermediate)
  if overlap:
    raise FeatureError(f"op {name!r}: {sorted(overlap)} cannot be both produced and intermediate")
  if twin is not None and not callable(twin):
    raise ValueError(f"op {name!r}: twin must be a function")


def register_op(
  name: str,
  produces: Optional[Mapping[str, Feature]] = None,
  twin: Optional[Callable[..., Any]] = None,
  intermediate: Sequence[str] = (),
  reads: Optional[Sequence[str]] = None,
  serving: Optional[Callable[..., Any]] = None,
  add_click: Optional[Callable[..., Any]] = None,
) -> Callable[[OpFactory], OpFactory]:
  """Registers an op factory under `name`, with what it reads and produces.

  Args:
    name: the name used in op chains. Must be a Python identifier.
    reads: keys the op needs in its input example (checked before the job
      runs); None leaves them undeclared.
    produces: {key: Feature} for every key the op adds to the records or
      changes (see `beam_prep.features`).
    twin: the op in TensorFlow, `twin(example_tensors, *args, **kwargs)`,
      for the serving graph.
    intermediate: keys the op adds for later ops that the records do not keep.
    serving: for an op that changes the image's geometry (a crop, a resize),
      its serving side: a class built with the op's chain arguments, a
      `beam_prep.ops.serving.ServingSide` (what a request needs before the
      twins run, and how a prediction goes back to the request's image).
    add_click: a click encoding's update by one more click, in TensorFlow on
      a batch (the trainer's corrective clicks): `add_click(value, click_xy,
      positive, *args, **kwargs)`, `value` float32 [B, H, W, C] of stored
      values, `click_xy` int [B, 2], `positive` bool [B] -> the feature of
      the clicks so far plus that one.

  Returns:
    A decorator that registers the factory and returns it unchanged.

  Raises:
    ValueError: if the name is taken by a different factory or is not an
      identifier, or a declaration is not a Feature.
  """
  produces = dict(produces or {})
  _check_declaration(name, produces, twin, intermediate)

  def decorator(factory: OpFactory) -> OpFactory:
    existing = _REGISTRY.get(name)
    if existing is not None and _qualname(existing.factory) != _qualname(factory):
      raise ValueError(f"op {name!r} is already registered by {_qualname(existing.factory)}")
    _REGISTRY[name] = OpEntry(
      name,
      factory,
      produces,
      twin,
      tuple(intermediate),
      None if reads is None else tuple(reads),
      serving,
      add_click,
    )
    return factory

  return decorator


def _qualname(fn: Callable[..., Any]) -> str:
  return f"{fn.__module__}.{fn.__qualname__}"


def registered_ops() -> List[str]:
  """Names of all registered ops, sorted."""
  return sorted(_REGISTRY)


def op_entry(name: str) -> OpEntry:
  """The registration of op `name`.

  Raises:
    ValueError: no op of that name, with the registered names.
  """
  try:
    return _REGISTRY[name]
  except KeyError:
    raise ValueError(
      f"unknown op {name!r}; registered ops: {', '.join(registered_ops())}. "
      "Register your own with beam_prep.register_op and import its module "
      "before building the pipeline (--ops-module)."
    ) from None


def default_arg(name: str, arg: str) -> Any:
  """The default of argument `arg` of op `name` (its factory's signature)."""
  try:
    default = inspect.signature(op_entry(name).factory).parameters[arg].default
  except KeyError:
    raise ValueError(f"op {name!r} takes no argument {arg!r}") from None
  if default is inspect.Parameter.empty:
    raise ValueError(f"argument {arg!r} of op {name!r} has no default")
  return default


@contextlib.contextmanager
def temporary_ops() -> Iterator[None]:
  """Ops registered inside the block are forgotten after it (for tests)."""
  saved = dict(_REGISTRY)
  try:
    yield
  finally:
    _REGISTRY.clear()
    _REGISTRY.update(saved)


def import_ops_modules(ops_module: str) -> None:
  """Imports the module(s) that register user ops or layouts (`--ops-module`;
  `beam_prep.plugins`'s rule)."""
  plugins.import_modules(ops_module, "ops module")


@dataclasses.dataclass(frozen=True)
class OpSpec:
  """One parsed element of a chain: a name and literal arguments."""

  name: str
  args: Tuple[Any, ...] = ()
  kwargs: Tuple[Tuple[str, Any], ...] = ()

  def __str__(self) -> str:
    parts = [repr(a) for a in self.args]
    parts += [f"{k}={v!r}" for k, v in self.kwargs]
    return f"{self.name}({', '.join(parts)})" if parts else self.name


def parse_chain(chain: str) -> List[OpSpec]:
  """Parses `"op1|op2(3)|op3(k=1)"` into OpSpecs (literals only, no eval).

  Raises:
    ValueError: on syntax that is not a call of literal arguments.
  """
  specs = []
  for part in (p.strip() for p in chain.split("|")):
    if not part:
      continue
    try:
      node = ast.parse(part, mode="eval").body
    except SyntaxError as e:
      raise ValueError(f"cannot parse op {part!r} in chain {chain!r}") from e
    if isinstance(node, ast.Name):
      specs.append(OpSpec(node.id))
      continue
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
      raise ValueError(f"op {part!r} must be a name or a call like name(1, k=2)")
    try:
      args = tuple(ast.literal_eval(a) for a in node.args)
      kwargs = tuple((k.arg, ast.literal_eval(k.value)) for k in node.keywords)
    except ValueError as e:
      raise ValueError(f"op {part!r}: arguments must be literals") from e
    specs.append(OpSpec(node.func.id, args, kwargs))
  return specs


def declarations(specs: Sequence[OpSpec]) -> List[Tuple[str, Mapping[str, Feature]]]:
  """(op name, produces) of each op of a parsed chain, in order."""
  return [(spec.name, op_entry(spec.name).produces) for spec in specs]


def check_chain(specs: Sequence[OpSpec], available: Sequence[str], where: str = "") -> None:
  """Refuses a chain in which an op reads a key nobody provides before it.

  Args:
    specs: the parsed chain.
    available: keys every input example holds (the input layout's).
    where: what provides `available`, for the message (e.g. "the folders layout").

  Raises:
    FeatureError: naming the op, the key, and the keys that were available.
  """
  have = set(available)
  for spec in specs:
    entry = op_entry(spec.name)
    missing = [k for k in entry.reads or () if k not in have]
    if missing:
      raise FeatureError(
        f"op {spec.name!r} reads {', '.join(repr(k) for k in missing)}, which neither "
        f"{where or 'the input'} nor an op before it provides (available there: "
        f"{', '.join(sorted(have))})"
      )
    have.update(entry.provides)


def op_call(name: str, *args, **kwargs) -> str:
  """The chain text of one op call, e.g. `op_call("resize", 96)` -> "resize(96)"."""
  return str(OpSpec(name, tuple(args), tuple(kwargs.items())))


def build_op(spec: OpSpec) -> OpFn:
  """Builds the function of one op from its spec."""
  return op_entry(spec.name).factory(*spec.args, **dict(spec.kwargs))


def build_twin(spec: OpSpec) -> Optional[Callable[[Dict[str, Any]], Dict[str, Any]]]:
  """The TensorFlow twin of one op call, bound to its arguments (None if none).

  Raises:
    ValueError: the twin does not accept the op's chain arguments.
  """
  entry = op_entry(spec.name)
  if entry.twin is None:
    return None
  kwargs = dict(spec.kwargs)
  try:
    inspect.signature(entry.twin).bind(None, *spec.args, **kwargs)
  except TypeError as e:
    raise ValueError(
      f"the twin of op {spec} is called twin(example, *args, **kwargs) with "
      f"the op's arguments, and {_qualname(entry.twin)} does not accept "
      f"them: {e}"
    ) from None
  return lambda ex: entry.twin(ex, *spec.args, **kwargs)


def image_size(specs: Sequence[OpSpec]) -> Optional[Tuple[int, int]]:
  """(height, width) the chain gives its images: the size its last op with a
  geometric serving side makes them (None: no op changes the size)."""
  sizes = [side.size for side in map(build_serving, specs) if side is not None and side.size]
  return sizes[-1] if sizes else None


def combine_click(value, click_xy, positive, click_map, combine):
  """A two-channel click encoding (positive, negative) [B, H, W, 2], float32,
  with one more click per example: its kind's channel `combine`d (e.g.
  tf.minimum) with `click_map(xy [1, 2], height, width)`, that click's own
  uint8 [H, W] map. What an op's `add_click` is made of."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  shape = tf.shape(value)
  one = tf.map_fn(
    lambda xy: click_map(xy[None], shape[1], shape[2]),
    tf.cast(click_xy, tf.int64),
    fn_output_signature=tf.uint8,
  )
  one = tf.cast(one, value.dtype)  # [B, H, W]
  pos = tf.reshape(positive, [-1, 1, 1])
  return tf.stack(
    [
      tf.where(pos, combine(value[..., 0], one), value[..., 0]),
      tf.where(pos, value[..., 1], combine(value[..., 1], one)),
    ],
    axis=-1,
  )


def build_add_click(spec: OpSpec) -> Optional[Callable[..., Any]]:
  """`add_click(value, click_xy, positive)` of one op call, with its chain
  arguments (None: the op declares none)."""
  entry = op_entry(spec.name)
  if entry.add_click is None:
    return None
  return lambda value, xy, positive: entry.add_click(
    value, xy, positive, *spec.args, **dict(spec.kwargs)
  )


def build_serving(spec: OpSpec):
  """The serving side of one op call, built with its arguments (None if none)."""
  entry = op_entry(spec.name)
  if entry.serving is None:
    return None
  try:
    return entry.serving(*spec.args, **dict(spec.kwargs))
  except TypeError as e:
    raise ValueError(
      f"the serving side of op {spec} is built with the op's arguments, and "
      f"{_qualname(entry.serving)} does not accept them: {e}"
    ) from None


@dataclasses.dataclass
class Failure:
  """An example that an op could not use: what, where and why."""

  stage: str
  reason: str
  detail: str
  example: Example


def _check_declared(entry: OpEntry, before: Example, after: Example) -> None:
  """An op may add or replace arrays only under keys it declares."""
  allowed = entry.produces.keys() | set(entry.intermediate)
  for key, value in after.items():
    if key in allowed or not isinstance(value, (np.ndarray, np.generic)):
      continue
    if key not in before:
      raise FeatureError(
        f"op {entry.name!r} adds the array {key!r} ({value.dtype}, shape "
        f"{list(np.shape(value))}) without declaring it: add {key!r} to its "
        f"register_op(produces={{...}}) (or intermediate=(...) if the records must not "
        "keep it)"
      )
    if before[key] is not value:
      raise FeatureError(
        f"op {entry.name!r} changes {key!r} without declaring it: list {key!r} in its "
        "register_op(produces={...}) so that the record schema and the serving graph "
        "follow the change"
      )


def build_chain(
  chain: Union[str, Sequence[OpSpec]],
) -> Callable[[Example], Tuple[List[Example], List[Failure]]]:
  """Builds one function that applies a whole chain, with fan-out.

  A failure of one example (one object of an image, say) does not stop its
  siblings: they go on through the chain, and the failure is returned.

  Args:
    chain: a chain string or parsed specs.

  Returns:
    A function from one example to `(outputs, failures)`. `ExampleError`s
    become failures with their reason; any other exception becomes a failure
    with reason `op_error` and the exception text, so that a bug in one op on
    one input costs that input, not the job. `FeatureError` (an op writing
    what it did not declare) is raised: it is the op's bug on every input.
  """
  specs = parse_chain(chain) if isinstance(chain, str) else list(chain)
  fns = [(op_entry(spec.name), build_op(spec)) for spec in specs]

  def apply(example: Example) -> Tuple[List[Example], List[Failure]]:
    current, failures = [example], []
    for entry, fn in fns:
      nxt = []
      for ex in current:
        try:
          out = fn(ex)
        except ExampleError as e:
          failures.append(Failure(entry.name, e.reason, e.detail, ex))
          continue
        except FeatureError:
          raise
        except Exception as e:  # pylint: disable=broad-except
          failures.append(Failure(entry.name, "op_error", f"{type(e).__name__}: {e}", ex))
          continue
        outs = out if isinstance(out, list) else [out]
        for o in outs:
          _check_declared(entry, ex, o)
        nxt.extend(outs)
      current = nxt
    return current, failures

  return apply
