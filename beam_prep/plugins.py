"""Imports the user's modules that register ops, layouts or models.

One rule for every such option (`--ops-module`, `--model-module`): a
comma-separated list of module names, looked up on the Python path, then in
the current folder (as `python -m` would), then in the folders a run recorded
(so a model dir rebuilds from another folder).
"""

import importlib
import os
import sys
from typing import Dict, Iterable


def import_modules(spec: str, what: str, search: Iterable[str] = ()) -> Dict[str, str]:
  """Imports the modules named in `spec` ("a.b, c").

  Args:
    what: how the option is called in messages ("ops module").
    search: folders to look in after the path and the current folder.

  Returns:
    module name -> the file it was imported from.

  Raises:
    ImportError: naming the module and where it was looked for. An error
      raised inside an existing module (a missing dependency) is raised as is.
  """
  files = {}
  for name in filter(None, (m.strip() for m in (spec or "").split(","))):
    module = _import(name, what, tuple(search))
    files[name] = os.path.abspath(getattr(module, "__file__", "") or "")
  return files


def _import(name: str, what: str, search):
  try:
    return importlib.import_module(name)
  except ModuleNotFoundError as e:
    if e.name != name.split(".")[0] and e.name != name:
      raise  # The module exists; something it imports does not.
  folders = [d for d in (os.getcwd(), *search) if d]
  sys.path[:0] = [d for d in folders if d not in sys.path]
  try:
    return importlib.import_module(name)
  except ModuleNotFoundError as e:
    if e.name != name.split(".")[0] and e.name != name:
      raise
    raise ImportError(
      f"{what} {name!r} not found on the Python path or in {', '.join(folders)}"
    ) from None
