"""`python -m benchmarks --boxes` on the session's records and model (no figure asserted)."""

import json

import pytest

from benchmarks import run


def test_boxes_reports_one_click_and_each_box(prep_dir, trained, tmp_path, capsys):
  out = tmp_path / "boxes.json"
  argv = ["--boxes", prep_dir, "--boxes-model", trained, "--boxes-objects", "3"]
  with pytest.raises(SystemExit) as e:
    run.main(argv + ["--boxes-pad", "0,0.25", "--json", str(out)])
  assert e.value.code == 0
  result = json.load(open(out))
  assert result["objects"] == 3 and 0 <= result["iou_one_click"] <= 1
  assert [b["pad"] for b in result["boxes"]] == [0.0, 0.25]
  for b in result["boxes"]:
    for k in (
      "iou",
      "iou_box_filled",
      "iou_centre_click_cut",
      "iou_box_and_click",
      "centre_on_object",
    ):
      assert 0 <= b[k] <= 1, k
  assert "| 25% |" in capsys.readouterr().out


@pytest.mark.parametrize(
  "extra, message",
  [
    (["--boxes-model", ""], "--boxes-model MODEL is required"),
    (["--boxes-pad", "a,b"], "--boxes-pad 'a,b': comma-separated fractions"),
    (["--boxes-pad", "2"], "fractions in 0..1"),
  ],
)
def test_boxes_refuses_bad_flags_in_one_line(prep_dir, tmp_path, capsys, extra, message):
  with pytest.raises(SystemExit) as e:
    run.main(["--boxes", prep_dir, "--boxes-model", str(tmp_path)] + extra)
  assert e.value.code == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("python -m benchmarks --boxes: ") and message in err, err
