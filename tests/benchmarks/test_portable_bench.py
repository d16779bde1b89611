"""`python -m benchmarks --portable`'s parts on the session's model: parity
over the protocol's clicks, one runtime's timing (in this process), the table."""

import queue

import numpy as np
import pytest

from benchmarks import portable as bench
from benchmarks import run


def test_parity_compares_every_click_of_each_file(portable_export, trained, prep_dir):
  from train.evaluate.simulate import source_objects  # pylint: disable=g-import-not-at-top

  found = source_objects(prep_dir)[:2]
  result = bench.parity(portable_export, trained, found, clicks=3)
  assert result["objects"] == 2 and 2 <= result["clicks"] <= 6
  for fmt in bench.FORMATS:
    r = result["formats"][fmt]
    assert r["pixels"] > 0 and 0 <= r["differing_pixels"] <= r["pixels"]
    assert r["max_probability_difference"] < 1e-2
  result["latency"] = [{"runtime": "onnx", "threads": 1, "ms": 3.5}]
  text = bench.table(result)
  assert "| tflite |" in text and "| onnx | 1 | 3.5 |" in text


@pytest.mark.parametrize("fmt", bench.FORMATS)
def test_one_runtime_is_timed(portable_export, prep_dir, fmt):
  image = np.random.default_rng(0).integers(0, 256, (40, 60, 3), dtype=np.uint8)
  out = queue.Queue()
  bench._time_one(fmt, bench._files(portable_export)[fmt], 1, bench._latency_request(image), out)
  assert out.get_nowait() > 0


def test_refuses_an_export_without_portable_files(trained, prep_dir, capsys):
  argv = ["--portable", trained, "--portable-data", prep_dir]
  with pytest.raises(SystemExit) as e:
    run.main(argv)
  assert e.value.code == 2
  assert "export with beam-train export --format all" in capsys.readouterr().err
