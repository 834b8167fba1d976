"""The house in layers: no loop of imports, no verb reaching into another, and runner/ on floors that each import
only those below (the order a newcomer reads it in, held here)."""

from __future__ import annotations

import ast
import re
import sys

import pytest
from harness.codebase import cycles, imports, tfrun_modules
from harness.paths import REPO

from tfrun.runner.home import SHIM_CORE_MODULES


def test_no_modules_import_each_other_round_a_loop() -> None:
    """A loop of imports (lazy ones too: they only hide it) makes a newcomer read every module in it to change
    one; a package's own __init__ imported by its modules is no loop."""
    modules = tfrun_modules()
    graph = {name: {m for m in imports(path, modules) if m != name and not name.startswith(f"{m}.")}
             for name, path in modules.items()}  # fmt: skip
    assert cycles(graph) == []


def test_no_verb_imports_another_verb() -> None:
    """A verb is a thin command over the client's library: what two verbs share (a pool's view, a followed log,
    a page opened in the browser) is a module of client/, not a verb another verb reaches into."""
    modules = tfrun_modules()
    verbs = {name for name in modules if name.startswith("tfrun.client.cli.verbs.")}
    crossing = {verb: sorted(imports(modules[verb], modules) & (verbs - {verb})) for verb in verbs}
    assert {verb: found for verb, found in crossing.items() if found} == {}


# Each side from the ground up: a floor imports only the floors below it (and itself, within one part).
FLOORS = {
    "runner": (
        ("faults.py", "home.py"),
        ("shim/",),
        ("logs/",),
        ("records/",),
        ("metrics/",),
        ("gpus/",),
        ("alerts/",),
        ("workdir/",),
        ("storage/",),
        ("executors/",),
        ("services/",),
        ("queue/",),
        ("doctor.py",),
        ("config/",),
        ("limits.py", "housekeeping.py"),
        ("handlers/",),
        ("daemon.py",),
        ("cli.py",),
        ("__main__.py",),
    ),
    "client": (
        ("errors.py",),
        ("config/",),
        ("calls/",),
        ("link/",),
        ("views/",),
        ("files/",),
        ("library/",),
        ("pools/",),
        ("install/",),
        ("ui/",),
        ("cli/",),
        ("__main__.py",),
    ),
}


def _part(side: str, module: str) -> str:
    """The part of runner/ or client/ a module of it is in: its folder (`shim/`) or its own file (`daemon.py`)."""
    path = tfrun_modules()[module].relative_to(REPO / side)
    return f"{path.parts[0]}/" if len(path.parts) > 1 else path.name


@pytest.mark.parametrize("side", sorted(FLOORS))
def test_each_side_stands_in_floors_each_importing_only_those_below(side: str) -> None:
    """A newcomer reads runner/ and client/ from the ground up, and a change to a part reaches only the floors
    above it: no import runs back up (a TYPE_CHECKING one neither: a type is a dependency). Where a lower part
    needs something of a higher one, it says what in its own terms (a Protocol: alerts' AlertConfig, queue's
    QueueConfig, logs' LoggedJob), and the higher part hands it down."""
    floor = {part: number for number, parts in enumerate(FLOORS[side]) for part in parts}
    found = sorted(f"{p.name}/" if p.is_dir() else p.name for p in (REPO / side).iterdir()
                   if (p / "__init__.py").exists() or (p.suffix == ".py" and p.name != "__init__.py"))  # fmt: skip
    assert found == sorted(floor), f"every part of {side}/ is on one floor of FLOORS"
    modules = tfrun_modules()
    upward = []
    for name, path in modules.items():
        if not name.startswith(f"tfrun.{side}."):
            continue
        part = _part(side, name)
        for imported in imports(path, modules):
            if imported.startswith(f"tfrun.{side}."):
                other = _part(side, imported)
                if other != part and floor[other] >= floor[part]:
                    upward.append(f"{path.relative_to(REPO)} imports {imported} ({other} is not below {part})")
    assert upward == []


@pytest.mark.parametrize("side", sorted(FLOORS))
def test_each_side_s_docstring_lists_its_floors_in_this_order(side: str) -> None:
    """runner/__init__.py and client/__init__.py are where a newcomer starts: each numbered list is FLOORS'."""
    doc = ast.get_docstring(ast.parse((REPO / side / "__init__.py").read_text())) or ""
    listed = [tuple(re.findall(r"[\w.]+/|[\w.]+\.py", line.split(": ")[0]))
              for line in doc.splitlines() if re.match(r"\d+\. ", line)]  # fmt: skip
    assert listed == list(FLOORS[side])


def test_the_shim_stands_on_the_standard_library_alone() -> None:
    """runner/shim/ is what runs beside each job (its shim, a Slurm task by its path), from a copy of its own
    made at the daemon's start (runner/home.py install_shim_pythonpath): the standard library and the few modules
    of tfrun/ copied with it, nothing else of tfrun and nothing installed."""
    allowed = {"tfrun", *(f"tfrun.{name.removesuffix('.py')}" for name in SHIM_CORE_MODULES if name != "__init__.py")}
    outside = []
    for path in sorted((REPO / "runner" / "shim").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [f"{'.' * node.level}{node.module or ''}"]
            for name in names:
                if (name.startswith(".") and not name.startswith("..")) or name.startswith("tfrun.runner.shim."):
                    continue  # a module of shim/ itself
                if name in allowed or name.split(".")[0] in sys.stdlib_module_names:
                    continue
                outside.append(f"{path.name}: {name}")
    assert outside == []


# Files run by their path, not imported as modules of the package: a user's script (the examples), the doctor's
# TensorFlow probe, a --tty job's wrapper, a Slurm task's launcher. A relative import has no package there.
RUN_BY_PATH = ("jobs/examples/*.py", "jobs/probe.py", "runner/executors/ttyjob.py", "runner/shim/slurmtask.py")


def test_a_file_run_by_its_path_imports_tfrun_by_name() -> None:
    """Inside the mapped folders modules name their neighbours relatively; a file run by its path cannot (the
    README's demo failed with "attempted relative import with no known parent package" when one did)."""
    files = [path for pattern in RUN_BY_PATH for path in sorted(REPO.glob(pattern))]
    trees = {path: ast.parse(path.read_text()) for path in files}
    relative = [f"{path.relative_to(REPO)}:{node.lineno}" for path, tree in trees.items() for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.level]  # fmt: skip
    assert relative == []
