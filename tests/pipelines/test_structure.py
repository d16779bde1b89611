"""The job's structure and its failures: chains checked before the job, one
kernel's accounting, a failed job that never looks complete, layouts as plugins,
and no import circle in the packages."""

import ast
import json
import os

import pytest
from PIL import Image

from tests.helpers import ROOT, dead_letters, manifest, png, run_cli, scene

PACKAGES = ("beam_prep", "train", "pipelines", "benchmarks")


def _folders(root, n=3, size=48):
  (root / "images").mkdir(parents=True)
  (root / "masks").mkdir()
  for i in range(n):
    img, inst = scene(size, ((4 + i, 4, 30, 34), (30, 30, 46, 46)))
    (root / "images" / f"s{i}.png").write_bytes(png(img))
    (root / "masks" / f"s{i}.png").write_bytes(png(inst, "L"))
  return str(root)


def _prep(data, out, *extra):
  return run_cli(
    [
      "segmentation",
      "--input",
      data,
      "--output",
      str(out),
      "--image-size",
      "48",
      "--variants",
      "2",
      "--eval-percent",
      "0",
      "--progress-seconds",
      "0",
    ]
    + list(extra)
  )


def test_an_op_reading_a_missing_key_is_refused_before_any_data_is_read(tmp_path, capsys):
  data = _folders(tmp_path / "d")
  os.remove(os.path.join(data, "images", "s0.png"))  # would be a dead letter if read
  code = _prep(
    data, tmp_path / "out", "--ops-module", "tests.fixtures.bug_ops", "--ops", "depth_declared"
  )
  printed = capsys.readouterr().out
  assert code == 2
  assert "op 'depth_declared' reads 'depth'" in printed and "folders layout" in printed
  assert not (tmp_path / "out").exists()


def test_an_op_failing_on_every_example_stops_the_job_and_leaves_no_output(tmp_path, capsys):
  data = _folders(tmp_path / "d", n=6)
  code = _prep(
    data, tmp_path / "out", "--ops-module", "tests.fixtures.bug_ops", "--ops", "depth_feature"
  )
  printed = capsys.readouterr().out
  assert code == 2
  assert "op 'depth_feature' raised KeyError: 'depth'" in printed
  assert "images/s" in printed  # the first example it failed on
  assert "Traceback" not in printed
  # Nothing is left, in the output or beside it: the command can run again
  # at once, with no --overwrite.
  assert sorted(os.listdir(tmp_path)) == ["d"]


def test_an_op_failing_in_one_variant_keeps_the_accounting(tmp_path):
  data = _folders(tmp_path / "d")
  out = tmp_path / "out"
  assert (
    _prep(
      data,
      out,
      "--ops-module",
      "tests.fixtures.bug_ops",
      "--ops",
      "fail_one_variant(image_id='s1', object_id=2, variant=1)",
    )
    == 0
  )
  m = manifest(out)
  c = m["counts"]
  assert c["accounted"] and m["complete"]
  assert all(v >= 0 for v in c.values() if isinstance(v, int))
  assert (c["inputs_read"], c["images_used"], c["images_failed"]) == (3, 3, 0)
  assert (c["objects_found"], c["objects_used"], c["objects_failed"]) == (6, 6, 0)
  assert (c["examples_made"], c["example_errors"]) == (12, 1)
  assert c["examples_written"]["train"] == 11
  assert c["records_written"]["train"] == 6  # One per object; one holds 1 of its 2 variants.
  assert c["errors_by_reason"] == {"op_error": 1}
  [letter] = dead_letters(out)
  assert (letter["image_id"], letter["object_id"], letter["variant"]) == ("s1", 2, 1)
  assert letter["stage"] == "fail_one_variant" and "ValueError" in letter["detail"]


def test_a_job_over_the_error_fraction_fails_with_the_reason_and_an_example(tmp_path, capsys):
  data = _folders(tmp_path / "d")
  out = tmp_path / "out"
  code = _prep(data, out, "--ops-module", "tests.fixtures.bug_ops", "--ops", "reject_all")
  printed = capsys.readouterr().out
  assert code == 1
  assert not (out / "_SUCCESS").exists()
  m = manifest(out)
  assert m["complete"] is False and "no record was written" in m["problems"]
  assert "12 of 12 examples failed (100%), over --max-error-fraction 0.5" in printed
  assert "too_dark x12: reject_all: the image is too dark to use (e.g. " in printed
  assert os.path.join("images", "s0.png") in printed
  # The preview says it has nothing to show.
  assert run_cli(["preview", "--records", str(out), "--output", str(tmp_path / "p.png")]) == 2
  assert "hold no record" in capsys.readouterr().out
  # The trainer refuses it.
  from train import cli as train_cli  # pylint: disable=g-import-not-at-top

  with pytest.raises(SystemExit) as e:
    train_cli.main(
      [
        "fit",
        "--data",
        str(out),
        "--model-dir",
        str(tmp_path / "m"),
        "--steps",
        "1",
        "--no-export",
        "--noc-clicks",
        "0",
      ]
    )
  assert e.value.code != 0


def test_every_input_failing_is_a_failed_job_and_their_objects_are_counted(tmp_path, capsys):
  """A COCO export run without its images: nothing silently ends as 'done'."""
  (tmp_path / "ann").mkdir()
  (tmp_path / "elsewhere").mkdir()
  poly = [4, 4, 30, 4, 30, 30, 4, 30]
  coco = {
    "images": [{"id": i, "file_name": f"img{i}.jpg", "height": 48, "width": 48} for i in (1, 2)],
    "annotations": [
      {"id": 10 * i + k, "image_id": i, "segmentation": [poly], "iscrowd": 0}
      for i in (1, 2)
      for k in range(3)
    ],
    "categories": [{"id": 1, "name": "thing"}],
  }
  path = tmp_path / "ann" / "instances.json"
  path.write_text(json.dumps(coco))
  out = tmp_path / "out"
  code = run_cli(
    [
      "segmentation",
      "--input",
      str(path),
      "--image-root",
      str(tmp_path / "elsewhere"),
      "--output",
      str(out),
      "--image-size",
      "48",
    ]
  )
  printed = capsys.readouterr().out
  assert code == 1 and not (out / "_SUCCESS").exists()
  c = manifest(out)["counts"]
  assert (c["inputs_read"], c["images_failed"]) == (2, 2)
  assert (c["objects_found"], c["objects_failed"], c["objects_of_failed_images"]) == (6, 6, 6)
  assert "6 objects (0 used, 6 failed)" in printed and "missing_image x2" in printed


def test_wrong_inputs_are_named_with_what_was_expected(tmp_path, capsys):
  data = _folders(tmp_path / "d")
  assert (
    run_cli(
      ["segmentation", "--input", os.path.join(data, "images"), "--output", str(tmp_path / "o1")]
    )
    == 2
  )
  printed = capsys.readouterr().out
  assert f"did you mean --input {data}?" in printed and "classes" not in printed
  assert (
    run_cli(["segmentation", "--input", data, "--layout", "coco", "--output", str(tmp_path / "o2")])
    == 2
  )
  printed = capsys.readouterr().out
  assert "is a folder; the coco layout reads one annotation file" in printed
  assert "Traceback" not in printed
  assert (
    run_cli(
      ["segmentation", "--input", data, "--layout", "classes", "--output", str(tmp_path / "o3")]
    )
    == 2
  )
  assert "not the instances this task needs" in capsys.readouterr().out


def test_a_layout_registered_in_one_module_is_found_by_auto(tmp_path):
  root = tmp_path / "d"
  root.mkdir()
  img, inst = scene(48, ((4, 4, 30, 30), (30, 30, 46, 46)))
  (root / "pic.png").write_bytes(png(img))
  (root / "pic_mask.png").write_bytes(png(inst, "L"))
  (root / "pairs.txt").write_text("pic.png pic_mask.png\n")
  out = tmp_path / "out"
  assert _prep(str(root), out, "--ops-module", "tests.fixtures.pairs_layout") == 0
  m = manifest(out)
  assert m["config"]["layout"] == "pairs"
  assert m["counts"]["objects_used"] == 2 and m["counts"]["examples_written"]["train"] == 4


def _imports(path, module):
  """Modules of the project that `module` (file `path`) imports, inside functions too."""
  out = set()
  for node in ast.walk(ast.parse(open(path).read(), path)):
    if isinstance(node, ast.Import):
      out.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      out.add(node.module)
      out.update(f"{node.module}.{a.name}" for a in node.names)
  return {
    m for m in out if m.split(".")[0] in PACKAGES and m != module and not module.startswith(m + ".")
  }


def _module_paths():
  """The .py files of PACKAGES."""
  return [
    os.path.join(folder, f)
    for pkg in PACKAGES
    for folder, _, files in os.walk(os.path.join(ROOT, pkg))
    for f in files
    if f.endswith(".py")
  ]


def _import_graph():
  """{module: the project's modules it imports} over PACKAGES."""
  modules = {}
  for path in _module_paths():
    name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
    modules[name[: -len(".__init__")] if name.endswith(".__init__") else name] = path
  return {m: {t for t in _imports(p, m) if t in modules} for m, p in modules.items()}


def test_imports_flow_one_way():
  """beam_prep (the data contract, the CLI kit) imports neither command line;
  train never imports pipelines; pipelines uses train only where it
  orchestrates (the demo runs beam-train)."""
  edges = _import_graph()
  up = sorted(
    (m, t)
    for m, targets in edges.items()
    for t in targets
    if (m.startswith("beam_prep") and t.split(".")[0] in ("train", "pipelines"))
    or (m.startswith("train") and t.startswith("pipelines"))
    or (m.startswith("pipelines") and t.startswith("train") and m != "pipelines.demo")
  )
  assert not up, f"imports against the flow: {up}"
  assert any(t.startswith("train") for t in edges["pipelines.demo"])  # The check sees them.


def test_the_serving_graph_names_no_op():
  """train/export/servers.py composes the chain's twins and serving sides from
  features.json: it names no op, and imports no op module."""
  from beam_prep.ops import registry  # pylint: disable=g-import-not-at-top

  registry.import_ops_modules("tests.fixtures.user_ops,tests.fixtures.edge_ops")
  path = os.path.join(ROOT, "train", "export", "servers.py")
  tree = ast.parse(open(path).read(), path)
  said = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Name):
      said.add(node.id)
    elif isinstance(node, ast.Attribute):
      said.add(node.attr)
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
      said.add(node.value)
  assert registry.registered_ops() and not said & set(registry.registered_ops())
  assert not [m for m in _imports(path, "train.export.servers") if m.startswith("beam_prep.ops")]


def test_no_import_circle_among_the_packages():
  edges = _import_graph()
  modules = edges
  circles = []
  for start in modules:  # A circle: a module reachable from one it imports.
    stack, seen = list(edges[start]), set()
    while stack:
      m = stack.pop()
      if m == start:
        circles.append(start)
        break
      if m not in seen:
        seen.add(m)
        stack.extend(edges[m])
  assert not circles, f"modules on an import circle: {sorted(circles)}"


MAX_FUNCTION_LINES = 60  # A function a reader takes in at once.


def test_no_function_is_longer_than_a_reader_takes_in_at_once():
  long = []
  for path in _module_paths():
    tree = ast.parse(open(path).read(), path)
    for node in ast.walk(tree):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        lines = node.end_lineno - node.lineno + 1
        if lines > MAX_FUNCTION_LINES:
          long.append(f"{os.path.relpath(path, ROOT)}:{node.lineno} {node.name} ({lines} lines)")
  assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_preview_of_a_missing_folder_says_so(tmp_path, capsys):
  missing = str(tmp_path / "nope" / "records")
  assert run_cli(["preview", "--records", missing, "--output", str(tmp_path / "p.png")]) == 2
  assert f"{missing} does not exist" in capsys.readouterr().out


def test_the_plan_line_counts_images_as_the_summary_does(tmp_path, capsys):
  """Annotations of an unknown image are failed objects, not an input; an
  image entry without a size (b) takes its image's own."""
  (tmp_path / "images").mkdir()
  for name in ("a", "b"):
    img, _ = scene(48, ((4, 4, 30, 30),))
    Image.fromarray(img).save(tmp_path / "images" / f"{name}.png")
  poly = [4, 4, 30, 4, 30, 30, 4, 30]
  coco = {
    "images": [
      {"id": 1, "file_name": "images/a.png", "height": 48, "width": 48},
      {"id": 2, "file_name": "images/b.png"},
    ],
    "annotations": [
      {"id": i, "image_id": i, "segmentation": [poly], "iscrowd": 0} for i in (1, 2, 9)
    ],
  }
  (tmp_path / "instances.json").write_text(json.dumps(coco))
  assert (
    run_cli(
      [
        "segmentation",
        "--input",
        str(tmp_path / "instances.json"),
        "--output",
        str(tmp_path / "out"),
        "--image-size",
        "48",
        "--variants",
        "1",
        "--progress-seconds",
        "0.001",
      ]
    )
    == 0
  )
  printed = capsys.readouterr().out
  assert "prep: 2 inputs in" in printed and "2 images (2 used, 0 failed)" in printed
  assert "3 objects (2 used, 1 failed)" in printed
