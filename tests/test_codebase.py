"""The codebase's own checks run with the tests: lint, format and types are part of green."""

from __future__ import annotations

import ast
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


JOB_SIDE = [ROOT / "jobs", ROOT / "tests" / "data" / "resumable.py"]  # what runs in a training process


def test_the_job_side_needs_no_python_newer_than_3_8() -> None:
    """It runs in the container's Python 3.8 (TF 2.9): vermin reports any newer syntax or library use."""
    vermin = Path(sys.executable).with_name("vermin")  # installed beside this interpreter by '.[test]'
    command = [str(vermin), "-t=3.8-", "--violations", "--no-tips", *map(str, JOB_SIDE)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_job_side_imports_only_the_standard_library_and_tensorflow() -> None:
    """Nothing is installed into a job's interpreter: tfrun.jobs may use the standard library, TensorFlow
    and numpy (a dependency of TensorFlow), and itself; an example may import its sibling modules."""
    allowed = set(sys.stdlib_module_names) | {"tensorflow", "numpy", "tfrun"}
    client_side = {ROOT / "jobs" / "examples" / "sweep.py"}  # the Python API's example: it submits jobs
    for path in set((ROOT / "jobs").rglob("*.py")) - client_side:
        siblings = {p.stem for p in path.parent.glob("*.py")}
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                assert top in allowed | siblings, f"{path.relative_to(ROOT)} imports {name}"
                if top == "tfrun":
                    assert name.startswith("tfrun.jobs"), f"{path.relative_to(ROOT)} imports {name}"


def test_no_code_outside_the_executors_asks_which_executor_runs_the_jobs() -> None:
    """What an executor can do is said by its `capabilities` and methods (runner/executor.py); an
    `isinstance(..., SomethingExecutor)` elsewhere would put the executor's behaviour in its callers."""
    allowed = {ROOT / "runner" / "executor.py", *(ROOT / "runner" / "slurm").glob("*.py")}
    asked = []
    for folder in ("runner", "client", "tfrun/protocol"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path in allowed:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Call) or getattr(node.func, "id", None) != "isinstance":
                    continue
                if len(node.args) == 2:
                    names = {getattr(n, "id", getattr(n, "attr", "")) for n in ast.walk(node.args[1])}
                    if any(name.endswith("Executor") for name in names):
                        asked.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert asked == [], asked
