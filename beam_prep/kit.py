"""The command lines' kit: options generated from a config dataclass, one resolver.

A config field declared with `option(default, help, ...)` is
an option of the command that builds that config: `--field-name`, typed as
the field (a tuple field is a flag given once per value), with its help and
its default shown. `resolve` is the one way a
command turns its options into a config: the dataclass defaults, then
`--preset`, then `--config FILE` (JSON), then the flags given, validated by
the dataclass. Each run writes the resolved config beside its output.
"""

import argparse
import dataclasses
from typing import Any, Dict, Iterable, List, Optional, Sequence

from beam_prep.console import check_unknown, load_config_file, option_flags, refusing


def option(
  default: Any,
  help: str,
  choices: Optional[Sequence[str]] = None,  # pylint: disable=redefined-builtin
  metavar: str = "",
  none: Any = None,
  required: bool = False,
  show_default: bool = True,
  secret: bool = False,
):
  """A config field that is also a command-line option (`beam_prep.kit` makes the flag).

  Args:
    default: the field's default.
    help: the option's help text.
    choices: the values the flag accepts.
    metavar: the flag's value name in --help.
    none: the field's value for a flag value "none" (a choice that means off).
    required: the command needs it (it has no useful default).
    show_default: add "(default: X)" to the help.
    secret: a credential: left out of the config's repr.
  """
  return dataclasses.field(
    default=default,
    repr=not secret,
    metadata={
      "help": help,
      "choices": tuple(choices) if choices else None,
      "metavar": metavar or None,
      "none": none,
      "required": required,
      "show_default": show_default,
    },
  )


def check_known(cls, d: Dict[str, Any], what: str = "config keys") -> None:
  """Raises ValueError naming the keys of `d` that are not fields of dataclass `cls`."""
  names = {f.name for f in dataclasses.fields(cls)}
  unknown = set(d) - names
  if unknown:
    raise ValueError(f"unknown {what}: {sorted(unknown)}; known: {sorted(names)}")


class CommandConfig:
  """Base of a command's frozen config dataclass: built from a plain dict
  (a config file, the resolved flags) by `from_dict`, unknown keys refused,
  lists (repeated flags, JSON arrays) made tuples."""

  @classmethod
  def from_dict(cls, d: Dict[str, Any]):
    check_known(cls, d, f"{cls.__name__} settings")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


def _flag(name: str) -> str:
  return "--" + name.replace("_", "-")


def option_fields(cls, skip: Iterable[str] = ()) -> List[dataclasses.Field]:
  """The fields of `cls` that are options (declared with `option`)."""
  skip = set(skip)
  return [f for f in dataclasses.fields(cls) if "help" in f.metadata and f.name not in skip]


def with_default(text: str, value: Any) -> str:
  """`text` + " (default: VALUE)", unless the value says nothing (off, empty)
  or the help explains it already ("(0: all)")."""
  if isinstance(value, bool) or value in ("", None, ()) or f"({value}:" in (text or ""):
    return text
  return f"{text} (default: {value})" if text else f"default: {value}"


def _help(f: dataclasses.Field) -> str:
  text = f.metadata["help"]
  if not f.metadata["show_default"] or f.metadata["required"]:
    return text
  none = f.metadata["none"]
  return with_default(text, "none" if none is not None and f.default == none else f.default)


def add_options(parser: argparse.ArgumentParser, cls, skip: Iterable[str] = ()) -> None:
  """Adds one option per option field of `cls` (dest = the field's name; None = not given)."""
  for f in option_fields(cls, skip):
    kwargs: Dict[str, Any] = {"dest": f.name, "default": None, "help": _help(f)}
    if f.type is bool or isinstance(f.default, bool):  # --x and --no-x: a preset's on is undone.
      parser.add_argument(_flag(f.name), action=argparse.BooleanOptionalAction, **kwargs)
      continue
    if isinstance(f.default, tuple):  # A repeated flag, one value each time.
      parser.add_argument(_flag(f.name), action="append", metavar=f.metadata["metavar"], **kwargs)
      continue
    kind = type(f.default) if f.default is not None else str
    parser.add_argument(
      _flag(f.name),
      type=kind,
      choices=f.metadata["choices"],
      metavar=f.metadata["metavar"],
      **kwargs,
    )


def preset(cls, name: Optional[str]) -> Dict[str, Any]:
  """The settings of preset `name` of config `cls` (its `PRESETS`; {} for no name)."""
  if not name:
    return {}
  presets = getattr(cls, "PRESETS", {})
  if name not in presets:
    raise ValueError(f"unknown preset {name!r}; choose from {sorted(presets)}")
  return dict(presets[name])


def preset_help(cls) -> str:
  """The help of a command's --preset: the names `cls` knows."""
  return "named settings: " + ", ".join(sorted(getattr(cls, "PRESETS", {})))


def resolve(
  cls,
  args: argparse.Namespace,
  fixed: Optional[Dict[str, Any]] = None,
  extra: Optional[Dict[str, Any]] = None,
  more: Sequence[type] = (),
):
  """Defaults, then preset, then config file, then flags (then `fixed`); validated.

  Args:
    cls: the config dataclass (with `from_dict`).
    args: parsed options; `preset` and `config` are read from it.
    fixed: fields the command sets itself (e.g. the task).
    extra: fields from options that are not plain fields (None: not given).
    more: option dataclasses whose flags the command also has (a task's
      options); their values join the flat fields `cls.from_dict` sorts out.

  Raises:
    ValueError: a missing required option, a bad config file, or what the
      dataclass refuses.
  """
  fields = preset(cls, getattr(args, "preset", None))
  if getattr(args, "config", None):
    fields.update(load_config_file(args.config))
  for f in [f for c in (cls, *more) for f in option_fields(c)]:
    value = getattr(args, f.name, None)
    if value is not None:
      fields[f.name] = f.metadata["none"] if value == "none" and f.metadata["choices"] else value
  for k, v in (extra or {}).items():
    if isinstance(v, dict) and isinstance(fields.get(k), dict):
      fields[k] = {**fields[k], **v}  # A nested setting given alone keeps its siblings.
    elif v is not None:
      fields[k] = v
  fields.update(fixed or {})
  missing = [
    _flag(f.name) for f in option_fields(cls) if f.metadata["required"] and not fields.get(f.name)
  ]
  if missing:
    raise ValueError(f"missing required option(s): {', '.join(missing)}")
  return cls.from_dict(fields)


def command_parser(prog: str, description: str, cls) -> argparse.ArgumentParser:
  """A command's parser: one option per option field of its config `cls`, and --verbose."""
  parser = argparse.ArgumentParser(prog=prog, description=description)
  add_options(parser, cls)
  parser.add_argument("--verbose", action="store_true", help="show library logs")
  return parser


def resolve_argv(parser: argparse.ArgumentParser, cls, argv: List[str]):
  """The config of a `command_parser` command from its argv: unknown options
  and stray values refused (naming the closest known option), then `resolve`.

  Raises:
    ValueError: what `check_unknown` or `resolve` refuses.
  """
  args, rest = parser.parse_known_args(argv)
  check_unknown(rest, option_flags(parser), parser.prog, strict=True)
  return resolve(cls, args)


def parse_command(prog: str, description: str, cls, argv: List[str]):
  """A `command_parser` command's config from its argv.

  Raises:
    Refused: naming what `resolve_argv` refuses (the command exits 2).
  """
  with refusing(ValueError, TypeError):
    return resolve_argv(command_parser(prog, description, cls), cls, argv)
