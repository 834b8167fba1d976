"""The documentation: docs/ builds as a site with `mkdocs build --strict` (no broken link or anchor, every page in
the nav), and the README's links into it name pages and headings that exist. The README stays short: what tfrun
is, the two commands for a fresh machine, local use, a remote box, the container, and links (issue 30)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from harness.paths import REPO

README_MAX_BYTES = 25_000


def _slug(heading: str) -> str:
    """A heading's anchor as both GitHub and MkDocs' toc write it: lower case, punctuation dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    """The anchors of a Markdown page's headings (outside code fences)."""
    found, fence = set(), False
    for line in page.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
        elif not fence and (heading := re.match(r"#{1,6} (.*)", line)):
            found.add(_slug(heading[1]))
    return found


def test_the_docs_build_as_a_site_with_no_broken_link(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="mkdocs is in the test extra (pip install -e '.[test]')")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "how-to" / "slurm" / "index.html").exists()


def test_the_docs_build_with_zensical_too(tmp_path: Path) -> None:
    """Material for MkDocs' authors announced its end and a successor that reads mkdocs.yml: the site stays buildable
    by it, strictly (a broken link or anchor fails it too), so that the move is a change of command."""
    pytest.importorskip("zensical", reason="zensical is in the test extra (pip install -e '.[test]')")
    shutil.copytree(REPO / "docs", tmp_path / "docs")  # Zensical builds the docs under its config's folder:
    shutil.copy(REPO / "mkdocs.yml", tmp_path)  # a copy of both, so that nothing is written into the checkout
    command = [sys.executable, "-m", "zensical", "build", "--strict"]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "index.html").exists()


def test_the_readmes_links_into_docs_name_pages_and_headings_that_exist() -> None:
    readme = (REPO / "README.md").read_text()
    links = re.findall(r"\]\((docs/[^)#]*)(?:#([^)]*))?\)", readme)
    assert len(links) >= 10, links
    for target, anchor in links:
        page = REPO / target
        assert page.exists(), f"README.md links to {target}, which does not exist"
        if anchor:
            assert anchor in _anchors(page), f"README.md links to {target}#{anchor}, a heading it does not have"
    for local in re.findall(r"\]\(#([^)]*)\)", readme):
        assert local in _anchors(REPO / "README.md"), f"README.md links to #{local}, a heading it does not have"


def test_the_readme_is_short() -> None:
    assert len((REPO / "README.md").read_bytes()) <= README_MAX_BYTES
