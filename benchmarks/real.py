"""Real photographs: the product's training arms side by side on a real data set.

    python -m benchmarks --real DIR [--real-layout NAME] [--real-steps N]
                         [--real-image-size 128] [--real-batch 16] [--real-max-clicks 20]
                         [--json PATH] [--workdir DIR]

DIR is any input `beam-prep segmentation` reads (`--layout auto` unless
`--real-layout` names one). For each distinct prep setting of the arms below
the set is prepared once (`beam-prep segmentation --preset real`, with
`--eval-percent 20`: the held-out images are fixed by a hash of the image id,
or by the layout's own split lists), each arm with a model is trained for the
same number of steps (`beam-train fit --preset real`, less what the arm takes
away), and every held-out object is evaluated at the images' own size through
the exported serving graph (`beam-train evaluate --resolution source`); the
`baseline` arm is the nearest-click baseline alone (no model). The commands
run in this process, exactly as their command lines run them; each one's own
output goes to a log file under the workdir.

Per arm: NoC@85, NoC@90, mean IoU after 1, 3 and 5 clicks, objects evaluated,
training steps/s (`metrics.json`: examples/s over the global batch, the first,
tracing step excluded) and the arm's wall time (fit + evaluation; the shared
prep is timed apart). An arm whose flags a command does not know (yet) is
skipped with the reason, never run with a flag dropped.
"""

import argparse
import dataclasses
import json
import os
import re
import shutil
import sys
import tempfile
import time
from typing import Any, Dict, List, Sequence

from benchmarks.common import environment, log, run_command, write_result
from train import model_layout
from train.evaluate import protocol

# Every arm runs both commands with `--preset PRESET`; the corrective arm is
# the preset itself (mask guidance and corrective clicks), the others take
# parts of the recipe away.
PRESET = "real"
# The arms, in the order of the table. `prep`: extra `beam-prep segmentation`
# flags, None for any prep the run makes (every prep holds the same held-out
# images at their own size: an arm without a model needs no prep of its
# own); `fit`: extra `beam-train fit` flags, None for no model (the
# nearest-click baseline). Adding an arm is adding an entry.
ARMS: List[Dict[str, Any]] = [
  {"name": "baseline", "prep": None, "fit": None},
  {
    "name": "single",
    "prep": ["--no-previous-mask"],
    "fit": ["--mask-rounds", "0", "--no-corrective-clicks"],
  },
  {"name": "prev_mask", "prep": [], "fit": ["--no-corrective-clicks"]},
  {"name": "corrective", "prep": [], "fit": []},
]

EVAL_PERCENT = 20  # The held-out share of images, fixed by a hash of the image id.
SEED = 0
# Training steps of every arm with a model: a few minutes of `beam-train fit
# --preset real` at 128 px and batch 16 on 2 CPU cores (the rates measured:
# docs/performance.md, "Step budget").
DEFAULT_STEPS = 300
IOU_AT = (1, 3, 5)
PROG = "python -m benchmarks --real"


class RealError(Exception):
  """The data set cannot be used; the message is one line."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
  """The `--real` flags of `python -m benchmarks`."""

  parser.add_argument(
    "--real",
    metavar="DIR",
    help="measure the training arms on a real data set DIR (any layout "
    "beam-prep segmentation reads); --json and --workdir apply, --quick "
    "and --plot do not",
  )
  parser.add_argument(
    "--real-layout", default="auto", metavar="NAME", help="--real: the input layout (default: auto)"
  )
  parser.add_argument(
    "--real-steps",
    type=int,
    default=DEFAULT_STEPS,
    metavar="N",
    help="--real: training steps of every arm with a model (default: %(default)s)",
  )
  parser.add_argument(
    "--real-image-size",
    type=int,
    default=128,
    metavar="N",
    help="--real: records' image size (default: %(default)s)",
  )
  parser.add_argument(
    "--real-batch",
    type=int,
    default=16,
    metavar="B",
    help="--real: training batch size (default: %(default)s)",
  )
  parser.add_argument(
    "--real-max-clicks",
    type=int,
    default=protocol.NOC_MAX_CLICKS,
    metavar="K",
    help="--real: clicks per object at most in NoC (default: %(default)s)",
  )
  parser.add_argument(
    "--real-arms",
    default="",
    metavar="A,B",
    help="--real: run only these arms, comma-separated (default: all: "
    f"{', '.join(a['name'] for a in ARMS)})",
  )


@dataclasses.dataclass(frozen=True)
class Settings:
  data: str
  layout: str
  workdir: str
  steps: int
  image_size: int
  batch: int
  max_clicks: int
  arms: tuple

  def prep_flags(self) -> List[str]:
    return [
      "--preset",
      PRESET,
      "--layout",
      self.layout,
      "--image-size",
      str(self.image_size),
      "--eval-percent",
      str(EVAL_PERCENT),
      "--seed",
      str(SEED),
    ]

  def fit_flags(self) -> List[str]:
    return [
      "--preset",
      PRESET,
      "--steps",
      str(self.steps),
      "--batch-size",
      str(self.batch),
      "--seed",
      str(SEED),
      "--noc-clicks",
      "0",
      "--histogram-every",
      "0",
      "--checkpoint-every",
      str(self.steps),
      "--log-every",
      str(max(1, self.steps // 10)),
    ]


def main(args: argparse.Namespace) -> int:
  """Runs the arms on `args.real`; 0 when every arm that exists ran, 1 when
  one failed, 2 when the data set cannot be read."""
  t0 = time.time()
  try:
    s = _settings(args)
  except RealError as e:
    print(f"{PROG}: {e}", file=sys.stderr)
    return 2
  log(
    f"real: {s.data} ({s.layout} layout), {s.image_size} px, batch {s.batch}, {s.steps} "
    f"steps, NoC up to {s.max_clicks} clicks; work in {s.workdir}"
  )
  arms = [dict(arm, **availability(arm)) for arm in ARMS if arm["name"] in s.arms]
  preps = _prepare(s, arms)
  results = [_run_arm(s, arm, preps) for arm in arms]
  result = {
    "data": s.data,
    "settings": dataclasses.asdict(s),
    "eval_percent": EVAL_PERCENT,
    "preset": PRESET,
    "seed": SEED,
    "preps": list(preps.values()),
    "arms": results,
    "environment": environment(),
    "seconds": time.time() - t0,
  }
  path = args.json or os.path.join(s.workdir, "real.json")
  write_result(result, path, table(result))
  return 1 if any(a["status"] == "failed" for a in results) else 0


def _settings(args: argparse.Namespace) -> Settings:
  """The run's settings, with the data set checked and its layout resolved.

  Raises:
    RealError: DIR is missing, no layout reads it, or it holds nothing to train on.
  """
  for name in ("real_steps", "real_image_size", "real_batch", "real_max_clicks"):
    if getattr(args, name) < 1:
      raise RealError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
  arms = _arm_names(args.real_arms)
  data = os.path.abspath(args.real) if args.real else ""
  if not data or not os.path.exists(data):
    raise RealError(f"{args.real or 'DIR'}: no such file or directory")
  workdir = os.path.abspath(args.workdir) if args.workdir else ""
  for flag, path in (("--workdir", workdir), ("--json", args.json)):
    path = os.path.abspath(path) if path else ""
    if path and os.path.isdir(data) and (path + os.sep).startswith(data + os.sep):
      raise RealError(f"{flag} {path} is inside the data set {data}: nothing is written there")
  from pipelines import logs  # pylint: disable=g-import-not-at-top

  logs.quiet()  # Before the layouts' imports bring TensorFlow in.
  layout = resolve_layout(data, args.real_layout, workdir or tempfile.gettempdir())
  workdir = workdir or tempfile.mkdtemp(prefix="beam_prep_real_")
  os.makedirs(workdir, exist_ok=True)
  return Settings(
    data=data,
    layout=layout,
    workdir=workdir,
    steps=args.real_steps,
    image_size=args.real_image_size,
    batch=args.real_batch,
    max_clicks=args.real_max_clicks,
    arms=arms,
  )


def _arm_names(text: str) -> tuple:
  """`--real-arms A,B` -> the named arms, in the table's order ('': all).

  Raises:
    RealError: a name is not an arm's.
  """
  known = [a["name"] for a in ARMS]
  asked = [n.strip() for n in text.split(",") if n.strip()] or known
  unknown = [n for n in asked if n not in known]
  if unknown:
    raise RealError(f"--real-arms: no arm named {', '.join(unknown)} (arms: {', '.join(known)})")
  return tuple(n for n in known if n in asked)


def resolve_layout(data: str, layout: str, workdir: str) -> str:
  """The layout `beam-prep segmentation --layout LAYOUT` reads `data` with, after
  its own checks of the input (`pipelines.prep`).

  Raises:
    RealError: in one line, why `data` cannot be read or trained on.
  """
  from beam_prep import layouts  # pylint: disable=g-import-not-at-top
  from beam_prep.config import PrepConfig  # pylint: disable=g-import-not-at-top
  from pipelines import prep  # pylint: disable=g-import-not-at-top

  try:
    config = PrepConfig.from_dict({"input": data, "output": workdir, "layout": layout})
    config = prep.with_layout(config, dry_run=False)
    prep.check_input(config)
  except prep.InputError as e:
    first = " ".join(str(e).splitlines()[0].rstrip(":").replace("; expected one of", "").split())
    if layout != layouts.AUTO:
      raise RealError(first) from None
    raise RealError(
      f"{first} (--real-layout NAME names one of: {', '.join(layouts.layout_names('instances'))})"
    ) from None
  except ValueError as e:
    raise RealError(" ".join(str(e).replace("--layout ", "--real-layout ").split())) from None
  if config.eval_only:
    raise RealError(
      f"{data}: every input is in the eval split (the {config.layout} layout's "
      "lists): nothing to train on"
    )
  return config.layout


def _flag_names(argv: Sequence[str]) -> List[str]:
  return [a.split("=", 1)[0] for a in argv if a.startswith("--")]


def availability(arm: Dict[str, Any]) -> Dict[str, Any]:
  """{"skip": why} when a command does not know one of the arm's flags, else {}."""
  from beam_prep.console import option_flags  # pylint: disable=g-import-not-at-top
  from pipelines.cli import prep_parser  # pylint: disable=g-import-not-at-top
  from train.cli import fit_parser  # pylint: disable=g-import-not-at-top

  known = option_flags(prep_parser("segmentation"))
  prep = arm["prep"] or []
  missing = [f"beam-prep segmentation {f}" for f in _flag_names(prep) if f not in known]
  if arm["fit"] is not None:
    known = option_flags(fit_parser())
    missing += [f"beam-train fit {f}" for f in _flag_names(arm["fit"]) if f not in known]
  if not missing:
    return {}
  return {"skip": f"not available yet: {', '.join(missing)} (unknown to the command's --help)"}


def _failure(what: str, code: int, log_path: str) -> str:
  with open(log_path) as f:
    lines = [line.strip() for line in f.read().splitlines() if line.strip()]
  last = lines[-1] if lines else "no output"
  return f"{what} exited {code}: {last} (log: {log_path})"


def _prep_name(flags: Sequence[str]) -> str:
  return "prep" + "".join("_" + re.sub(r"[^A-Za-z0-9.]+", "-", f.lstrip("-")) for f in flags)


def prep_keys(arms: List[Dict[str, Any]]) -> List[tuple]:
  """The distinct prep settings (extra flags) the arms that run need, in
  their order: the default flags for an arm that takes any prep when no
  other arm makes one."""
  running = [arm for arm in arms if "skip" not in arm]
  keys = [tuple(arm["prep"]) for arm in running if arm["prep"] is not None]
  if running and not keys:
    keys = [()]  # Only arms that take any prep: the default flags'.
  return list(dict.fromkeys(keys))


def _prepare(s: Settings, arms: List[Dict[str, Any]]) -> Dict[tuple, Dict[str, Any]]:
  """Runs `beam-prep segmentation` once per setting of `prep_keys` ->
  {prep flags: {dir, flags, seconds, counts or error}}."""
  return {key: _prep(s, key) for key in prep_keys(arms)}


def _prep_of(arm: Dict[str, Any], preps: Dict[tuple, Dict[str, Any]]) -> Dict[str, Any]:
  """The prep `arm` runs on: its own, or for an arm that takes any, the
  default flags' when made, else the first made."""
  if arm["prep"] is not None:
    return preps[tuple(arm["prep"])]
  return preps.get((), next(iter(preps.values())))


def _prep(s: Settings, key: tuple) -> Dict[str, Any]:
  """`beam-prep segmentation` of the data set with the extra flags `key` ->
  {dir, flags, seconds, counts or error}."""
  from pipelines import cli  # pylint: disable=g-import-not-at-top

  out = os.path.join(s.workdir, _prep_name(key))
  log(f"real: prep ({' '.join(key) or 'default flags'}): beam-prep segmentation -> {out} ...")
  t = time.time()
  argv = ["segmentation", "--input", s.data, "--output", out, "--overwrite"]
  code = run_command(cli.main, argv + s.prep_flags() + list(key), out + ".log")
  entry = {"dir": out, "flags": list(key), "seconds": time.time() - t}
  if code:
    entry["error"] = _failure("beam-prep segmentation", code, out + ".log")
  else:
    entry.update(_prep_counts(out))
    log(
      f"real: prep done in {entry['seconds']:.0f} s: {entry['train_records']} train, "
      f"{entry['eval_records']} held-out records ({entry['eval_images']} images)"
    )
    if not entry["eval_images"]:
      entry["error"] = (
        f"no image of {s.data} is in the held-out split "
        f"(--eval-percent {EVAL_PERCENT}): nothing to evaluate"
      )
  if "error" in entry:
    log(f"real: prep FAILED: {entry['error']}")
  return entry


def _prep_counts(out: str) -> Dict[str, int]:
  from beam_prep import keys  # pylint: disable=g-import-not-at-top

  with open(os.path.join(out, keys.MANIFEST_FILE)) as f:
    counts = json.load(f)["counts"]
  records = counts.get("records_written", {})
  return {
    "train_records": int(records.get(keys.TRAIN_SPLIT, 0)),
    "eval_records": int(records.get(keys.EVAL_SPLIT, 0)),
    "eval_images": int(counts.get("source_records", 0)),
  }


def _run_arm(
  s: Settings, arm: Dict[str, Any], preps: Dict[tuple, Dict[str, Any]]
) -> Dict[str, Any]:
  """One arm: fit (unless it is the baseline), then NoC at source resolution."""
  out: Dict[str, Any] = {"name": arm["name"], "prep_flags": arm["prep"], "fit_flags": arm["fit"]}
  if "skip" in arm:
    log(f"real: {arm['name']}: skipped: {arm['skip']}")
    return dict(out, status="skipped", reason=arm["skip"])
  prep = _prep_of(arm, preps)
  out["prep_flags"] = prep["flags"]
  if "error" in prep:
    return dict(out, status="failed", reason=f"prep: {prep['error']}")
  arm_dir = os.path.join(s.workdir, "arms", arm["name"])
  shutil.rmtree(arm_dir, ignore_errors=True)  # A model dir left by a run before would resume.
  os.makedirs(arm_dir)
  t0 = time.time()
  model = ""
  if arm["fit"] is not None:
    model = os.path.join(arm_dir, "model")
    fit = _fit(s, arm, prep["dir"], model, arm_dir)
    out.update(fit)
    if "reason" in fit:
      return dict(out, status="failed", wall_seconds=time.time() - t0)
  out.update(_evaluate(s, arm["name"], prep["dir"], model, arm_dir))
  out["wall_seconds"] = time.time() - t0
  out["status"] = "failed" if "reason" in out else "ok"
  return out


def _timed(main, argv, log_path: str, what: str, command: str):
  """Runs one command in-process, its output to `log_path` -> (seconds, why it
  failed or None), saying so on a failure."""
  t = time.time()
  code = run_command(main, argv, log_path)
  seconds = time.time() - t
  if not code:
    return seconds, None
  reason = _failure(command, code, log_path)
  log(f"real: {what} FAILED: {reason}")
  return seconds, reason


def _fit(s: Settings, arm: Dict[str, Any], prep: str, model: str, arm_dir: str) -> Dict[str, Any]:
  from train import cli  # pylint: disable=g-import-not-at-top

  log_path = os.path.join(arm_dir, "fit.log")
  argv = ["fit", "--data", prep, "--model-dir", model] + s.fit_flags() + list(arm["fit"])
  log(f"real: {arm['name']}: fit {s.steps} steps ({' '.join(arm['fit']) or 'default flags'}) ...")
  seconds, reason = _timed(cli.main, argv, log_path, f"{arm['name']}: fit", "beam-train fit")
  if reason:
    return {"fit_seconds": seconds, "reason": reason}
  with open(os.path.join(model, model_layout.METRICS_FILE)) as f:
    m = json.load(f)
  rate = m.get("examples_per_second")
  steps_s = rate / m["global_batch_size"] if rate else None
  log(
    f"real: {arm['name']}: fit done in {seconds:.0f} s"
    + (f", {steps_s:.2f} steps/s" if steps_s else "")
  )
  return {
    "fit_seconds": seconds,
    "train_steps_s": steps_s,
    "final_loss": m.get("final_loss"),
    "model_dir": model,
  }


def _evaluate(s: Settings, name: str, prep: str, model: str, arm_dir: str) -> Dict[str, Any]:
  """`beam-train evaluate --resolution source` of the arm's model (or of the
  baseline alone) -> its figures."""
  from train import cli  # pylint: disable=g-import-not-at-top
  from train.evaluate import noc  # pylint: disable=g-import-not-at-top

  out_dir = os.path.join(arm_dir, model_layout.EVAL_DIR)
  log_path = os.path.join(arm_dir, "evaluate.log")
  argv = [
    "evaluate",
    "--data",
    prep,
    "--resolution",
    "source",
    "--max-clicks",
    str(s.max_clicks),
    "--output",
    out_dir,
  ] + (["--model", model] if model else [])
  log(f"real: {name}: NoC at source resolution, up to {s.max_clicks} clicks ...")
  seconds, reason = _timed(cli.main, argv, log_path, f"{name}: evaluation", "beam-train evaluate")
  if reason:
    return {"eval_seconds": seconds, "reason": reason}
  with open(os.path.join(out_dir, noc.NOC_FILE)) as f:
    report = json.load(f)
  figures = report["model" if model else "baseline"]
  curve = figures["mean_iou_by_clicks"]
  got = {
    "eval_seconds": seconds,
    "objects": figures["objects"],
    **{noc.noc_key(t): figures.get(noc.noc_key(t)) for t in protocol.NOC_IOU_THRESHOLDS},
    "report": os.path.join(out_dir, noc.NOC_FILE),
    **{f"iou@{c}": curve.get(str(c)) for c in IOU_AT},
  }
  said = ", ".join(
    f"NoC@{noc.threshold_name(t)} {got[noc.noc_key(t)]:.2f}" for t in protocol.NOC_IOU_THRESHOLDS
  )
  log(f"real: {name}: {said} on {got['objects']} objects in {seconds:.0f} s")
  return got


def _cell(value: Any, fmt: str) -> str:
  return "-" if value is None else format(value, fmt)


def table(result: Dict[str, Any]) -> str:
  """The arms as a Markdown table, one row per arm."""
  from train.evaluate import noc  # pylint: disable=g-import-not-at-top

  s = result["settings"]
  heads = (
    [f"NoC@{noc.threshold_name(t)}" for t in protocol.NOC_IOU_THRESHOLDS]
    + [f"IoU@{c}" for c in IOU_AT]
    + ["objects", "train steps/s", "wall s"]
  )
  lines = [
    f"Real photographs: {result['data']} ({s['layout']}), {s['image_size']} px, "
    f"batch {s['batch']}, {s['steps']} steps, {result['eval_percent']}% held out, "
    f"NoC up to {s['max_clicks']} clicks",
    "",
    "| arm | " + " | ".join(heads) + " |",
    "|---" * (len(heads) + 1) + "|",
  ]
  for a in result["arms"]:
    if a["status"] != "ok":
      lines.append(f"| {a['name']} | {a['status']}: {a['reason']} |" + "  |" * (len(heads) - 1))
      continue
    cells = (
      [_cell(a[noc.noc_key(t)], ".2f") for t in protocol.NOC_IOU_THRESHOLDS]
      + [_cell(a[f"iou@{c}"], ".3f") for c in IOU_AT]
      + [str(a["objects"]), _cell(a.get("train_steps_s"), ".2f"), f"{a['wall_seconds']:.0f}"]
    )
    lines.append(f"| {a['name']} | " + " | ".join(cells) + " |")
  return "\n".join(lines)
