"""Helpers every figure group shares: timing, logging, sample data and pipeline runs.

Measures nothing by itself: `median_rate`, `batches_rate` and `timed` are the
timing loops the figure modules use, `run_pipeline` and
`pipeline_in_fresh_process` run the segmentation job as the CLI does (the
latter reports its peak RSS, wall seconds and objects), and `environment`
describes the machine a result was measured on.
"""

import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from typing import Any, Callable, Dict, Iterator, List, Sequence, Tuple


def median_rate(fn: Callable[[], int], repeats: int) -> float:
  """Median of items/s over `repeats` timed calls; `fn` returns items done."""
  rates = []
  for _ in range(repeats):
    t = time.perf_counter()
    n = fn()
    rates.append(n / (time.perf_counter() - t))
  return statistics.median(rates)


def batches_rate(it: Iterator[Any], batch: int, batches: int, repeats: int) -> float:
  """Median examples/s of taking `batches` batches of `batch` from `it`, after
  3 warm-up batches (they fill buffers and trace functions)."""
  for _ in range(3):
    next(it)

  def take():
    for _ in range(batches):
      next(it)
    return batches * batch

  return median_rate(take, repeats)


def timed(fn: Callable[[], Any], repeats: int) -> List[float]:
  """Milliseconds of each of `repeats` calls after 3 warm-up calls."""
  for _ in range(3):
    fn()
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    fn()
    times.append(1000 * (time.perf_counter() - t))
  return times


def refuse(prog: str, why: str) -> int:
  """Says why a benchmark's flags cannot run, in one line; its exit code (2)."""
  print(f"{prog}: {why}", file=sys.stderr)
  return 2


def run_and_write(run: Callable[[], Dict[str, Any]], path: str, table: Callable) -> int:
  """`run()`'s result with its `seconds`, written as JSON at `path` and
  printed as `table(result)` (`write_result`); the exit code (0)."""
  t0 = time.time()
  result = run()
  result["seconds"] = time.time() - t0
  write_result(result, path, table(result))
  return 0


def write_result(result: Dict[str, Any], path: str, text: str) -> None:
  """Writes a run's result as JSON at `path`, then prints its table `text`
  and the run's seconds."""
  if os.path.dirname(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    json.dump(result, f, indent=2, sort_keys=True)
  print(text)
  print(f"\n({result['seconds']:.0f} s; JSON: {path})")


@contextlib.contextmanager
def serving(model_dir: str, **config) -> Iterator[Tuple[Any, Any]]:
  """`beam-train serve` of `model_dir` (with ServeConfig's `config`) on a
  local port of 127.0.0.1, in a thread of this process: (the server, its
  versions: `versions.current` the loaded model), until the block ends."""
  from train.serve import app  # pylint: disable=g-import-not-at-top
  from train.serve.config import ServeConfig  # pylint: disable=g-import-not-at-top

  with app.running(ServeConfig(model=model_dir, model_name="bench", port=0, **config)) as served:
    yield served


def url_of(server) -> str:
  """The address of a server `serving` started."""
  return f"http://127.0.0.1:{server.port}"


def run_command(main_fn: Callable[[List[str]], None], argv: List[str], log_path: str) -> int:
  """Runs a command's `main(argv)` in this process, its output to `log_path`;
  returns its exit code (1 for an exception, whose traceback goes to the log)."""
  with open(log_path, "w") as f, contextlib.redirect_stdout(f):
    try:
      main_fn(argv)
    except SystemExit as e:
      return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except Exception:  # pylint: disable=broad-except
      traceback.print_exc(file=f)
      return 1
  return 0


def log(msg: str) -> None:
  print(f"bench: {msg}", flush=True)


def make_data(workdir: str, count: int, size: int, seed: int = 0) -> str:
  from beam_prep.sample_data import write_sample_data  # pylint: disable=g-import-not-at-top

  path = os.path.join(workdir, f"data_{count}_{size}")
  if not os.path.isdir(path):
    write_sample_data(path, count=count, seed=seed, size=(size, size))
  return path


def run_pipeline(
  data: str, out: str, size: int, variants: int, beam_args: Sequence[str] = (), **fields
) -> Dict[str, Any]:
  """The segmentation pipeline exactly as `beam-prep segmentation` runs it."""
  from apache_beam.options.pipeline_options import PipelineOptions  # pylint: disable=g-import-not-at-top
  from beam_prep.config import PrepConfig  # pylint: disable=g-import-not-at-top
  from pipelines import cli, prep  # pylint: disable=g-import-not-at-top

  config = PrepConfig.from_dict(
    dict(input=data, output=out, image_size=size, variants=variants, overwrite=True, **fields)
  )
  return prep.run(config, PipelineOptions(cli.pipeline_args(list(beam_args), data)))


def pipeline_in_fresh_process(
  data: str, out: str, size: int, variants: int = 1, beam_args: Sequence[str] = ()
) -> Dict[str, float]:
  """One pipeline run in a fresh process: peak RSS (MB), wall seconds, objects."""
  code = (
    "import json, resource, sys\n"
    "from pipelines import logs\nlogs.quiet()\n"
    "from benchmarks.common import run_pipeline\n"
    f"m = run_pipeline({data!r}, {out!r}, {size}, {variants}, beam_args={list(beam_args)!r})\n"
    # The pipeline runs in this process (in_memory DirectRunner).
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss across fork+exec,
    # so a child would report its (large) parent's peak.
    "rss = next(int(l.split()[1]) for l in open('/proc/self/status')\n"
    "           if l.startswith('VmHWM:'))\n"
    "print('RESULT', json.dumps({'rss_mb': rss / 1024.0,\n"
    "      'seconds': m['timing']['wall_seconds'],\n"
    "      'records_mb': sum(v['bytes'] for k, v in m['shards'].items()\n"
    "                        if k in ('train', 'eval')) / 1e6,\n"
    "      'objects': m['counts']['objects_found']}))\n"
  )
  r = subprocess.run(
    [sys.executable, "-c", code],
    capture_output=True,
    text=True,
    timeout=1800,
    cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
  )
  for line in r.stdout.splitlines():
    if line.startswith("RESULT"):
      return json.loads(line.split(" ", 1)[1])
  raise RuntimeError(f"pipeline run failed:\n{r.stdout}\n{r.stderr}")


def environment() -> Dict[str, Any]:
  from beam_prep.version import library_versions  # pylint: disable=g-import-not-at-top

  return {
    "cores": os.cpu_count(),
    "machine": platform.machine(),
    "platform": platform.platform(),
    "versions": library_versions(),
  }
