"""The beam-prep command line: parsing, refusals, overwrite, Dataflow dry run, preview."""

import glob
import json
import os
import tarfile
import tempfile

import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import beam_runner_api_pb2
from PIL import Image

from beam_prep.config import PrepConfig
from pipelines import cli, dataflow, outputs, prep
from tests.helpers import run_cli

GCS = [
  "--runner=DataflowRunner",
  "--project=acme-vision-prod-4711",
  "--region=europe-west4",
  "--temp_location=gs://acme-vision-prep/tmp",
  "--staging_location=gs://acme-vision-prep/staging",
]


def test_settings_resolve_defaults_preset_file_flags(tmp_path):
  cfg_file = tmp_path / "c.json"
  cfg_file.write_text(json.dumps({"variants": 5, "seed": 9, "clicks": {"d": 30}}))
  known, beam_args = cli.prep_parser().parse_known_args(
    [
      "--input",
      "in",
      "--output",
      "out",
      "--preset",
      "smoke",
      "--config",
      str(cfg_file),
      "--seed",
      "3",
      "--runner=DirectRunner",
      "--direct_num_workers=2",
    ]
  )
  config = cli.build_config(known)
  assert config.image_size == 96  # preset
  assert config.options.variants == 5  # file over preset
  assert config.options.seed == 3  # flag over file
  assert config.options.clicks.d == 30 and config.options.clicks.d_margin == 5
  assert beam_args == ["--runner=DirectRunner", "--direct_num_workers=2"]
  # The user's --direct_* options win: none of ours is added.
  assert cli.pipeline_args(beam_args) == ["--runner=DirectRunner", "--direct_num_workers=2"]


@pytest.mark.parametrize(
  "typo,suggestion",
  [
    ("--varients", "--variants"),
    ("--direct_num_worker=2", "--direct_num_workers"),
    ("--imagesize", "--image-size"),
  ],
)
def test_unknown_options_are_refused_with_the_closest_known_one(typo, suggestion, tmp_path, capsys):
  argv = ["segmentation", "--input", str(tmp_path), "--output", str(tmp_path / "o"), typo]
  if "=" not in typo:
    argv.append("4")
  assert run_cli(argv) == 2
  out = capsys.readouterr().out
  assert f"unknown option {typo.split('=')[0]} (did you mean {suggestion}?)" in out
  assert not (tmp_path / "o").exists()  # refused before anything ran


def test_help_shows_every_default(capsys):
  with pytest.raises(SystemExit):
    cli.main(["segmentation", "--help"])
  text = " ".join(capsys.readouterr().out.split())
  for flag, default in (
    ("--variants VARIANTS", "2"),
    ("--image-size IMAGE_SIZE", "128"),
    ("--target-shard-mb TARGET_SHARD_MB", "200.0"),
    ("--eval-percent EVAL_PERCENT", "20"),
    ("--seed SEED", "0"),
  ):
    after = text.split(flag, 2)[2] if text.count(flag) > 1 else text.split(flag, 1)[1]
    assert f"(default: {default})" in after.split(" --", 1)[0], flag


def test_a_task_is_offered_only_the_options_it_uses(capsys):
  """Classification samples no clicks and none of its layouts lists image
  paths: no --seed, --variants or --image-root in its help or its flags."""
  with pytest.raises(SystemExit):
    cli.main(["classification", "--help"])
  text = capsys.readouterr().out
  for flag in ("--seed", "--variants", "--image-root", "--click-encoding"):
    assert flag not in text, flag
  with pytest.raises(SystemExit):
    cli.main(["segmentation", "--help"])
  assert "--image-root" in capsys.readouterr().out
  with pytest.raises(SystemExit) as e:
    cli.main(["classification", "--input", "x", "--output", "y", "--seed", "3"])
  assert e.value.code == 2 and "unknown option --seed" in capsys.readouterr().out


def test_local_mode_follows_input_size_and_cores(tmp_path):
  small, large = tmp_path / "small", tmp_path / "large"
  for root, n in ((small, 10), (large, cli.PARALLEL_MIN_INPUTS)):
    for sub in ("images", "masks"):
      (root / sub).mkdir(parents=True)
      for i in range(n):
        (root / sub / f"{i}.png").write_bytes(b"")
  one = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]
  assert cli.direct_defaults(str(small), cores=4) == one
  assert cli.direct_defaults(str(large), cores=1) == one
  assert cli.direct_defaults(str(large), cores=4) == [
    "--direct_running_mode=multi_threading",
    "--direct_num_workers=4",
  ]
  assert cli.direct_defaults(str(large), cores=64)[1] == (
    f"--direct_num_workers={cli.MAX_LOCAL_WORKERS}"
  )
  assert cli.pipeline_args([], str(large)) == cli.direct_defaults(str(large))
  manifest_file = tmp_path / "m.csv"
  rows = cli.PARALLEL_MIN_INPUTS + 1
  manifest_file.write_text("image\n" + "".join(f"{i}.png\n" for i in range(rows)))
  assert cli.direct_defaults(str(manifest_file), cores=2)[1] == "--direct_num_workers=2"


@pytest.mark.parametrize(
  "argv,message",
  [
    (["--input", "x"], "--output"),
    (["--input", "x", "--output", "y", "--image-size", "4"], "--image-size must be"),
    (["--input", "x", "--output", "y", "--layout", "zip"], "layout"),
    (["--input", "x", "--output", "y", "--eval-percent", "101"], "--eval-percent must be"),
  ],
)
def test_bad_options_are_refused_with_a_reason(argv, message, capsys):
  assert run_cli(["segmentation"] + argv) == 2
  assert message in capsys.readouterr().out


def test_bad_config_file_key(tmp_path, capsys):
  (tmp_path / "c.json").write_text('{"variantz": 3}')
  assert (
    run_cli(["segmentation", "--input", "x", "--output", "y", "--config", str(tmp_path / "c.json")])
    == 2
  )
  assert "unknown config keys: ['variantz']" in capsys.readouterr().out


def test_a_layout_from_the_config_file_that_reads_nothing_says_where_it_came_from(
  sample_dir, tmp_path, capsys
):
  """The settings of another run (--config) reused on new data: its layout is
  named as the file's, with the flag that detects the input's own."""
  (tmp_path / "c.json").write_text('{"layout": "coco_mval"}')
  argv = ["segmentation", "--input", sample_dir, "--output", str(tmp_path / "o")]
  assert run_cli(argv + ["--config", str(tmp_path / "c.json")]) == 2
  said = capsys.readouterr().out
  assert "as the coco_mval layout: no image matches" in said
  assert f"--layout coco_mval came from --config {tmp_path / 'c.json'}: give --layout auto" in said
  assert run_cli(argv + ["--layout", "coco_mval"]) == 2  # Asked for: nothing to add.
  said = capsys.readouterr().out
  assert "as the coco_mval layout" in said and "came from" not in said
  assert not os.path.exists(tmp_path / "o")


def test_a_remote_output_of_any_scheme_is_listed_never_made_on_disk(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  # No credentials for s3:// here: the listing fails, and says so.
  with pytest.raises(outputs.OutputError, match=r"cannot list the output s3://bucket/run1"):
    outputs.prepare_output("s3://bucket/run1", overwrite=False)
  assert not list(tmp_path.iterdir())  # No local "s3:" folder.


@pytest.mark.parametrize(
  "drop,add,message",
  [
    ("--project=acme-vision-prod-4711", [], "--project is required"),
    ("--region=europe-west4", [], "--region is required"),
    (
      "--temp_location=gs://acme-vision-prep/tmp",
      ["--temp_location=/tmp/x"],
      "--temp_location must be on GCS",
    ),
  ],
)
def test_dataflow_options_are_validated_offline(drop, add, message):
  args = [a for a in GCS if a != drop] + add
  config = PrepConfig(input="gs://acme-vision-prep/data", output="gs://acme-vision-prep/out")
  with pytest.raises(dataflow.DataflowOptionsError, match=message):
    dataflow.check_and_complete(args, config)


@pytest.mark.parametrize(
  "path,reason",
  [
    ("gs://b/tmp", "has 1 characters"),
    ("gs://Acme_Prep/tmp", "not a valid name"),
    ("gs://acme-/tmp", "not a valid name"),
    ("gs://192.168.5.4/tmp", "IP address"),
    ("gs://google-prep/tmp", "'google'"),
    ("gs://" + "a" * 64 + "/tmp", "has 64 characters"),
  ],
)
def test_bucket_names_are_checked_offline_before_beam_sees_them(path, reason):
  assert dataflow.bucket_problem(path) and reason in dataflow.bucket_problem(path)
  args = [a for a in GCS if not a.startswith(("--temp_location", "--staging_location"))]
  args += [f"--temp_location={path}", f"--staging_location={path}", "--dry_run=True"]
  config = PrepConfig(input="gs://acme-vision-prep/data", output="gs://acme-vision-prep/out")
  with pytest.raises(dataflow.DataflowOptionsError, match="--temp_location: bucket"):
    dataflow.check_and_complete(args, config)


def test_valid_bucket_names_pass():
  for path in ("gs://acme-vision-prep/x", "gs://a_b.c-d/x", "gs://abc", "gs://data.example.com/x"):
    assert dataflow.bucket_problem(path) is None, path


def test_dataflow_refuses_local_paths(tmp_path, capsys):
  assert (
    run_cli(["segmentation", "--input", str(tmp_path), "--output", str(tmp_path / "o")] + GCS) == 2
  )
  out = capsys.readouterr().out
  assert "--input" in out and "--output" in out and "not on GCS" in out


def test_dataflow_dry_run_builds_the_job_with_our_package(tmp_path, monkeypatch):
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
  config = PrepConfig(
    input="gs://acme-vision-prep/data", output="gs://acme-vision-prep/out", image_size=64
  )
  args = dataflow.check_and_complete(GCS + ["--dry_run=True"], config)
  assert f"--setup_file={dataflow.package_setup_file()}" in args
  result = prep.run(config, PipelineOptions(args))
  assert result["dry_run"]
  assert not glob.glob(str(tmp_path / "beam_prep_dry_run_*"))  # Its traced graph is removed.
  pipeline = result["job"].proto_pipeline
  top = {t.unique_name for t in pipeline.components.transforms.values()}
  for stage in ("ListInputs", "PlanShards", "WriteShards", "AnalyzeAndTransform", "Finalize"):
    assert stage in top
  staged = {}
  for env in pipeline.components.environments.values():
    for dep in env.dependencies:
      name = beam_runner_api_pb2.ArtifactStagingToRolePayload.FromString(dep.role_payload)
      path = beam_runner_api_pb2.ArtifactFilePayload.FromString(dep.type_payload).path
      staged[name.staged_name] = path
  assert "workflow.tar.gz" in staged
  assert os.path.basename(staged["workflow.tar.gz"]).startswith("beam_prep-")
  if os.path.exists(staged["workflow.tar.gz"]):
    with tarfile.open(staged["workflow.tar.gz"]) as tar:
      names = tar.getnames()
    assert any(n.endswith("beam_prep/ops/clicks.py") for n in names)


def test_preview_image_has_four_non_blank_panels_per_example(prep_dir, tmp_path):
  from pipelines import preview  # pylint: disable=g-import-not-at-top

  png = prep_dir + "/preview.png"
  assert os.path.exists(png)
  out = str(tmp_path / "p.png")
  assert run_cli(["preview", "--records", prep_dir, "--output", out, "--count", "3"]) == 0
  im = np.asarray(Image.open(out).convert("L")).astype(float)
  h, w = im.shape
  assert max(h, w) >= 512  # Readable, though the records are 64 px.
  # Each of the 4 panels (image, mask, two distance maps) of each row shows something.
  step = preview.PANEL + preview.GAP
  assert w == preview.SIDE + 4 * step and h == preview.TITLE + 3 * step
  for r in range(3):
    for c in range(4):
      y0, x0 = preview.TITLE + r * step, preview.SIDE + c * step
      panel = im[y0 : y0 + preview.PANEL, x0 : x0 + preview.PANEL]
      assert panel.std() > 10, f"row {r}, panel {c} looks blank"


def test_dataflow_dry_run_with_a_custom_worker_image():
  image = "europe-west4-docker.pkg.dev/acme-vision-prod-4711/prep/beam-prep:0.1.0"
  config = PrepConfig(
    input="gs://acme-vision-prep/data", output="gs://acme-vision-prep/out", image_size=64
  )
  args = dataflow.check_and_complete(
    GCS + ["--dry_run=True", f"--sdk_container_image={image}"], config
  )
  assert not any(a.startswith("--setup_file") for a in args)  # the image holds the package
  result = prep.run(config, PipelineOptions(args))
  assert result["dry_run"]
  envs = result["job"].proto_pipeline.components.environments.values()
  images = {
    beam_runner_api_pb2.DockerPayload.FromString(e.payload).container_image
    for e in envs
    if e.urn == "beam:env:docker:v1"
  }
  assert image in images, images
  # The Dockerfile builds on Beam's SDK image of the launcher's Beam version.
  import apache_beam  # pylint: disable=g-import-not-at-top

  dockerfile = open(
    os.path.join(os.path.dirname(dataflow.package_setup_file()), "docker", "Dockerfile")
  ).read()
  assert f"ARG BEAM_VERSION={apache_beam.__version__}" in dockerfile
  pinned = open(
    os.path.join(
      os.path.dirname(dataflow.package_setup_file()), "docker", "worker-requirements.txt"
    )
  ).read()
  assert f"apache-beam=={apache_beam.__version__}" in pinned
  # The pins are the job's requirements and what they pull in: no trainer,
  # launcher or test tools on the workers.
  names = {line.split("==")[0] for line in pinned.splitlines() if "==" in line}
  from packaging.requirements import Requirement  # pylint: disable=g-import-not-at-top
  from packaging.utils import canonicalize_name  # pylint: disable=g-import-not-at-top
  import importlib.util  # pylint: disable=g-import-not-at-top

  spec = importlib.util.spec_from_file_location(
    "worker_requirements",
    os.path.join(
      os.path.dirname(dataflow.package_setup_file()), "docker", "worker_requirements.py"
    ),
  )
  worker_requirements = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(worker_requirements)
  assert {canonicalize_name(Requirement(r).name) for r in worker_requirements.required()} <= names
  assert not names & {"matplotlib", "tensorboard", "build", "pytest"}


def test_each_preset_has_both_halves_and_both_are_valid():
  """A preset is one name for a pair: the prep and train tables name the same presets,
  and each half builds its config."""
  from beam_prep import kit
  from train import tasks  # noqa: F401  (registers the tasks' fit options)
  from train.config import TrainConfig

  assert set(PrepConfig.PRESETS) == set(TrainConfig.PRESETS)
  for name in PrepConfig.PRESETS:
    PrepConfig.from_dict({"input": "x", "output": "y", **kit.preset(PrepConfig, name)})
    TrainConfig.from_dict({"data": "x", "model_dir": "y", **kit.preset(TrainConfig, name)})
  with pytest.raises(ValueError, match="unknown preset 'tiny'; choose from"):
    kit.preset(TrainConfig, "tiny")
