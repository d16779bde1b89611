"""A registry of heavy per-example ops: small pure functions on numpy dicts.

An op is registered by name with `@register_op("name")` on a *factory*. The
factory takes only literal arguments (numbers, strings, tuples) and returns a
function of one example dict. That function returns either one example dict
or a list of them (fan-out: one image into its objects, one object into its
click variants). It never drops an example silently: an example that cannot be
used raises `ExampleError` with a reason, and the pipeline routes it to the
dead letters.

A chain is written as a string, ops separated by `|`, arguments in Python
literal syntax:

    "decode|resize(128)|split_objects(min_pixels=20)|sample_clicks(variants=2)"

A user extends the plugin by registering an op in their own module (imported
before the pipeline is built, e.g. via `--ops-module my_ops`) and naming it in
the chain; nothing in `beam_prep` needs to change.
"""

import ast
import dataclasses
from typing import Any, Callable, Dict, List, Sequence, Tuple, Union

Example = Dict[str, Any]
OpFn = Callable[[Example], Union[Example, List[Example]]]
OpFactory = Callable[..., OpFn]

_REGISTRY: Dict[str, OpFactory] = {}


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


def register_op(name: str) -> Callable[[OpFactory], OpFactory]:
  """Registers an op factory under `name`.

  Args:
    name: the name used in op chains. Must be a Python identifier.

  Returns:
    A decorator that registers the factory and returns it unchanged.

  Raises:
    ValueError: if the name is taken by a different factory or is not an
      identifier.
  """
  if not name.isidentifier():
    raise ValueError(f"op name {name!r} is not an identifier")

  def decorator(factory: OpFactory) -> OpFactory:
    existing = _REGISTRY.get(name)
    if existing is not None and _qualname(existing) != _qualname(factory):
      raise ValueError(
          f"op {name!r} is already registered by {_qualname(existing)}")
    _REGISTRY[name] = factory
    return factory

  return decorator


def _qualname(fn: Callable[..., Any]) -> str:
  return f"{fn.__module__}.{fn.__qualname__}"


def registered_ops() -> List[str]:
  """Names of all registered ops, sorted."""
  _load_builtin_ops()
  return sorted(_REGISTRY)


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


def build_op(spec: OpSpec) -> OpFn:
  """Builds the function of one op from its spec."""
  _load_builtin_ops()
  try:
    factory = _REGISTRY[spec.name]
  except KeyError:
    raise ValueError(
        f"unknown op {spec.name!r}; registered ops: {', '.join(registered_ops())}. "
        "Register your own with beam_prep.register_op and import its module "
        "before building the pipeline.") from None
  return factory(*spec.args, **dict(spec.kwargs))


@dataclasses.dataclass
class Failure:
  """An example that an op could not use: what, where and why."""
  stage: str
  reason: str
  detail: str
  example: Example


def build_chain(
    chain: Union[str, Sequence[OpSpec]]
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
    one input costs that input, not the job.
  """
  specs = parse_chain(chain) if isinstance(chain, str) else list(chain)
  fns = [(spec.name, build_op(spec)) for spec in specs]

  def apply(example: Example) -> Tuple[List[Example], List[Failure]]:
    current, failures = [example], []
    for name, fn in fns:
      nxt = []
      for ex in current:
        try:
          out = fn(ex)
        except ExampleError as e:
          failures.append(Failure(name, e.reason, e.detail, ex))
          continue
        except Exception as e:  # pylint: disable=broad-except
          failures.append(Failure(name, "op_error", f"{type(e).__name__}: {e}", ex))
          continue
        nxt.extend(out if isinstance(out, list) else [out])
      current = nxt
    return current, failures

  return apply


def _load_builtin_ops() -> None:
  # Imported lazily so that registry.py stays importable on its own.
  # The imports register the built-in ops.
  from beam_prep.ops import clicks, distance, image  # noqa: F401  pylint: disable=unused-import
