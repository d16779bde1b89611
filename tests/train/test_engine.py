"""The data engine's parts: the server's count of saves that starts a round
(`serve --engine-every`), the base model's records mixed into a round's
(`--base-share`), and a round's records added to the last round's or read
anew. A whole round, started by the server, trained and served without a
restart: tests/benchmarks/test_engine_bench.py."""

import json
import os
import shutil

import numpy as np
import pytest
from PIL import Image

from beam_prep import keys
from beam_prep.layouts import folders
from train import engine
from train.serve.config import ServeConfig


def test_every_nth_save_starts_a_round_and_a_failed_one_is_counted_and_said(tmp_path, caplog):
  """`serve --engine-every 3`: two saves start nothing, the third starts a
  round, a real `beam-train engine` process; one that fails (here: a
  setting it refuses) is counted and said, with its log, and the count
  starts again. (A round that trains and publishes, through
  this same start: tests/benchmarks/test_engine_bench.py.)"""
  import logging  # pylint: disable=g-import-not-at-top
  from train.serve.rounds import LOG_FILE, Rounds  # pylint: disable=g-import-not-at-top

  labels = str(tmp_path / "labels")
  log = logging.getLogger("test_engine.rounds")
  rounds = Rounds(3, labels, str(tmp_path / "model"), ["--steps", "0"], log=log)
  with caplog.at_level(logging.INFO, logger=log.name):
    rounds.saved()
    rounds.saved()
    assert not rounds.running and rounds.started == 0
    rounds.saved()
    assert rounds.running and rounds.started == 1
    assert rounds.wait(300) and (rounds.failed, rounds.finished) == (1, 0)
  round_log = os.path.join(labels, engine.ENGINE_DIR, LOG_FILE)
  assert "--steps and --min-new must be at least 1" in open(round_log).read()
  assert f"data engine round failed (exit 2): see {round_log}" in caplog.text
  rounds.saved()
  assert not rounds.running  # One save of the next three.


def _children(pid: int):
  with open(f"/proc/{pid}/task/{pid}/children") as f:
    return [int(c) for c in f.read().split()]


def _gone(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return True
  with open(f"/proc/{pid}/stat") as f:
    return f.read().split(")")[-1].split()[0] == "Z"  # Ended, not yet reaped.


def test_a_server_stopping_stops_its_round_and_the_commands_it_runs(trained, tmp_path):
  """`Rounds.stop` (the server stopping) ends the round's process and the
  records' job it runs: that job never finishes on its own afterwards."""
  import time  # pylint: disable=g-import-not-at-top
  from tests.train.test_label_store import _item, _objects  # pylint: disable=g-import-not-at-top
  from train.serve.rounds import Rounds  # pylint: disable=g-import-not-at-top
  from train.serve.store import Labels  # pylint: disable=g-import-not-at-top

  if not os.path.exists("/proc/self/task"):
    pytest.skip("needs Linux's /proc to see a round's commands")
  labels_dir, model = str(tmp_path / "labels"), str(tmp_path / "model")
  shutil.copytree(trained, model)
  labels = Labels(labels_dir)
  for seed in range(2):
    labels.save(_item(seed), _objects(seed), model_version=1)
  labels.close()
  rounds = Rounds(1, labels_dir, model, ["--steps", "1"])
  assert rounds.start()
  engine_pid, deadline = rounds.pid, time.time() + 120
  while not _children(engine_pid) and time.time() < deadline:  # Its records' job.
    time.sleep(0.05)
  (job,) = _children(engine_pid)
  rounds.stop()
  deadline = time.time() + 60
  while not (_gone(engine_pid) and _gone(job)) and time.time() < deadline:
    time.sleep(0.05)
  assert _gone(engine_pid) and _gone(job)
  prep = os.path.join(labels_dir, engine.ENGINE_DIR, "round-001", engine.PREP_DIR)
  assert not os.path.exists(os.path.join(prep, keys.SUCCESS_FILE))


def test_a_rounds_records_take_in_the_base_models_own_at_the_share_asked(
  prep_dir, trained, tmp_path
):
  """`--base-share`: the base's train shards join a round's records as a shard
  set of their own, the labels' repeated to make up the rest; records of other
  features are refused."""
  from beam_prep.prep_output import PrepOutput  # pylint: disable=g-import-not-at-top

  assert engine.label_copies(670, 60, 0.5) == 11 and engine.label_copies(670, 60, 0.0) == 1
  assert engine.label_copies(10, 100, 0.5) == 1  # The labels are read at least once.
  own = str(tmp_path / "round")
  shutil.copytree(prep_dir, own)
  config = engine.EngineConfig(labels=str(tmp_path), model=trained, base_share=0.2)
  base = PrepOutput.of_model(trained)
  mix = engine.mix_base(config, own)
  n = base.manifest["shards"][keys.TRAIN_SPLIT]["records"]
  assert mix == {
    "base_records": n,
    "label_records": n,
    "label_copies": engine.label_copies(n, n, 0.2),
  }
  files = PrepOutput(own).files(keys.TRAIN_SPLIT)
  base_files = base.files(keys.TRAIN_SPLIT)
  assert len(files) == len(base_files) * (1 + mix["label_copies"])
  assert len([f for f in files if "-base-" in f]) == len(base_files)
  read = sum(1 for _ in PrepOutput(own).dataset(keys.TRAIN_SPLIT))
  assert read == n * (1 + mix["label_copies"])
  other = str(tmp_path / "other")
  shutil.copytree(prep_dir, other)
  features = json.load(open(os.path.join(other, "features.json")))
  features["image_size"] = [int(v) + 2 for v in features["image_size"]]
  json.dump(features, open(os.path.join(other, "features.json"), "w"))
  with pytest.raises(RuntimeError, match="hold other features than the round's"):
    engine.mix_base(config, other)
  with pytest.raises(ValueError, match="--base-share must be in"):
    engine.EngineConfig(labels="l", model="m", base_share=1.0)
  with pytest.raises(ValueError, match="--lr-scale must be above 0"):
    engine.EngineConfig(labels="l", model="m", lr_scale=0)
  # serve refuses a background round's bad setting when it starts, not in the round.
  with pytest.raises(ValueError, match=r"\(--engine-\*\): --base-share must be in"):
    ServeConfig(model="m", save_dir="l", engine_every=3, engine_base_share=1.5)


def _ids(labels: str):
  return {os.path.splitext(n)[0] for n in os.listdir(os.path.join(labels, folders.IMAGES_DIR))}


def test_a_round_adds_what_was_labelled_since_and_reads_all_after_a_relabel(
  sample_dir, prep_dir, trained, tmp_path
):
  """From the second round on, the last round's records are linked in and only
  the images labelled since are added; an image drawn again, or one no longer
  labelled, makes the round read every label anew. The last round's folder
  is never changed."""
  from tests.pipelines.test_add import _input  # pylint: disable=g-import-not-at-top

  labels = _input(tmp_path, sample_dir, new=2, relabel=False)
  config = engine.EngineConfig(labels=labels, model=trained)
  last = str(tmp_path / "last")
  shutil.copytree(prep_dir, last)  # As if the last round had read the sample.
  before = open(os.path.join(last, keys.MANIFEST_FILE)).read()
  log_path = str(tmp_path / "round.log")
  second = str(tmp_path / "second")
  _, how = engine._prep(config, trained, second, log_path, last, _ids(labels))  # pylint: disable=protected-access
  assert how == {"mode": "add", "images_added": 2, "images_held": 10}, open(log_path).read()
  assert open(os.path.join(last, keys.MANIFEST_FILE)).read() == before
  assert os.path.exists(os.path.join(second, keys.SUCCESS_FILE))
  # One of the images drawn again: its old records must not stay.
  masks = sorted(os.listdir(os.path.join(labels, folders.MASKS_DIR)))
  mask = os.path.join(labels, folders.MASKS_DIR, masks[0])
  Image.fromarray(np.zeros_like(np.asarray(Image.open(mask)))).save(mask)
  third = str(tmp_path / "third")
  _, how = engine._prep(config, trained, third, log_path, second, _ids(labels))  # pylint: disable=protected-access
  assert how["mode"] == "all" and "1 image(s) labelled again" in how["why"], how
  with open(os.path.join(third, keys.MANIFEST_FILE)) as f:
    m = json.load(f)
  assert "sets" not in m and m["counts"]["inputs_read"] == 12
  with open(os.path.join(second, keys.MANIFEST_FILE)) as f:
    assert [s["name"] for s in json.load(f)["sets"]] == ["", "add0001"]
  # An image no longer labelled: its records must not stay either.
  assert engine._why_all(third, _ids(labels)) == ""  # pylint: disable=protected-access
  gone = _ids(labels) - {os.path.splitext(masks[1])[0]}
  assert engine._why_all(third, gone) == "1 image(s) no longer labelled"  # pylint: disable=protected-access
  assert engine._why_all(None, gone) == "the first round"  # pylint: disable=protected-access
  # The label store's save times name an image labelled again before any job runs.
  again = engine._why_all(third, _ids(labels), {os.path.splitext(masks[1])[0], "new"})  # pylint: disable=protected-access
  assert again == "1 image(s) labelled again"


def _zero_weights(model_dir: str) -> None:
  """The model dir's checkpoint replaced by one of its model with every weight zero."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from train import model_layout, models  # pylint: disable=g-import-not-at-top

  model = models.rebuild(model_dir)
  for weight in model.weights:
    weight.assign(tf.zeros_like(weight))
  folder = os.path.join(model_dir, model_layout.CHECKPOINTS_DIR)
  shutil.rmtree(folder)
  tf.train.CheckpointManager(tf.train.Checkpoint(model=model), folder, max_to_keep=1).save()


def test_a_round_worse_by_both_measures_is_not_published(prep_dir, trained, tmp_path):
  """`judge`: both models label the held-out objects with `beam-train
  evaluate`; a round is kept back only when it needs more clicks (NoC@90)
  and its mean IoU over the clicks is lower too, and the next round then
  starts from the served model. Small label stores hold nothing out."""
  log_path = str(tmp_path / "round.log")
  # Every weight zero: probability 0.5 everywhere, each crop all object, which
  # overlaps these scenes' objects more than the 6-step model's masks do.
  served = str(tmp_path / "served")
  shutil.copytree(trained, served)
  _zero_weights(served)
  judged = engine.judge(served, trained, prep_dir, str(tmp_path / "judge"), log_path)
  ours, theirs = judged["round"], judged["served"]
  assert judged["objects"] > 0 and ours["mean_iou"] < theirs["mean_iou"] - engine.JUDGE_TOLERANCE
  # Neither reaches 0.90 in 20 clicks: NoC@90 ties, and the round is published.
  assert ours["noc@90"] == theirs["noc@90"] == 20 and judged["publish"], judged
  said = open(log_path).read()  # Each evaluation, as the command would say it.
  assert said.count("$ beam-train evaluate --model ") == 2 and said.count("evaluate: NoC@90 ") == 2
  assert engine.worse({"noc@90": 16.4, "mean_iou": 0.69}, {"noc@90": 12.9, "mean_iou": 0.77})
  assert not engine.worse({"noc@90": 16.4, "mean_iou": 0.765}, {"noc@90": 12.9, "mean_iou": 0.77})
  assert not engine.worse({"noc@90": 12.0, "mean_iou": 0.69}, {"noc@90": 12.9, "mean_iou": 0.77})
  config = engine.EngineConfig(labels="labels", model="model", judge_percent=20)
  done = [
    {"model_dir": "r1", "published": "model/export/1"},
    {"model_dir": "r2", "published": None},
  ]
  assert engine.served_model_dir(config, done) == "r1"
  assert engine.served_model_dir(config, done[1:]) == "model"
  assert engine.held_out_percent(config, engine.MIN_JUDGED_IMAGES - 1) == 0
  assert engine.held_out_percent(config, engine.MIN_JUDGED_IMAGES) == 20
  assert engine.EngineConfig(labels="labels", model="model").judge_percent == 0  # Opt-in.


def test_the_command_refuses_labels_and_models_it_cannot_use(prep_dir, trained, tmp_path):
  from train.serve.store import Labels  # pylint: disable=g-import-not-at-top

  typo = str(tmp_path / "labls")
  with pytest.raises(ValueError, match="--labels .*labls: no such folder"):
    engine.check_inputs(engine.EngineConfig(labels=typo, model=trained))
  assert not os.path.exists(typo)  # Nothing made there.
  raw = tmp_path / "raw"
  (raw / "images").mkdir(parents=True)  # A dataset, not a label store.
  with pytest.raises(ValueError, match="holds no labels.sqlite and no instances.json"):
    engine.check_inputs(engine.EngineConfig(labels=str(raw), model=trained))
  labels = str(tmp_path / "labels")
  Labels(labels).close()
  with pytest.raises(
    ValueError, match="--model: .* not a beam-train fit model dir .*beam-prep out"
  ):
    engine.check_inputs(engine.EngineConfig(labels=labels, model=prep_dir))
  engine.check_inputs(engine.EngineConfig(labels=labels, model=trained))
