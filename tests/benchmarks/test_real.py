"""`python -m benchmarks --real DIR` end to end on a tiny generated set (no timing assertions)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from benchmarks import real, run
from tests.helpers import ROOT

MAX_CLICKS = 5  # The table's IoU after 5 clicks needs 5.


def coco_mval_set(root, count=12):
  """A COCO_MVal-style set (img/NAME.jpg, gt/NAME.png, one object each) of small photos."""
  rng = np.random.default_rng(0)
  os.makedirs(os.path.join(root, "img"))
  os.makedirs(os.path.join(root, "gt"))
  yy, xx = np.mgrid[:48, :64]
  for i in range(count):
    cy, cx, ry, rx = (
      rng.integers(14, 34),
      rng.integers(18, 46),
      rng.integers(6, 13),
      rng.integers(8, 17),
    )
    obj = ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1
    img = rng.integers(40, 120, (48, 64, 3), dtype=np.uint8)
    img[obj] = rng.integers(150, 255, 3, dtype=np.uint8)
    Image.fromarray(img).save(os.path.join(root, "img", f"photo{i:02d}.jpg"), quality=95)
    Image.fromarray(obj.astype(np.uint8) * 255).save(os.path.join(root, "gt", f"photo{i:02d}.png"))


def listing(root):
  return sorted(
    (os.path.relpath(os.path.join(d, f), root), os.path.getsize(os.path.join(d, f)))
    for d, _, files in os.walk(root)
    for f in files
  )


def check_arm(arm, objects):
  assert arm["status"] == "ok", arm
  assert 1 <= arm["noc@85"] <= MAX_CLICKS and 1 <= arm["noc@90"] <= MAX_CLICKS, arm
  assert arm["noc@85"] <= arm["noc@90"], arm
  for c in real.IOU_AT:
    assert 0 <= arm[f"iou@{c}"] <= 1, (c, arm)
  assert arm["objects"] == objects >= 1
  assert arm["wall_seconds"] > 0 and arm["eval_seconds"] > 0
  if arm["fit_flags"] is not None:
    assert arm["train_steps_s"] > 0 and arm["fit_seconds"] > 0, arm
    assert os.path.isdir(os.path.join(arm["model_dir"], "export"))


# The nearest-click baseline (no model) and the preset's own arm (a model):
# the other arms are the same code with other flags.
RUN_ARMS = ("baseline", "corrective")


def test_real_runs_the_arms_asked(tmp_path, capsys):
  data = str(tmp_path / "COCO_MVal")  # The root's name makes --layout auto pick coco_mval.
  coco_mval_set(data)
  before = listing(data)
  out, work = str(tmp_path / "real.json"), str(tmp_path / "work")
  with pytest.raises(SystemExit) as e:
    run.main(
      [
        "--real",
        data,
        "--real-steps",
        "4",
        "--real-image-size",
        "48",
        "--real-batch",
        "4",
        "--real-max-clicks",
        str(MAX_CLICKS),
        "--real-arms",
        ",".join(reversed(RUN_ARMS)),
        "--workdir",
        work,
        "--json",
        out,
      ]
    )
  printed = capsys.readouterr().out
  assert e.value.code == 0, printed[-3000:]
  result = json.load(open(out))
  assert result["settings"]["layout"] == "coco_mval"
  declared_arms = [a for a in real.ARMS if a["name"] in RUN_ARMS]  # In the table's order.
  assert [a["name"] for a in result["arms"]] == [a["name"] for a in declared_arms]
  assert result["settings"]["arms"] == list(RUN_ARMS)
  # One prep: the baseline (no model) runs on the corrective arm's.
  assert [p["flags"] for p in result["preps"]] == [[]]
  eval_images = result["preps"][0]["eval_images"]
  for arm, declared in zip(result["arms"], declared_arms):
    missing = real.availability(declared)
    if missing:  # A flag its command does not know (yet): skipped, saying which.
      assert arm["status"] == "skipped" and "not available" in arm["reason"], arm
      assert f"| {arm['name']} | skipped: " in printed
    else:
      check_arm(arm, eval_images)  # One object per image: every held-out image's object.
      assert f"| {arm['name']} | " in printed
  assert {a["status"] for a in result["arms"]} == {"ok"}  # baseline and corrective always run
  for stage in ("real: prep", "real: corrective: fit", "real: baseline: NoC"):
    assert stage in printed
  assert listing(data) == before  # Nothing written into the data set.


def test_real_missing_dir_exits_2(tmp_path):
  missing = str(tmp_path / "nowhere")
  r = subprocess.run(
    [sys.executable, "-m", "benchmarks", "--real", missing],
    capture_output=True,
    text=True,
    timeout=300,
    cwd=ROOT,
  )
  assert r.returncode == 2, r.stdout + r.stderr
  assert r.stderr.strip() == f"python -m benchmarks --real: {missing}: no such file or directory"


@pytest.mark.parametrize(
  "layout, message",
  [
    ("auto", "no input layout recognises"),
    ("nonsense", "--real-layout must be auto or one of"),
    ("coco_mval", "as the coco_mval layout"),
    ("auto --real-arms corrective,nope", "--real-arms: no arm named nope (arms: baseline,"),
  ],
)
def test_real_unreadable_layout_exits_2(tmp_path, capsys, layout, message):
  empty = tmp_path / "photos"
  empty.mkdir()
  with pytest.raises(SystemExit) as e:
    run.main(
      ["--real", str(empty), "--real-layout", *layout.split(), "--workdir", str(tmp_path / "w")]
    )
  assert e.value.code == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("python -m benchmarks --real: ") and message in err, err
  assert "\n" not in err
  assert not (tmp_path / "w").exists()


def test_each_prep_setting_is_made_once_and_an_arm_without_a_model_takes_any():
  arms = {arm["name"]: arm for arm in real.ARMS}
  baseline, single, corrective = arms["baseline"], arms["single"], arms["corrective"]
  assert real.prep_keys(real.ARMS) == [tuple(single["prep"]), ()]
  assert real.prep_keys([baseline, single]) == [tuple(single["prep"])]
  assert real.prep_keys([baseline]) == [()]  # The default flags.
  assert real.prep_keys([corrective, dict(single, skip="unknown flag")]) == [()]
  assert real.prep_keys([dict(baseline, skip="unknown flag")]) == []


def test_real_arm_with_unknown_flag_is_skipped_with_reason():
  arm = {"name": "future", "prep": ["--no-such-prep-flag"], "fit": ["--no-such-fit-flag", "3"]}
  reason = real.availability(arm)["skip"]
  assert "beam-prep segmentation --no-such-prep-flag" in reason
  assert "beam-train fit --no-such-fit-flag" in reason
  assert real.availability({"name": "single", "prep": [], "fit": []}) == {}
  result = {
    "data": "D",
    "eval_percent": 20,
    "arms": [dict(arm, status="skipped", reason=reason)],
    "settings": {"layout": "davis", "image_size": 48, "batch": 4, "steps": 4, "max_clicks": 5},
  }
  assert f"| future | skipped: {reason} |" in real.table(result)
