"""The targets the figures are checked against, the printed table and the plot.

Measures nothing: `check_targets` turns a run's figures into the ratios of
TARGETS and whether each is met, `table` prints a result as Markdown and
`plot` draws the input pipelines' images/s.
"""

from typing import Any, Callable, Dict, List, Tuple

from benchmarks.storage import STORAGE_ROWS

TARGETS = {
  "input.precomputed_vs_on_the_fly": (">=", 20.0),
  "input.precomputed_vs_read_ceiling": (">=", 0.85),
  "train.real_vs_synthetic": (">=", 0.95),
  "prep.beam_vs_kernel": (">=", 0.75),
  "prep.beam_marginal_vs_kernel": (">=", 0.75),
  "clicks.ms_per_sample": ("<=", 20.0),
  "clicks.speedup_vs_reference": (">=", 15.0),
  "prep.peak_rss_16n_vs_n": ("<=", 1.1),
  "serve.bad_5xx": ("<=", 0),
  "serve.bad_rss_after_vs_before": ("<=", 1.1),
  "serve.encoded_rest_vs_saved_model": ("<=", 1.3),
  "storage.object_vs_variant_bytes": ("<=", 0.4),
  "storage.object_vs_variant_reader": (">=", 1.0),
  "labels.save_ms_p95": ("<=", 50.0),
}

Row = Tuple[str, str, str]  # figure, value, setting
Figures = Dict[str, Any]


def ratios(figures: Figures) -> Dict[str, float]:
  """The measured value of each of TARGETS."""
  return {
    "input.precomputed_vs_on_the_fly": figures["input.precomputed_img_s"]
    / figures["input.on_the_fly_img_s"],
    "input.precomputed_vs_read_ceiling": figures["input.precomputed_img_s"]
    / figures["input.read_ceiling_img_s"],
    "train.real_vs_synthetic": figures["train.real_steps_s"] / figures["train.synthetic_steps_s"],
    "prep.beam_vs_kernel": figures["prep.beam_objects_s"] / figures["prep.kernel_objects_s"],
    "prep.beam_marginal_vs_kernel": figures["prep.beam_marginal_vs_kernel_median"],
    "storage.object_vs_variant_bytes": (
      figures["storage.object.bytes_per_example"] / figures["storage.variant.bytes_per_example"]
    ),
    "storage.object_vs_variant_reader": (
      figures["storage.object.examples_s_per_core"] / figures["storage.variant.examples_s_per_core"]
    ),
    "clicks.ms_per_sample": figures["clicks.ms_per_sample"],
    "clicks.speedup_vs_reference": figures["clicks.reference_ms_per_sample"]
    / figures["clicks.ms_per_sample"],
    "prep.peak_rss_16n_vs_n": figures["prep.peak_rss_mb.16N"] / figures["prep.peak_rss_mb.N"],
    "serve.bad_5xx": figures["serve.bad_5xx"],
    "serve.bad_rss_after_vs_before": figures["serve.bad_rss_after_vs_before"],
    "serve.encoded_rest_vs_saved_model": figures["serve.encoded_rest_vs_saved_model"],
    "labels.save_ms_p95": figures["labels.save_ms_p95"],
  }


def check_targets(figures: Figures) -> Dict[str, Dict[str, Any]]:
  """Each of TARGETS: its measured value, the target as text and whether it is met."""
  measured = ratios(figures)
  targets = {}
  for k, (op, want) in TARGETS.items():
    got = measured[k]
    targets[k] = {
      "value": got,
      "target": f"{op} {want}",
      "met": bool(got >= want if op == ">=" else got <= want),
    }
  return targets


# ------------------------------------------------------------------------- table


def _input_rows(f: Figures, s: Dict[str, Any]) -> List[Row]:
  return [
    (
      "input.on_the_fly_img_s",
      f"{f['input.on_the_fly_img_s']:.1f}",
      f"{s['size']}px records, batch {s['batch']}, maps in tf.py_function",
    ),
    ("input.precomputed_img_s", f"{f['input.precomputed_img_s']:.1f}", "our reader"),
    ("input.read_ceiling_img_s", f"{f['input.read_ceiling_img_s']:.1f}", "TFRecordDataset only"),
  ]


def _train_rows(f: Figures, s: Dict[str, Any]) -> List[Row]:
  return [
    (
      "train.synthetic_steps_s",
      f"{f['train.synthetic_steps_s']:.2f}",
      f"segmentation_fcn width {s['width']} depth {s['depth']}, batch {s['batch']}",
    ),
    ("train.real_steps_s", f"{f['train.real_steps_s']:.2f}", "fed by our reader"),
    ("train.input_wait_fraction", f"{f['train.input_wait_fraction']:.3f}", ""),
  ]


def _prep_rows(f: Figures, s: Dict[str, Any]) -> List[Row]:
  return [
    (
      "prep.kernel_objects_s",
      f"{f['prep.kernel_objects_s']:.1f}",
      f"{s['count']} images, {s['size']}px, {s['variants']} variants, one core",
    ),
    ("prep.beam_objects_s", f"{f['prep.beam_objects_s']:.1f}", f["prep.runner"]),
    (
      "prep.kernel_objects_s.16N",
      f"{f['prep.kernel_objects_s.16N']:.1f}",
      f"the plain loop over the {16 * f['prep.rss_images.N']} images of the slope",
    ),
    (
      "prep.beam_marginal_objects_s",
      f"{f['prep.beam_marginal_objects_s']:.1f}",
      f"slope between N and 16N images, median of {s['pairs']}; fixed cost "
      f"{f['prep.beam_fixed_seconds']:.1f} s; pairs' ratios to the loop "
      + ", ".join(f"{r:.2f}" for r in f["prep.beam_marginal_vs_kernel_pairs"]),
    ),
    (
      "prep.two_workers_speedup",
      f"{f['prep.two_workers_speedup']:.2f}",
      f"16N images: {f['prep.seconds_16n_1_worker']:.1f} s with 1 worker, "
      f"{f['prep.seconds_16n_2_workers']:.1f} s with 2 worker threads",
    ),
  ]


def _clicks_rows(f: Figures, _: Dict[str, Any]) -> List[Row]:
  return [
    ("clicks.ms_per_sample", f"{f['clicks.ms_per_sample']:.1f}", "512x512, one variant"),
    (
      "clicks.reference_ms_per_sample",
      f"{f['clicks.reference_ms_per_sample']:.1f}",
      "EDT after every click",
    ),
  ]


def _memory_rows(f: Figures, _: Dict[str, Any]) -> List[Row]:
  return [
    ("prep.peak_rss_mb.N", f"{f['prep.peak_rss_mb.N']:.0f}", f"N = {f['prep.rss_images.N']}"),
    (
      "prep.peak_rss_mb.16N",
      f"{f['prep.peak_rss_mb.16N']:.0f}",
      f"16N = {16 * f['prep.rss_images.N']} images, {f['prep.records_mb.16N']:.0f} MB of records",
    ),
  ]


def _labels_rows(f: Figures, _: Dict[str, Any]) -> List[Row]:
  return [
    (
      "labels.save_ms_p50",
      f"{f['labels.save_ms_p50']:.1f}",
      f"one new image into a store of {f['labels.fill']}",
    ),
    ("labels.save_ms_p95", f"{f['labels.save_ms_p95']:.1f}", ""),
    (
      "labels.save_full_vs_empty",
      f"{f['labels.save_full_vs_empty']:.2f}",
      f"p50 against {f['labels.save_ms_p50_empty']:.1f} ms into an empty store",
    ),
    (
      "labels.document_ms",
      f"{f['labels.document_ms']:.0f}",
      f"instances.json of {f['labels.fill']} images, beside the saves",
    ),
  ]


def _serve_rows(f: Figures, _: Dict[str, Any]) -> List[Row]:
  return [
    ("serve.latency_ms_p50", f"{f['serve.latency_ms_p50']:.1f}", "512x512, 5+5 clicks"),
    ("serve.latency_ms_p95", f"{f['serve.latency_ms_p95']:.1f}", ""),
    (
      "serve.rest_latency_ms_p50",
      f"{f['serve.rest_latency_ms_p50']:.1f}",
      f"the same through beam-train serve, TF Serving JSON "
      f"({f['serve.rest_request_mb']:.1f} MB request), answer read into numpy",
    ),
    ("serve.rest_latency_ms_p95", f"{f['serve.rest_latency_ms_p95']:.1f}", ""),
    (
      "serve.rest_vs_saved_model",
      f"{f['serve.rest_vs_saved_model']:.2f}",
      "REST p50 / SavedModel p50",
    ),
    (
      "serve.page_latency_ms_p50",
      f"{f['serve.page_latency_ms_p50']:.1f}",
      "the page's endpoint: image sent once, then clicks; probabilities and mask as PNG",
    ),
    ("serve.page_latency_ms_p95", f"{f['serve.page_latency_ms_p95']:.1f}", ""),
    (
      "serve.encoded_latency_ms_p50",
      f"{f['serve.encoded_latency_ms_p50']:.1f}",
      "a 512x600 JPEG, 5+5 clicks: the SavedModel's serve_encoded (decoded in the graph)",
    ),
    (
      "serve.encoded_rest_latency_ms_p50",
      f"{f['serve.encoded_rest_latency_ms_p50']:.1f}",
      f'the same through beam-train serve, the file as {{"b64": ...}} '
      f"({f['serve.encoded_request_kb']:.0f} kB request, {f['serve.encoded_answer_kb']:.0f} kB "
      "answer: PNG mask and probabilities), timed in turn with the SavedModel",
    ),
    ("serve.encoded_rest_latency_ms_p95", f"{f['serve.encoded_rest_latency_ms_p95']:.1f}", ""),
    (
      "serve.encoded_rest_vs_saved_model",
      f"{f['serve.encoded_rest_vs_saved_model']:.2f}",
      "REST p50 / SavedModel p50, the encoded file",
    ),
    (
      "serve.bad_5xx",
      f"{f['serve.bad_5xx']}",
      f"of {f['serve.bad_requests']} requests meant to bring the server down (100,000 "
      "clicks, 100,000-deep JSON, bodies over the limit chunked or not, broken HTTP)",
    ),
    ("serve.bad_max_ms", f"{f['serve.bad_max_ms']:.0f}", "their slowest answer"),
    (
      "serve.bad_rss_after_vs_before",
      f"{f['serve.bad_rss_after_vs_before']:.3f}",
      "the server's memory after them / before",
    ),
  ]


def _noc_rows(f: Figures, s: Dict[str, Any]) -> List[Row]:
  return [
    (
      "noc.baseline_object_clicks_s",
      f"{f['noc.baseline_object_clicks_s']:.1f}",
      f"NoC at source resolution, {f['noc.objects']} objects of {s['noc_size']}x"
      f"{s['noc_size']} images, {s['noc_clicks']} clicks; distance transforms "
      f"{100 * f['noc.edt_share_of_baseline']:.0f}% of the time",
    ),
    (
      "noc.model_object_clicks_s",
      f"{f['noc.model_object_clicks_s']:.1f}",
      "the same through the model's serving graph",
    ),
  ]


def _storage_rows(f: Figures, s: Dict[str, Any]) -> List[Row]:
  return [
    (
      f"storage.{layout}",
      f"{f[f'storage.{layout}.bytes_per_example'] / 1e3:.0f} kB/ex, "
      f"{f[f'storage.{layout}.examples_s_per_core']:.0f} ex/s/core, "
      f"{f[f'storage.{layout}.write_ms_per_example']:.2f} ms/ex to write",
      f"{what}; {s['size']}px, {f['storage.variants']} variants",
    )
    for layout, what in STORAGE_ROWS
  ]


# The figure table's groups of rows, in the order printed.
_ROW_GROUPS: Tuple[Callable[[Figures, Dict[str, Any]], List[Row]], ...] = (
  _input_rows,
  _train_rows,
  _prep_rows,
  _clicks_rows,
  _memory_rows,
  _serve_rows,
  _labels_rows,
  _noc_rows,
  _storage_rows,
)


def _target_lines(targets: Dict[str, Dict[str, Any]]) -> List[str]:
  out = ["| target | measured | wanted | met |", "|---|---|---|---|"]
  for k, t in targets.items():
    out.append(f"| {k} | {t['value']:.3g} | {t['target']} | {'yes' if t['met'] else 'NO'} |")
  return out


def table(result: Dict[str, Any]) -> str:
  """The result as Markdown: the figures, the targets, then the environment."""
  f, s = result["figures"], result["settings"]
  rows = [row for group in _ROW_GROUPS for row in group(f, s)]
  out = ["| figure | value | setting |", "|---|---|---|"]
  out += [f"| `{a}` | {b} | {c} |" for a, b, c in rows]
  out += [""] + _target_lines(result["targets"])
  env = result["environment"]
  out += ["", f"{env['cores']} cores; " + ", ".join(f"{k} {v}" for k, v in env["versions"].items())]
  return "\n".join(out)


def plot(result: Dict[str, Any], path: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  f = result["figures"]
  names = [
    "on the fly\n(tf.py_function maps)",
    "precomputed\n(our records)",
    "read ceiling\n(TFRecordDataset)",
  ]
  values = [
    f["input.on_the_fly_img_s"],
    f["input.precomputed_img_s"],
    f["input.read_ceiling_img_s"],
  ]
  fig, ax = plt.subplots(figsize=(6, 3.4))
  bars = ax.bar(names, values, color=["#c44", "#36a", "#999"])
  for b, v in zip(bars, values):
    ax.text(b.get_x() + b.get_width() / 2, v, f"{v:.0f}", ha="center", va="bottom", fontsize=9)
  ax.set_ylabel("images / s")
  ax.set_title(
    f"Input pipeline, {result['settings']['size']}px, {result['environment']['cores']} cores"
  )
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
