"""Declared features end to end: user ops and click encodings carried from the
Beam job through training to serving, with nothing of the plugin edited.

Two real runs besides the session's default one (distance maps):
  disks+edges  --click-encoding disks and the docs' extension module (docs/ops-and-features.md)
               (`tests/fixtures/edge_ops.py`, a gradient-magnitude map): 6
               input channels
  both+cap     --click-encoding both, the previous mask as an input, and a
               user op that changes a model input (`cap_distance(64)`), on
               whole images (--crop none): 8 input channels
The serving parity test is parametrized over every op that has a twin.
"""

import json
import os
import re
import shutil

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from beam_prep import keys
from beam_prep.features import FeatureTable
from beam_prep.ops import registry
from beam_prep.record_codec import RecordCodec
from tests.helpers import ROOT, assert_encoded_answer, assert_serving_parity, run_cli

RUNS = {
  "disks+edges": (
    ["--click-encoding", "disks", "--ops-module", "tests.fixtures.edge_ops", "--ops", "edges"],
    6,
  ),
  "both+cap": (
    [
      "--click-encoding",
      "both",
      "--flip-variants",
      "--previous-mask",
      "--ops-module",
      "tests.fixtures.user_ops",
      "--ops",
      "cap_distance(64)",
      "--crop",
      "none",
    ],
    8,
  ),
}
# Each op with a twin, and a run whose chain holds it.
OP_RUNS = {
  "decode": "disks+edges",
  "crop_objects": "disks+edges",
  "resize": "both+cap",
  "flip_variants": "both+cap",
  "click_disks": "disks+edges",
  "edges": "disks+edges",
  "distance_maps": "both+cap",
  "cap_distance": "both+cap",
  "prev_mask": "both+cap",
}
SIZE = 48


def _fit(args):
  """fit without the NoC evaluation (tests/train/test_noc.py covers it) unless asked."""
  from train import cli  # pylint: disable=g-import-not-at-top

  extra = [] if "--noc-clicks" in args else ["--noc-clicks", "0"]
  with pytest.raises(SystemExit) as e:
    cli.main(["fit"] + args + extra)
  return e.value.code


def _run(sample_dir, root, args):
  """One run: its records, and a model trained on them and exported."""
  prep, model = os.path.join(root, "prep"), os.path.join(root, "model")
  argv = ["segmentation", "--input", sample_dir, "--output", prep, "--image-size", str(SIZE)]
  argv += ["--variants", "1", "--eval-percent", "30", "--max-error-fraction", "1"]
  assert run_cli(argv + args) == 0
  argv = ["--data", prep, "--model-dir", model, "--steps", "4", "--batch-size", "4"]
  assert _fit(argv + ["--width", "4", "--depth", "2", "--histogram-every", "0"]) == 0


@pytest.fixture(scope="module")
def runs(sample_dir, tmp_path_factory):
  """name -> (prep dir, model dir), each prepared and trained for real (a
  test moves a prep dir away for a while: these are the module's own)."""
  out = {}
  for name, (args, _) in RUNS.items():
    root = str(tmp_path_factory.mktemp(name.replace("+", "_")))
    _run(sample_dir, root, args)
    out[name] = (os.path.join(root, "prep"), os.path.join(root, "model"))
  return out


def test_every_op_with_a_twin_is_covered_by_a_run():
  registry.import_ops_modules("tests.fixtures.user_ops,tests.fixtures.edge_ops")
  with_twins = {n for n in registry.registered_ops() if registry.op_entry(n).twin is not None}
  assert with_twins <= set(OP_RUNS), sorted(with_twins - set(OP_RUNS))


@pytest.mark.parametrize("name", sorted(RUNS))
def test_records_features_json_and_model_follow_the_declarations(runs, name):
  prep, model = runs[name]
  table = FeatureTable.load(prep)
  channels = RUNS[name][1]
  assert table.input_channels == channels
  assert FeatureTable.load(model).to_dict() == table.to_dict()  # copied by the trainer
  metrics = json.load(open(os.path.join(model, "metrics.json")))
  assert metrics["input_channels"] == channels and metrics["step_traces"] == 1
  with open(os.path.join(prep, "records", os.listdir(os.path.join(prep, "records"))[0]), "rb") as f:
    assert f.read(1)  # a real shard
  first = next(
    iter(tf.data.TFRecordDataset(sorted(tf.io.gfile.glob(keys.record_pattern(prep, "train")))))
  )
  stored = set(tf.train.Example.FromString(first.numpy()).features.feature)
  assert stored == set(table.keys())
  ex = RecordCodec(table).decode_numpy(first.numpy())
  if "edges" in table:
    from tests.fixtures.edge_ops import gradient_magnitude  # pylint: disable=g-import-not-at-top

    grey = ex[keys.IMAGE].astype(np.int32).sum(-1) // 3
    np.testing.assert_array_equal(ex["edges"][..., 0], gradient_magnitude(grey))
  if keys.CLICK_DISKS in table:
    for x, y in ex[keys.POSITIVE_CLICKS]:
      assert ex[keys.CLICK_DISKS][y, x, 0] == 1
  if name == "both+cap":
    assert ex[keys.DISTANCE_MAPS].max() <= 64


@pytest.fixture(scope="module")
def at_parity(runs):
  """at_parity(name): `assert_serving_parity` of run `name`, checked once
  for all the ops of its chain (its failure raised again for each)."""
  checked = {}

  def check(name):
    if name not in checked:
      checked[name] = None
      try:
        assert_serving_parity(*runs[name], n=3)
      except AssertionError as e:
        checked[name] = e
    if checked[name] is not None:
      raise checked[name]

  return check


@pytest.mark.parametrize("op", sorted(OP_RUNS))
def test_serving_graph_model_input_equals_the_records(runs, at_parity, op):
  prep, _ = runs[OP_RUNS[op]]
  table = FeatureTable.load(prep)
  assert op in [s.name for s in registry.parse_chain(table.chain)]
  produced = set(registry.op_entry(op).produces) & set(table.keys("model_input"))
  assert produced, f"{op} produces no model input of this run"
  at_parity(OP_RUNS[op])


@pytest.mark.parametrize("name", sorted(RUNS))
def test_the_encoded_signatures_answer_as_the_array_ones(runs, name, sample_dir):
  """User ops, whole-image records and the previous mask as an input: the
  file sent to serve_encoded (serve_iterative_encoded) is answered, as PNG
  files, as its decoded pixels are by serving_default (serve_iterative)."""
  from beam_prep.ops.image import decode_file  # pylint: disable=g-import-not-at-top
  from train.export.served import ServedModel  # pylint: disable=g-import-not-at-top

  model = ServedModel(runs[name][1])
  folder = os.path.join(sample_dir, "images")
  data = open(os.path.join(folder, sorted(os.listdir(folder))[0]), "rb").read()
  pixels = decode_file(data)
  h, w = pixels.shape[:2]
  pos, neg = [[w // 2, h // 2]], [[1, 1]]
  previous = None
  for _ in range(2):  # The first click, then the next with the previous mask.
    want = model.segment(pixels, pos, neg, previous)
    got = model.predict(*model.encoded_inputs(data, pos, neg, previous))
    assert_encoded_answer({k: v[0] for k, v in got.items()}, want)  # PNG files.
    previous = want["mask"]
  # A box prompt on whole-image records too: the encoded answer is the array
  # one, nothing outside the box; the box is the previous mask given as an input.
  box = [w // 4, h // 4, w // 2, h // 2]
  want = model.segment(pixels, [], neg, box=box)
  got = model.predict(*model.encoded_inputs(data, [], neg, box=box))
  assert_encoded_answer({k: v[0] for k, v in got.items()}, want)
  outside = np.ones((h, w), bool)
  outside[h // 4 : h // 2 + 1, w // 4 : w // 2 + 1] = False
  assert not want["mask"][outside].any() and not want["probabilities"][outside].any()
  as_previous = np.zeros((h, w), np.uint8)
  as_previous[~outside] = 1
  again = model.segment(pixels, [], neg, as_previous, box=box)
  np.testing.assert_array_equal(again["probabilities"], want["probabilities"])


def test_export_serves_without_the_prep_output_or_the_ops_module(runs, sample_dir, tmp_path):
  """The run whose user op changes a model input (its twin in the serving
  graph) and whose chain has the most twins, in a fresh process."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top

  prep, model_dir = runs["both+cap"]
  moved = str(tmp_path / "prep_moved")
  shutil.move(prep, moved)
  try:
    image = os.path.join(
      sample_dir, "images", sorted(os.listdir(os.path.join(sample_dir, "images")))[0]
    )
    w, h = Image.open(image).size
    out = str(tmp_path / "mask.png")
    # A fresh process from a folder where `tests` is not importable: the
    # SavedModel must not need the user's ops module.
    code = "import sys; from train import cli; cli.main(sys.argv[1:])"
    r = subprocess.run(
      [
        sys.executable,
        "-c",
        code,
        "predict",
        "--model",
        model_dir,
        "--image",
        image,
        "--positive",
        f"{w // 2},{h // 2}",
        "--negative",
        "1,1",
        "--output",
        out,
      ],
      capture_output=True,
      text=True,
      timeout=300,
      cwd=str(tmp_path),
      env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert np.asarray(Image.open(out)).shape == (h, w)
  finally:
    shutil.move(moved, prep)


def test_portable_files_answer_as_the_saved_model_on_the_whole_image_chain(runs, tmp_path):
  """The chain with the most twins (whole-image resize, flips, both click
  encodings, a previous mask, a user op) as TFLite and ONNX files, equal to
  its SavedModel: `serve_iterative`, whose graph is `serving_default`'s with
  the previous mask given (both signatures of the crop chain, through
  `beam-train export --format`: tests/train/test_portable.py)."""
  from beam_prep.prep_output import PrepOutput  # pylint: disable=g-import-not-at-top
  from train import models  # pylint: disable=g-import-not-at-top
  from train.export import portable, saved_model  # pylint: disable=g-import-not-at-top
  from train.export import signatures as sig  # pylint: disable=g-import-not-at-top
  from train.export.portable_model import PortableModel  # pylint: disable=g-import-not-at-top
  from train.export.served import ServedModel  # pylint: disable=g-import-not-at-top

  prep, model_dir = runs["both+cap"]
  served = ServedModel(model_dir)
  data = PrepOutput(prep)
  server = saved_model.SegmentationServer(models.rebuild(model_dir), data.tft_output, data.table)
  files = {
    portable.TFLITE: portable.to_tflite(served.path, sig.SERVE_ITERATIVE),
    portable.ONNX: portable.to_onnx(server.signatures()[sig.SERVE_ITERATIVE], sig.SERVE_ITERATIVE),
  }
  rng = np.random.default_rng(1)
  image = rng.integers(0, 256, (57, 83, 3), dtype=np.uint8)
  pos, neg = [[40, 30], [45, 28]], [[3, 50]]
  previous = served.segment(image, pos, neg)["mask"]
  want = served.segment(image, pos, neg, previous)
  for fmt, content in files.items():
    path = str(tmp_path / portable.file_name(sig.SERVE_ITERATIVE, fmt))
    with open(path, "wb") as f:
      f.write(content)
    got = PortableModel(path).segment(image, pos, neg, previous)
    # This model's probabilities hug the threshold: a few mask pixels may
    # differ; every probability stays within 2e-3 (at_parity asks 0.01).
    assert portable.at_parity(want, got), (fmt, portable.parity(want, got))
    np.testing.assert_allclose(got["probabilities"], want["probabilities"], atol=2e-3)


def test_an_op_changing_a_model_input_without_a_twin_is_refused_before_training(
  sample_dir, tmp_path, capsys
):
  prep, model = str(tmp_path / "prep"), str(tmp_path / "model")
  assert (
    run_cli(
      [
        "segmentation",
        "--input",
        sample_dir,
        "--output",
        prep,
        "--image-size",
        "32",
        "--variants",
        "1",
        "--max-error-fraction",
        "1",
        "--ops-module",
        "tests.fixtures.user_ops",
        "--ops",
        "brighten(30)",
      ]
    )
    == 0
  )
  capsys.readouterr()
  args = [
    "--data",
    prep,
    "--model-dir",
    model,
    "--steps",
    "2",
    "--batch-size",
    "2",
    "--width",
    "4",
    "--depth",
    "1",
    "--histogram-every",
    "0",
  ]
  assert _fit(args) == 1
  out = capsys.readouterr().out
  assert re.search(
    r"op 'brighten' produces the model input\(s\) image but has no TensorFlow "
    r"twin",
    out,
  ), out
  assert "twin=" in out and not os.path.exists(os.path.join(model, "checkpoints"))
  assert _fit(args + ["--no-export"]) == 0  # training without a serving model is allowed


def test_readme_extension_example_is_the_tested_fixture():
  readme = open(os.path.join(ROOT, "docs", "ops-and-features.md")).read()
  fixture = open(os.path.join(ROOT, "tests", "fixtures", "edge_ops.py")).read()
  assert "```python\n" + fixture + "```" in readme
