"""The codebase's own checks run with the tests: lint, format and types are part of green."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "command",
    [
        ["ruff", "check", "."],
        ["ruff", "format", "--check", "."],
        ["mypy"],
    ],
    ids=["ruff-check", "ruff-format", "mypy"],
)
def test_static_checks_pass(command: list[str]) -> None:
    result = subprocess.run([sys.executable, "-m", *command], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr


def test_installing_tfrun_puts_no_client_runner_or_jobs_package_on_the_path(tmp_path: Path) -> None:
    """The design card's folders import as tfrun.client, tfrun.runner, tfrun.jobs and nothing else."""
    probe = "import importlib.util as u; print([n for n in ('client', 'runner', 'jobs') if u.find_spec(n)])"
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "[]", result.stderr


def test_the_shim_imports_nothing_heavy() -> None:
    """The shim starts once per job and must stay cheap: no click, rich, asyncio or sqlite in it."""
    probe = (
        "import sys, tfrun.runner.shim; "
        "print(sorted(m for m in ('click', 'rich', 'asyncio', 'sqlite3', 'tfrun.protocol') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "[]", result.stderr


def test_the_ci_script_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    command = [line for line in ci if line.strip() and not line.startswith("#")][-1]
    assert command.strip() in (ROOT / "README.md").read_text()
