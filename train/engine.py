"""`beam-train engine`: one round of the data engine.

The labels people save (`beam-train serve --save-dir LABELS`, the label
store) train the next model, and the server serves it:

  1. LABELS' images and masks -> `beam-prep segmentation`, with the settings
     and the tf.Transform output of the records the serving model was
     trained on (`--transform-from`: no analysis, so the model sees its
     inputs normalized as before); from `MIN_JUDGED_IMAGES` labelled
     images on, --judge-percent of them (by a hash of their id) in the eval
     split, held out of training. From the second round on, the last
     round's records are linked in and only the images labelled since are
     added (`beam-prep --add`, by the image's digest); an image labelled
     again (saved again since the last round, or found so by the --add
     job), or no longer labelled, makes the round read all the labels
     anew, so no old label stays;
  2. `beam-train fit --init-from` the serving model, with its own settings,
     for --steps or --max-minutes, whichever comes first, the learning rate
     rising over the first --warmup-steps;
  3. judged: the round's model and the served one label the held-out
     images' objects (`judge`: `beam-train evaluate` at the records' size,
     the labels as the truth), and a round worse than the served model by
     both NoC@90 and the mean IoU over the clicks is not published: the
     server keeps its version, and the next round starts from it again;
  4. the export is published under MODEL/export/<version>/ (written beside,
     then renamed in), where `beam-train serve --model MODEL` picks it up
     without a restart.

A round runs only when at least --min-new images were labelled (or
labelled again) since the last round. Each round's records and model are
kept in WORKDIR/round-NNN/, and WORKDIR/engine.json lists the rounds: when,
what they trained on, how long each stage took, what they published.
Rounds run one at a time: a second `engine` on the same WORKDIR waits for
the first. The records' job and the fit run as a user would type them, each
in its own process; the judge's two evaluations run in the engine's own.
"""

import contextlib
import dataclasses
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Set, Tuple

from beam_prep import keys
from beam_prep.kit import CommandConfig, option
from train import model_layout

ENGINE_FILE = "engine.json"
LOCK_FILE = ".engine.lock"
ENGINE_DIR = "engine"  # Under the labels' folder when no --workdir is given.
PREP_DIR = "prep"  # A round's records, in its folder.
# What `beam-train fit` spends besides training (TensorFlow's start, the
# model rebuilt and its weights loaded, the export), measured at 50-65 s at
# 128 px on 2 cores: kept out of a round's training budget.
FIT_OVERHEAD_MINUTES = 1.25
MIN_TRAIN_MINUTES = 0.25
# What judging a round costs besides its fit (`beam-train evaluate` of both
# models on the held-out labels: TensorFlow's start, 20 clicks each).
JUDGE_MINUTES = 0.75
# A round's model is judged on at most this many held-out objects, by two
# measures of the served model's and its own IoU-by-clicks curves: NoC at
# JUDGED_IOU, and the mean IoU over the clicks (lower by more than
# JUDGE_TOLERANCE: the measure's noise between two models about as good).
# It is kept back only when both say it is worse.
JUDGED_OBJECTS = 40
JUDGED_IOU = 0.90
JUDGE_TOLERANCE = 0.01
# Rounds judge their model only from this many labelled images on: fewer
# would hold out one or two objects, or every image (nothing to train on).
MIN_JUDGED_IMAGES = 10


@dataclasses.dataclass(frozen=True)
class EngineConfig(CommandConfig):
  """A data engine round."""

  labels: str = option("", "the label store's folder (beam-train serve --save-dir)", required=True)
  model: str = option(
    "",
    "the served model dir: the first round starts from its weights, and "
    "every round's export is published under its export/",
    required=True,
  )
  workdir: str = option("", "where the rounds are kept ('': LABELS/engine)", show_default=False)
  steps: int = option(
    100,
    "fine-tuning steps of a round (many more passes over a few dozen labels "
    "teach the model their shapes, and it stops following the clicks: docs/performance.md)",
  )
  max_minutes: float = option(
    5.0,
    "a round's budget: its training stops early enough for "
    "the round (records, training, export) to end within this many "
    "minutes, even before --steps (0: --steps only)",
  )
  min_new: int = option(
    1, "run a round only when at least this many images were labelled since the last one"
  )
  lr_scale: float = option(
    1.0, "a round's learning rate, as a multiple of the one MODEL was trained with"
  )
  warmup_steps: int = option(
    20,
    "a round's learning rate rises to its value over its first N steps "
    "(beam-train fit --warmup-steps; 0: none)",
  )
  base_share: float = option(
    0.0,
    "the share of a round's training records that are those "
    "MODEL was first trained on (its prep output's train split), "
    "the labels' records repeated to make up the rest, so the "
    "model keeps what it knew (0: the labels alone)",
  )

  judge_percent: int = option(
    0,
    "the share of the labelled images (by a hash of their id) held out of "
    "training to judge each round: its model is published unless it needs more "
    "clicks on them than the served model (NoC@90) and its mean IoU over the "
    f"clicks is lower by more than {JUDGE_TOLERANCE}; from {MIN_JUDGED_IMAGES} "
    "labelled images on (0: every round published, unjudged). The held-out labels "
    "are the served model's own masks, which favours it: see docs/serving.md",
  )

  def __post_init__(self):
    if not 0 <= self.judge_percent < 100:
      raise ValueError(f"--judge-percent must be in [0, 100), got {self.judge_percent}")
    if self.steps < 1 or self.min_new < 1 or self.max_minutes < 0:
      raise ValueError("--steps and --min-new must be at least 1, --max-minutes at least 0")
    if not self.lr_scale > 0:
      raise ValueError(f"--lr-scale must be above 0, got {self.lr_scale}")
    if self.warmup_steps < 0:
      raise ValueError(f"--warmup-steps must be at least 0, got {self.warmup_steps}")
    if not 0 <= self.base_share < 1:
      raise ValueError(f"--base-share must be in [0, 1), got {self.base_share}")

  @property
  def root(self) -> str:
    return self.workdir or os.path.join(self.labels, ENGINE_DIR)


def check_inputs(config: EngineConfig) -> None:
  """Refuses, before any round, a --labels folder that holds no labels of
  `beam-train serve --save-dir` and a --model that is no fit model dir.

  Raises:
    ValueError: naming the flag and what is wrong.
  """
  # pylint: disable=g-import-not-at-top
  from beam_prep.prep_output import PrepOutput
  from train.serve.exports import COCO_FILE
  from train.serve.store import DB_FILE

  # pylint: enable=g-import-not-at-top
  if not os.path.isdir(config.labels):
    raise ValueError(f"--labels {config.labels}: no such folder")
  if not any(os.path.exists(os.path.join(config.labels, f)) for f in (DB_FILE, COCO_FILE)):
    raise ValueError(
      f"--labels {config.labels} holds no {DB_FILE} and no {COCO_FILE}: give the folder "
      "beam-train serve --save-dir saves labels into"
    )
  try:
    PrepOutput.of_model(config.model)
  except FileNotFoundError as e:
    raise ValueError(f"--model: {e}") from None


def rounds(root: str) -> List[Dict[str, Any]]:
  """The rounds WORKDIR/engine.json lists ([] before the first)."""
  path = os.path.join(root, ENGINE_FILE)
  if not os.path.exists(path):
    return []
  with open(path, encoding="utf-8") as f:
    return json.load(f)["rounds"]


def _last_saved(entry: Dict[str, Any]) -> float:
  from train.serve import exports  # pylint: disable=g-import-not-at-top

  return max((a.get(exports.SAVED) or 0.0 for a in entry["annotations"]), default=0.0)


def _labelled(labels_dir: str):
  """(entries, time of the newest label) of the label store, its files written."""
  from train.serve.store import Labels  # pylint: disable=g-import-not-at-top

  labels = Labels(labels_dir)
  try:
    entries = labels.entries()
  finally:
    labels.close()  # Writes the images, masks and document the job reads.
  return entries, max((_last_saved(e) for e in entries), default=0.0)


def _run(cmd: List[str], log_path: str) -> float:
  """Runs a command, its output appended to `log_path`; its seconds.

  Raises:
    RuntimeError: it failed (the message names the command and the log).
  """
  started = time.time()
  with open(log_path, "a", encoding="utf-8") as out:
    out.write(f"$ {' '.join(cmd)}\n")
    out.flush()
    done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False)
  if done.returncode:
    raise RuntimeError(
      f"{' '.join(cmd[2:4])} failed (exit {done.returncode}); its output is in {log_path}"
    )
  return time.time() - started


def held_out_percent(config: EngineConfig, images: int) -> int:
  """The share of the labels a round holds out to judge its model (`--judge-percent`,
  from `MIN_JUDGED_IMAGES` labelled images on; else none)."""
  return config.judge_percent if images >= MIN_JUDGED_IMAGES else 0


def _prep_command(
  config: EngineConfig, current: str, out: str, add: bool, held_out: int
) -> List[str]:
  """`beam-prep segmentation` of the label store with the settings of the
  records `current` was trained on, `held_out` percent of the images in the
  eval split: with `add`, into `out` as a new shard set (the images it holds
  are skipped); else all of them, read with `current`'s transform."""
  from beam_prep.prep_output import PrepOutput  # pylint: disable=g-import-not-at-top

  base = PrepOutput.of_model(current)
  how = (
    ["--add", "--transform-from", "", "--no-overwrite"]
    if add
    else ["--no-add", "--transform-from", current, "--overwrite"]
  )
  return [
    sys.executable, "-m", "pipelines", "segmentation",
    "--config", base.join(keys.CONFIG_FILE),
    "--input", config.labels, "--layout", "folders", "--output", out,
    *how,
    "--eval-percent", str(held_out), "--progress-seconds", "0",
  ]  # fmt: skip


def _prep(
  config: EngineConfig,
  current: str,
  out: str,
  log_path: str,
  previous: Optional[str],
  labelled: Set[str],
  changed: Set[str] = frozenset(),
  held_out: int = 0,
) -> Tuple[float, Dict[str, Any]]:
  """The label store's images -> records read with the current model's
  transform: the `previous` round's records, linked in, with the images
  labelled since added (`beam-prep --add`); all of them in a first round,
  when an image left the store (`labelled`: the image ids it holds) or when
  one was labelled again (one of `changed`, the ids saved since, that the
  previous records hold; else as the `--add` job finds it), so no old label
  stays. `held_out` percent of the images are in the eval split (by a hash of
  their id: an image stays where it is from round to round).

  Returns:
    (seconds, how: "mode" add or all, images added and held, or why all).
  """
  seconds, why = 0.0, _why_all(previous, labelled, changed)
  if not why:
    _linked_copy(previous, out)
    seconds = _run(_prep_command(config, current, out, True, held_out), log_path)
    counts = _last_set(out)["counts"]
    if not counts.get("images_relabelled"):
      added = counts["images_used"]
      return seconds, {"mode": "add", "images_added": added, "images_held": counts["images_known"]}
    why = f"{counts['images_relabelled']} image(s) labelled again"
  seconds += _run(_prep_command(config, current, out, False, held_out), log_path)
  return seconds, {
    "mode": "all",
    "images_added": _last_set(out)["counts"]["images_used"],
    "why": why,
  }


def _why_all(previous: Optional[str], labelled: Set[str], changed: Set[str] = frozenset()) -> str:
  """Why a round reads all the labels ("": it adds to the `previous` round's
  records): `labelled` are the image ids the store holds, `changed` those
  saved since the last round (one the previous records hold was labelled
  again; the `--add` job finds any other, by digest)."""
  from beam_prep import image_index  # pylint: disable=g-import-not-at-top  (Beam: rounds only)

  if not previous:
    return "the first round"
  if not os.path.exists(os.path.join(previous, image_index.INDEX_DIR)):
    return f"{previous} has no image index"
  held = {e[keys.IMAGE_ID] for e in image_index.lines(previous)}
  gone, again = held - labelled, held & changed
  if gone:
    return f"{len(gone)} image(s) no longer labelled"
  return f"{len(again)} image(s) labelled again" if again else ""


def _last_set(prep_dir: str) -> Dict[str, Any]:
  """The last shard set of a prep output (its only one without --add)."""
  from beam_prep.prep_output import PrepOutput, sets_of  # pylint: disable=g-import-not-at-top

  return sets_of(PrepOutput(prep_dir).manifest)[-1]


def _linked_copy(source: str, target: str) -> None:
  """`target`: the prep output `source`, its files in folders (records,
  index, dead letters, transform: never rewritten in place) hard links,
  its top files (the manifest, rewritten by `--add`) copies, without the
  shard sets `mix_base` added."""
  for folder, _, files in os.walk(source):
    rel = os.path.relpath(folder, source)
    os.makedirs(os.path.join(target, rel), exist_ok=True)
    for name in files:
      if _MIXED.match(name):
        continue
      src, dst = os.path.join(folder, name), os.path.join(target, rel, name)
      if rel == os.curdir:
        shutil.copyfile(src, dst)
      else:
        _link(src, dst)


def _fit(
  config: EngineConfig,
  current: str,
  data: str,
  model_dir: str,
  log_path: str,
  spent_s: float,
  judged: bool,
) -> float:
  """The current model fine-tuned on `data`, with its own settings, its
  training cut to what is left of the round's budget after `spent_s` (and
  the judge's share when the round is `judged`)."""
  minutes = 0.0
  if config.max_minutes > 0:
    judging = JUDGE_MINUTES if judged else 0.0
    left = config.max_minutes - spent_s / 60 - FIT_OVERHEAD_MINUTES - judging
    minutes = max(left, MIN_TRAIN_MINUTES)
  with open(os.path.join(config.model, keys.MODEL_CONFIG_FILE), encoding="utf-8") as f:
    rate = json.load(f)["learning_rate"] * config.lr_scale
  return _run(
    [
      sys.executable,
      "-m",
      "train",
      "fit",
      "--config",
      os.path.join(current, keys.MODEL_CONFIG_FILE),
      "--data",
      data,
      "--model-dir",
      model_dir,
      "--init-from",
      current,
      "--steps",
      str(config.steps),
      "--max-minutes",
      f"{minutes:.3f}",
      "--learning-rate",
      repr(rate),
      "--warmup-steps",
      str(config.warmup_steps),
      "--noc-clicks",
      "0",  # The round's judge evaluates it (`judge`).
      "--export",
    ],
    log_path,
  )


def _link(source: str, target: str) -> None:
  """`target` holds `source`'s bytes: a hard link, or a copy across file systems."""
  try:
    os.link(source, target)
  except OSError:
    shutil.copyfile(source, target)


def label_copies(base_records: int, label_records: int, share: float) -> int:
  """How many times the labels' records are read so that the base's make up
  `share` of the whole (at least once)."""
  if share <= 0 or label_records <= 0:
    return 1
  return max(1, round(base_records * (1 - share) / (share * label_records)))


# The shard sets `mix_base` adds: train-base-*, train-copyN-*.
_MIX_BASE, _MIX_COPY = "base", "copy"
_MIXED = re.compile(rf"^{keys.TRAIN_SPLIT}-({_MIX_BASE}|{_MIX_COPY}\d+)-")


def mix_base(config: EngineConfig, prep_dir: str) -> Dict[str, int]:
  """Adds the train records MODEL was first trained on to a round's records
  (`--base-share`): the base's shards as the shard set `train-base-*`, the
  labels' shards again as `train-copyN-*` as many times as the share asks.
  The trainer reads every `train-*` shard.

  Raises:
    RuntimeError: the base's records hold other features than the round's.
  """
  from beam_prep.prep_output import PrepOutput  # pylint: disable=g-import-not-at-top

  base, own = PrepOutput.of_model(config.model), PrepOutput(prep_dir)
  if base.table.to_json() != own.table.to_json():
    raise RuntimeError(
      f"--base-share: the records of {base.path} hold other features than "
      f"the round's ({own.path}); they cannot be trained on together"
    )
  records = lambda p: p.manifest["shards"][keys.TRAIN_SPLIT]["records"]  # pylint: disable=unnecessary-lambda-assignment
  labels_files, copies = (
    own.files(keys.TRAIN_SPLIT),
    label_copies(records(base), records(own), config.base_share),
  )
  sets = [(_MIX_BASE, f) for f in base.files(keys.TRAIN_SPLIT)]
  sets += [(f"{_MIX_COPY}{i}", f) for i in range(1, copies) for f in labels_files]
  for name, source in sets:
    _link(
      source,
      own.join(
        keys.RECORDS_DIR, f"{keys.TRAIN_SPLIT}-{name}-{os.path.basename(source).split('-', 1)[1]}"
      ),
    )
  return {"base_records": records(base), "label_records": records(own), "label_copies": copies}


def judge(current: str, model_dir: str, prep_dir: str, out: str, log_path: str) -> Dict[str, Any]:
  """The round's model (`model_dir`) against the served one (`current`) on
  the first `JUDGED_OBJECTS` held-out objects of the round's records
  (`prep_dir`), each labelled by `beam-train evaluate` at the records' size
  (20 clicks, the labels as the truth; its reports in `out`/round, /served),
  in this process (`_evaluate`).

  Returns:
    {"objects", "round", "served" (each: NoC@90, mean IoU over the clicks),
    "publish"}: publish unless the round's model is worse by both: a higher
    NoC@90, and a mean IoU lower by more than `JUDGE_TOLERANCE`. (The held-out
    labels are the served model's line's own masks, which favours it a
    little; where the two measures disagree, the round is published.)
  """
  scores = {}
  for name, model in (("round", model_dir), ("served", current)):
    report = os.path.join(out, name)
    _evaluate(model, prep_dir, report, log_path)
    scores[name] = _score(os.path.join(report, model_layout.NOC_FILE))
  objects = scores["round"].pop("objects")
  scores["served"].pop("objects")  # The same objects.
  return {**scores, "objects": objects, "publish": not worse(scores["round"], scores["served"])}


def _evaluate(model: str, prep_dir: str, report: str, log_path: str) -> None:
  """`beam-train evaluate` of `model` on `prep_dir`'s held-out objects at the
  records' size, its lines appended to `log_path` as the commands' are. It
  runs in this process: the two models of a judge share one TensorFlow start,
  where two commands would each pay it (several seconds).

  Raises:
    RuntimeError: it failed (the message names the model, the reason and the log).
  """
  from train.config import EvalConfig  # pylint: disable=g-import-not-at-top
  from train.evaluate import command  # pylint: disable=g-import-not-at-top

  config = EvalConfig(
    model=model, data=prep_dir, resolution="records", max_objects=JUDGED_OBJECTS, output=report
  )
  log = _AppendingLog(log_path)
  log.info(
    "$ beam-train evaluate --model %s --data %s --resolution records --max-objects %d --output %s",
    *(model, prep_dir, JUDGED_OBJECTS, report),
  )
  try:
    figures, out = command.run(config, log)
  except Exception as e:  # pylint: disable=broad-except
    log.info("evaluate: %s: %s", type(e).__name__, e)
    raise RuntimeError(
      f"evaluate {model} failed ({type(e).__name__}: {e}); its output is in {log_path}"
    ) from e
  for line in command.said(figures, out):
    log.info("evaluate: %s", line)


class _AppendingLog:
  """The `info` of a logger, each line appended to a file."""

  def __init__(self, path: str):
    self.path = path

  def info(self, fmt: str, *args) -> None:
    with open(self.path, "a", encoding="utf-8") as f:
      f.write((fmt % args if args else fmt) + "\n")


def worse(ours: Dict[str, float], theirs: Dict[str, float]) -> bool:
  """Whether a round's figures ("noc@90", "mean_iou") are worse than the served
  model's by both measures: more clicks, and a mean IoU lower by more than
  `JUDGE_TOLERANCE`."""
  more_clicks = ours["noc@90"] > theirs["noc@90"]
  return more_clicks and ours["mean_iou"] < theirs["mean_iou"] - JUDGE_TOLERANCE


def _judged(config: EngineConfig, prep_dir: str) -> bool:
  """Whether a round is judged: --judge-percent, and its records (every shard
  set's) hold eval records (from `MIN_JUDGED_IMAGES` labelled images on)."""
  from beam_prep.prep_output import PrepOutput  # pylint: disable=g-import-not-at-top

  if not config.judge_percent:
    return False
  return bool((PrepOutput(prep_dir).manifest["shards"].get(keys.EVAL_SPLIT) or {}).get("records"))


def _score(report: str) -> Dict[str, Any]:
  """A noc.json's model figures: objects, NoC@90 and its mean IoU over the clicks."""
  with open(report, encoding="utf-8") as f:
    figures = json.load(f)["model"]
  curve = figures["mean_iou_curve"]
  noc = figures[model_layout.noc_key(JUDGED_IOU)]
  return {"objects": figures["objects"], "noc@90": noc, "mean_iou": sum(curve) / len(curve)}


def publish(export_dir: str, model: str) -> str:
  """Copies an export under MODEL/export/ as the same version: written beside
  (hidden), then renamed in, so a server never loads half of it."""
  version = os.path.basename(export_dir.rstrip("/"))
  base = os.path.join(model, model_layout.EXPORT_DIR)
  os.makedirs(base, exist_ok=True)
  target, tmp = os.path.join(base, version), os.path.join(base, f".publishing-{version}")
  shutil.rmtree(tmp, ignore_errors=True)
  shutil.copytree(export_dir, tmp)
  os.rename(tmp, target)
  return target


@contextlib.contextmanager
def _one_at_a_time(root: str):
  os.makedirs(root, exist_ok=True)
  with open(os.path.join(root, LOCK_FILE), "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    yield


def run_round(config: EngineConfig, log) -> Optional[Dict[str, Any]]:
  """Runs one round when enough labels are new; returns its entry of engine.json, or None.

  Raises:
    RuntimeError: a stage failed (named, with its log).
    FileNotFoundError: the model dir is not a `beam-train fit` model dir.
  """
  with _one_at_a_time(config.root):
    done = rounds(config.root)
    entries, newest = _labelled(config.labels)
    new = len(_saved_since(entries, done))
    if new < config.min_new:
      log.info(
        "engine: %d image(s) labelled since the last round (--min-new %d): no round",
        new,
        config.min_new,
      )
      return None
    return _round(config, log, done, entries, new, newest)


def _saved_since(entries: List[Dict[str, Any]], done: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
  """The label store's entries saved after the newest label the last round read."""
  since = done[-1]["labels_until"] if done else 0.0
  return [e for e in entries if _last_saved(e) > since]


def _round_folder(root: str, number: int) -> str:
  return os.path.join(root, f"round-{number:03d}")


def _fresh_folder(root: str, number: int) -> str:
  """Round `number`'s folder, emptied of what a failed try of it left."""
  folder = _round_folder(root, number)
  shutil.rmtree(folder, ignore_errors=True)
  os.makedirs(folder)
  return folder


def _mixed(config: EngineConfig, prep_dir: str, number: int, log) -> Dict[str, int]:
  """`mix_base`, said on the log."""
  mix = mix_base(config, prep_dir)
  log.info(
    "engine: round %d: with the %d train records of %s; the labels' %d records read %d time(s)",
    number,
    mix["base_records"],
    config.model,
    mix["label_records"],
    mix["label_copies"],
  )
  return mix


def _round_records(config, log, number: int, current: str, done, entries):
  """`_prep` of round `number` -> (seconds, how), said on the log."""
  from beam_prep.layouts import folders  # pylint: disable=g-import-not-at-top  (Beam: rounds only)

  folder = _round_folder(config.root, number)
  previous = os.path.join(os.path.dirname(done[-1]["model_dir"]), PREP_DIR) if done else None
  log_path = os.path.join(folder, "round.log")
  # The image ids the job will read the label store's files with.
  image_id = lambda e: folders.Folders.pointer("", e["file_name"])[keys.IMAGE_ID]  # pylint: disable=unnecessary-lambda-assignment
  labelled = {image_id(e) for e in entries}
  changed = {image_id(e) for e in _saved_since(entries, done)}
  out = os.path.join(folder, PREP_DIR)
  held_out = held_out_percent(config, len(entries))
  prep_s, how = _prep(config, current, out, log_path, previous, labelled, changed, held_out)
  log.info(
    "engine: round %d: records of %d image(s) in %.0f s (%s; %s)",
    number,
    how["images_added"],
    prep_s,
    "added to the last round's" if how["mode"] == "add" else f"all the labels: {how['why']}",
    f"{held_out}% held out to judge the model" if held_out else "none held out",
  )
  return prep_s, how


def _round(config, log, done, entries, new, newest) -> Dict[str, Any]:
  from train.export.saved_model import latest_export  # pylint: disable=g-import-not-at-top

  number = len(done) + 1
  folder = _fresh_folder(config.root, number)
  current = served_model_dir(config, done)
  log_path = os.path.join(folder, "round.log")
  objects = sum(len(e["annotations"]) for e in entries)
  log.info(
    "engine: round %d: %d labelled images (%d new), %d objects; from %s",
    number,
    len(entries),
    new,
    objects,
    current,
  )
  started = time.time()
  prep_s, how = _round_records(config, log, number, current, done, entries)
  mix = _mixed(config, os.path.join(folder, PREP_DIR), number, log) if config.base_share else None
  model_dir = os.path.join(folder, "model")
  prep_dir = os.path.join(folder, PREP_DIR)
  judging = _judged(config, prep_dir)
  fit_s = _fit(config, current, prep_dir, model_dir, log_path, time.time() - started, judging)
  judged = None
  if judging:
    judged = judge(current, model_dir, prep_dir, os.path.join(folder, "judge"), log_path)
  blessed = judged is None or judged["publish"]
  published = publish(latest_export(model_dir), config.model) if blessed else None
  entry = {
    "round": number,
    "images": len(entries),
    "new_images": new,
    "objects": objects,
    "labels_until": newest,
    "started": started,
    "from": current,
    "model_dir": model_dir,
    "published": published,
    "version": int(os.path.basename(published)) if published else None,
    "judged": judged,
    "mix": mix,
    "records": how,
    "seconds": {
      "prep": round(prep_s, 1),
      "fit": round(fit_s, 1),
      "total": round(time.time() - started, 1),
    },
  }
  _write_rounds(config.root, done + [entry])
  _say_round(log, entry, fit_s)
  return entry


def served_model_dir(config: EngineConfig, done: List[Dict[str, Any]]) -> str:
  """The model dir of the version served: the last published round's, else MODEL."""
  published = [d for d in done if d.get("published")]
  return published[-1]["model_dir"] if published else config.model


def judged_text(judged: Optional[Dict[str, Any]]) -> str:
  """A round's judging (`judge`), in words: its log line's, the benchmark's table's."""
  if not judged:
    return "unjudged"
  ours, theirs = judged["round"], judged["served"]
  return (
    f"on {judged['objects']} held-out object(s) NoC@90 {ours['noc@90']:.2f}, mean IoU "
    f"{ours['mean_iou']:.3f}; the served model's {theirs['noc@90']:.2f}, {theirs['mean_iou']:.3f}"
  )


def _say_round(log, entry: Dict[str, Any], fit_s: float) -> None:
  number, verdict = entry["round"], judged_text(entry["judged"])
  if entry["published"]:
    log.info(
      "engine: round %d: trained in %.0f s (%s); version %d published to %s (%.0f s in all)",
      *(number, fit_s, verdict, entry["version"], entry["published"], entry["seconds"]["total"]),
    )
  else:
    log.info(
      "engine: round %d: trained in %.0f s; not published (%s): the server keeps its "
      "version, the next round starts from it (%.0f s in all)",
      *(number, fit_s, verdict, entry["seconds"]["total"]),
    )


def _write_rounds(root: str, entries: List[Dict[str, Any]]) -> None:
  path = os.path.join(root, ENGINE_FILE)
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    json.dump({"rounds": entries}, f, indent=2)
  os.replace(path + ".tmp", path)
