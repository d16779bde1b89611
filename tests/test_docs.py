"""The documentation: the mkdocs site builds with --strict (no broken link,
anchor or nav entry), the README stays short, and no page names a path
outside the project."""

import argparse
import glob
import os
import re
import subprocess
import sys
from typing import List

import pytest

from tests.helpers import ROOT

README = os.path.join(ROOT, "README.md")


def test_the_site_builds_with_strict(tmp_path):
  r = subprocess.run(
    [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
    env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
  )
  assert r.returncode == 0, r.stdout + r.stderr
  assert os.path.exists(tmp_path / "site" / "index.html")


def test_the_readme_is_short_and_no_page_names_a_path_outside_the_project():
  assert len(open(README).read().splitlines()) <= 250
  for path in [README] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))):
    text = open(path).read()
    if path != README:
      text = re.sub(r"\]\([^)\s]*\)", "]()", text)  # a page's links to other pages
    assert "/work/" not in text, path
    assert not re.search(r"(?<![\w.])\.\./", text), (path, re.findall(r"\S*\.\./\S*", text))


def _helpless_options(main, argv, monkeypatch) -> List[str]:
  """The options without help of the parsers that `main(argv + ["--help"])`
  shows (a pre-parser without its own --help is not shown)."""
  found, original = [], argparse.ArgumentParser.parse_known_args  # parse_args calls it.

  def parse(parser, args=None, namespace=None):
    if parser.add_help:
      found.extend(a.option_strings[0] for a in parser._actions if a.option_strings and not a.help)
    return original(parser, args, namespace)

  with monkeypatch.context() as patched, pytest.raises(SystemExit) as stop:
    patched.setattr(argparse.ArgumentParser, "parse_known_args", parse)
    main([*argv, "--help"])
  assert stop.value.code == 0, argv
  return found


def _commands(main, capsys) -> List[str]:
  """The commands of a command line, as its own usage lists them."""
  with pytest.raises(SystemExit):
    main(["--help"])
  line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("commands: ")]
  return line[0][len("commands: ") :].split(", ")


def test_every_option_of_every_command_says_what_it_does(monkeypatch, capsys):
  from benchmarks import run as benchmarks  # pylint: disable=g-import-not-at-top
  from pipelines import cli as prep_cli, demo  # pylint: disable=g-import-not-at-top
  from train import cli as train_cli  # pylint: disable=g-import-not-at-top

  runs = [(m.main, [c]) for m in (prep_cli, train_cli) for c in _commands(m.main, capsys)]
  runs += [(benchmarks.main, []), (demo.main, [])]
  assert len(runs) > 10
  helpless = {
    " ".join([main.__module__, *argv]): _helpless_options(main, argv, monkeypatch)
    for main, argv in runs
  }
  assert not any(helpless.values()), {k: v for k, v in helpless.items() if v}
