"""Package definition for beam_prep, train and pipelines.

This file is also what Dataflow workers install through ``--setup_file``, so
it must not import the package, TensorFlow or Beam: everything it needs is
read from plain text.
"""

import os
import re

import setuptools

_HERE = os.path.dirname(os.path.abspath(__file__))


def _version():
  with open(os.path.join(_HERE, "beam_prep", "version.py")) as f:
    return re.search(r'__version__ = "([^"]+)"', f.read()).group(1)


# One line of versions that installs together on Python 3.11-3.13: tf.Transform
# 1.21 pins TensorFlow below 2.22 and is built against Beam 2.7x.
# REQUIRED is what the Beam job needs, on the launcher and on every Dataflow
# worker (which installs this package with --setup_file); nothing else.
REQUIRED = [
  "tensorflow==2.21.*",
  "tensorflow-transform==1.21.*",
  "apache-beam[gcp]==2.77.*",
  # TFRecord framing of the shard writer (also installed by Beam's gcp extra).
  "google-crc32c",
  "numpy",
  "scipy",
  "pillow",
  # COCO polygons and RLE (the coco layout).
  "pycocotools",
]

EXTRAS = {
  # beam-train: tf.summary needs tensorboard (TensorFlow 2.21 no longer
  # installs it); plots of the trainer and the benchmarks use matplotlib;
  # `beam-train serve` is a Flask app served by waitress (pure Python, a
  # fixed pool of threads) and writes JSON with orjson.
  "train": ["tensorboard", "matplotlib", "flask>=3", "waitress>=3", "orjson"],
  # Launching on Dataflow: Beam builds the package it stages with
  # `python -m build` (without it, with the deprecated `setup.py sdist`).
  "dataflow": ["build"],
  # `beam-train export --format tflite|onnx` and `beam-train predict` on
  # those files (train.export.portable): tf2onnx converts, onnxruntime and LiteRT
  # run the files. Never on a Dataflow worker.
  "portable": ["tf2onnx>=1.17", "onnxruntime>=1.20", "ai-edge-litert>=1.2"],
  # The page's test drives a real browser (Debian's chromium and
  # chromium-driver, installed by .ci/run) through selenium; the suite
  # runs on every core with pytest-xdist (`make test`); a test builds the
  # documentation site with mkdocs (`mkdocs build --strict`); CI checks lint
  # and format with ruff (`make lint`; its settings: pyproject.toml); CVAT's
  # function (deploy/cvat) is called through nuclio's own SDK.
  "test": [
    "pytest>=7",
    "pytest-xdist>=3.2",
    "selenium>=4",
    "mkdocs>=1.6",
    "mkdocs-material>=9.5",
    "ruff>=0.6",
    "nuclio-sdk>=0.5",
  ],
}
EXTRAS["all"] = sorted({r for name in ("train", "dataflow", "portable") for r in EXTRAS[name]})

setuptools.setup(
  name="beam-prep",
  version=_version(),
  description=(
    "Heavy per-example preprocessing computed once by Apache Beam and "
    "tf.Transform into TFRecords, and a TensorFlow trainer that reads them."
  ),
  python_requires=">=3.11,<3.14",
  packages=setuptools.find_packages(include=["beam_prep*", "train*", "pipelines*"]),
  # The page of `beam-train serve`: plain files, no build step.
  package_data={"train.serve": ["static/*.html", "static/*.js", "static/*.css"]},
  install_requires=REQUIRED,
  extras_require=EXTRAS,
  entry_points={
    "console_scripts": [
      "beam-prep=pipelines.cli:main",
      "beam-train=train.cli:main",
    ]
  },
)
