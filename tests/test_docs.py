"""The documentation: the mkdocs site builds with --strict (no broken link,
anchor or nav entry), the README stays short, and no page names a path
outside the project."""

import glob
import os
import re
import subprocess
import sys

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
