"""Single source of the package version (read by setup.py as text), and the
versions of the libraries a run used (recorded beside its output)."""

import importlib.metadata as md
import platform
from typing import Dict

__version__ = "0.1.0"


def library_versions() -> Dict[str, str]:
  """The installed versions of Python and the libraries a run depends on."""
  out = {"python": platform.python_version()}
  for name in (
    "apache-beam",
    "tensorflow",
    "tensorflow-transform",
    "tfx-bsl",
    "numpy",
    "scipy",
    "pillow",
    "beam-prep",
  ):
    try:
      out[name] = md.version(name)
    except md.PackageNotFoundError:
      pass
  return out
