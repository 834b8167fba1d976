"""The codebase's own checks run with the tests: lint, format and types are part of green."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
from harness.codebase import tfrun_modules
from harness.paths import DATA, REPO

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.9 and 3.10
    import tomli as tomllib


@pytest.mark.parametrize(
    "command",
    [
        ["ruff", "check", "."],
        ["ruff", "format", "--check", "."],
        [".ci/typecheck"],
        [".ci/typecheck", "tests"],
        [".ci/typecheck", "bench"],
    ],
    ids=["ruff-check", "ruff-format", "mypy", "mypy-tests", "mypy-bench"],
)
def test_static_checks_pass(command: list[str]) -> None:
    """ruff, and mypy through .ci/typecheck (the package as it installs: runner/ is tfrun.runner, and so on)."""
    argv = [sys.executable, *command] if command[0].startswith(".ci/") else [sys.executable, "-m", *command]
    result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr


def test_installing_tfrun_puts_no_client_runner_or_jobs_package_on_the_path(tmp_path: Path) -> None:
    """The design card's folders import as tfrun.client, tfrun.runner, tfrun.jobs and nothing else."""
    probe = "import importlib.util as u; print([n for n in ('client', 'runner', 'jobs') if u.find_spec(n)])"
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "[]", result.stderr


def test_the_build_lists_every_package_of_the_source_folders() -> None:
    """pyproject.toml maps runner/, client/ and jobs/ to tfrun.runner, .client and .jobs, and setuptools finds no
    package in a mapped folder: each is listed, and a new one missing from the list would be missing from the
    wheel (and from a box that `hosts install` set up from it)."""
    listed = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    found = []
    for folder in ("tfrun", "runner", "client", "jobs"):
        for init in (REPO / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(REPO).parts
            found.append(".".join(parts if folder == "tfrun" else ("tfrun", *parts)))
    assert sorted(listed) == sorted(found)


def test_every_path_the_code_and_the_docs_name_is_there() -> None:
    """A module named by its path in a docstring, a comment or a page (`runner/queue/scheduler.py`) is where a
    reader goes next: after the moves of issue 47, a name left at an old path sends them nowhere. CHANGELOG.md
    tells history, and the published scripts of tests/data are kept as their authors wrote them."""
    named = re.compile(r"(?<![\w/.-])((?:runner|client|tfrun|jobs|tests|bench|container|docs)/[\w/.-]*\w\.(?:py|md))\b")
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    missing = []
    for name in tracked.splitlines():
        path = REPO / name
        if name == "CHANGELOG.md" or DATA in path.parents or not name.endswith((".py", ".md", ".toml", ".yml")):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            missing += [f"{name}:{number}: {found}" for found in named.findall(line) if not (REPO / found).exists()]
    assert missing == []


def test_every_import_written_in_a_string_or_a_page_names_what_is_there() -> None:
    """An import in a `python -c` string of a test, in a docstring or in a page: no tool rewrites those when a
    module moves, and each fails only where it runs (test_link's named the ssh module's old place after issue 47)."""
    written = re.compile(r"(?:from (tfrun(?:\.\w+)*) import ([\w, ]+)|import (tfrun(?:\.\w+)+))")
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    missing = []
    for name in tracked.splitlines():
        path = REPO / name
        if name == "CHANGELOG.md" or DATA in path.parents or not name.endswith((".py", ".md")):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for module, names, plain in written.findall(line):
                named = [n.split(" as ")[0].strip() for n in names.split(",")]
                wanted = [plain] if plain else [f"{module}.{n}" for n in named if n]
                missing += [f"{name}:{number}: {w}" for w in wanted if not _importable(w)]
    assert missing == []


def _importable(dotted: str) -> bool:
    """Whether `dotted` is a module of tfrun, or a name a module of it defines (found without running it)."""
    try:
        if importlib.util.find_spec(dotted) is not None:
            return True
    except ModuleNotFoundError:
        pass  # a name in a module, not a module of a package
    module, _, attribute = dotted.rpartition(".")
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        return False
    if spec is None or spec.origin is None:
        return False
    tree = ast.parse(Path(spec.origin).read_text())
    defined = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.ImportFrom):
            defined |= {a.asname or a.name for a in node.names}
    if "__getattr__" in defined:  # names handed out on first use (PEP 562): the ones its tables spell
        defined |= {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    return attribute in defined


def test_the_shim_imports_nothing_heavy() -> None:
    """The shim starts once per job and must stay cheap: no click, rich, asyncio or sqlite in it."""
    probe = (
        "import sys, tfrun.runner.shim.supervise; "
        "print(sorted(m for m in ('click', 'rich', 'asyncio', 'sqlite3', 'tfrun.protocol') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "[]", result.stderr


def test_the_ci_script_runs_the_readme_test_command() -> None:
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()
    command = [line for line in ci if line.strip() and not line.startswith("#")][-1]
    assert command.strip() in (REPO / "README.md").read_text()


JOB_SIDE = [REPO / "jobs", REPO / "tests" / "data" / "resumable.py"]  # what runs in a training process


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
    client_side = {REPO / "jobs" / "examples" / "sweep.py"}  # the Python API's example: it submits jobs
    for path in set((REPO / "jobs").rglob("*.py")) - client_side:
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
                assert top in allowed | siblings, f"{path.relative_to(REPO)} imports {name}"
                if top == "tfrun":
                    assert name.startswith("tfrun.jobs"), f"{path.relative_to(REPO)} imports {name}"


def test_no_code_outside_the_executors_asks_which_executor_runs_the_jobs() -> None:
    """What an executor can do is said by its `capabilities` and methods (runner/executors/executor.py); an
    `isinstance(..., SomethingExecutor)` elsewhere would put the executor's behaviour in its callers."""
    allowed = set((REPO / "runner" / "executors").rglob("*.py"))
    asked = []
    for folder in ("runner", "client", "tfrun/protocol"):
        for path in sorted((REPO / folder).rglob("*.py")):
            if path in allowed:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Call) or getattr(node.func, "id", None) != "isinstance":
                    continue
                if len(node.args) == 2:
                    names = {getattr(n, "id", getattr(n, "attr", "")) for n in ast.walk(node.args[1])}
                    if any(name.endswith("Executor") for name in names):
                        asked.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert asked == [], asked


def _raw_requests(tree: ast.AST, requests: set[str]) -> list[int]:
    """The lines of `tree` that send a request past client/calls/: an `ask(` call, or a request class of
    tfrun/protocol/ imported (to build one, for any way of sending it)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "ask":
            found.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tfrun.protocol"):
            found += [node.lineno for alias in node.names if alias.name in requests]
    return sorted(set(found))


def test_no_verb_sends_a_raw_request() -> None:
    """The CLI stands on the client library: a verb sends what a typed call of client/calls/ builds, through
    `cli.call` or the API, so each request is built in one place for the CLI and the API alike."""
    import importlib

    from tfrun.protocol.wire import _REGISTRY, Request

    for path in (REPO / "tfrun" / "protocol").glob("*.py"):  # each registers its messages when imported
        importlib.import_module(f"tfrun.protocol.{path.stem}")
    requests = {cls.__name__ for cls in _REGISTRY.values() if issubclass(cls, Request)}
    assert {"Submit", "ListJobs", "GetConfig"} <= requests
    raw = [f"{path.relative_to(REPO)}:{line}" for path in sorted((REPO / "client" / "verbs").glob("*.py"))
           for line in _raw_requests(ast.parse(path.read_text()), requests)]  # fmt: skip
    assert raw == []


def test_the_raw_request_check_sees_each_way_of_sending_one() -> None:
    sent = "from tfrun.protocol.jobs import Job, ListJobs\nx = cli.ask(y)\ncli.each(z, t)\nawait c.ask(r)\n"
    assert _raw_requests(ast.parse(sent), {"ListJobs"}) == [1, 2, 4]
    assert (
        _raw_requests(ast.parse("from tfrun.protocol.jobs import Job\nx = cli.call(jobs.job('3'))\n"), {"ListJobs"})
        == []
    )


def test_no_module_reads_a_number_with_isdigit() -> None:
    """`str.isdigit` says yes to "²", which `int` refuses, and to "١٢": a number in text is tfrun/numerals.py's
    `is_digits` (ASCII digits), or shim/slurmtask.py's copy of it (that file imports nothing of tfrun)."""
    allowed = {"tfrun.numerals", "tfrun.runner.shim.slurmtask"}
    found = [name for name, path in tfrun_modules().items() if name not in allowed and ".isdigit()" in path.read_text()]
    assert found == []


def test_no_browser_test_reads_an_element_it_found_earlier() -> None:
    """The pages redraw their parts as news comes: an element found by one call and read by the next is stale
    by then in one run of many (CI's job page, its record redrawn between the find and `.text`). A browser
    test reads with harness/browser.py's text_of/attribute_of (found and read in one script) and clicks with
    its click (found again when redrawn)."""
    reads = re.compile(r"\.text\b|\.get_attribute\(|\]\.click\(\)|find_element\(")
    found = [f"{path.name}:{number}" for path in sorted((REPO / "tests").glob("test_ui*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1) if reads.search(line)]  # fmt: skip
    assert found == []


# What a test module uses that says which marker (pyproject.toml's markers) it must carry, so that `-m "not
# ssh"` and the like leave it out: an import of one of these modules of tests/harness/, or a use of one of
# these names (the session's sshd fixture, an Sshd of its own, a box's sshd, a remote client).
NEEDS_BY_IMPORT = {
    "harness.slurmcluster": "slurm",
    "harness.otheruser": "root",
    "harness.netns": "root",
    "harness.fleetbox": "ssh",
    "harness.podman": "podman",
    "harness.s3server": "s3",
}
NEEDS_BY_NAME = {"sshd": "ssh", "Sshd": "ssh", "box_sshd": "ssh", "remote_client": "ssh"}


def _needed_and_carried_markers(tree: ast.Module) -> tuple[dict[str, str], set[str]]:
    """The markers `tree` needs, each with what it uses that needs it, and the markers it names anywhere
    (`pytestmark`, a test's decorator or a `pytest.param(..., marks=...)`) as `pytest.mark.NAME`."""
    needed: dict[str, str] = {}
    carried: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for name in (node.module, *(f"{node.module}.{alias.name}" for alias in node.names)):
                if name in NEEDS_BY_IMPORT:
                    needed.setdefault(NEEDS_BY_IMPORT[name], f"from {node.module} import ...")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in NEEDS_BY_IMPORT:
                    needed.setdefault(NEEDS_BY_IMPORT[alias.name], f"import {alias.name}")
        elif isinstance(node, ast.arg) and node.arg == "sshd":
            needed.setdefault("ssh", "the sshd fixture")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in NEEDS_BY_NAME:
            needed.setdefault(NEEDS_BY_NAME[node.func.id], f"{node.func.id}(...)")
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "mark"
            and isinstance(node.value.value, ast.Name)
            and node.value.value.id == "pytest"
        ):
            carried.add(node.attr)
    return needed, carried


def _bare_ssh_cases(tree: ast.Module) -> list[int]:
    """The lines where `tf` is parametrized with a plain "ssh" (its case is then unmarked: `-m "not ssh"` would
    keep it), not `pytest.param("ssh", ..., marks=pytest.mark.ssh)`."""
    lines = []
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "parametrize"
        ):
            continue
        if len(node.args) < 2 or not isinstance(node.args[0], ast.Constant) or "tf" not in str(node.args[0].value):
            continue
        if isinstance(node.args[1], (ast.List, ast.Tuple)):
            for case in node.args[1].elts:
                first = case.elts[0] if isinstance(case, ast.Tuple) and case.elts else case
                if isinstance(first, ast.Constant) and first.value == "ssh":
                    lines.append(case.lineno)
    return lines


def test_every_test_module_says_what_it_needs() -> None:
    """A test module that starts an sshd, the Slurm cluster or needs root carries the marker, so that a slice
    such as `-m "not root and not slurm"` (docs/explanation/testing.md) leaves out what this machine cannot do."""
    missing = []
    for path in sorted((REPO / "tests").glob("test_*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        needed, carried = _needed_and_carried_markers(tree)
        missing += [
            f"{path.name}: {why} but no pytest.mark.{mark}" for mark, why in needed.items() if mark not in carried
        ]
        missing += [
            f'{path.name}:{line}: a plain "ssh" case of tf, not pytest.param("ssh", marks=pytest.mark.ssh)'
            for line in _bare_ssh_cases(tree)
        ]
    assert not missing, "\n".join(missing)


def test_the_marker_check_sees_a_missing_marker() -> None:
    """The check above can fail: a module that takes the sshd fixture and imports slurmcluster, unmarked, or
    parametrizes tf with a plain "ssh"."""
    bare = ast.parse("from harness.slurmcluster import slurm_fixture\n\ndef test_x(sshd, slurm):\n    pass\n")
    assert _needed_and_carried_markers(bare) == (
        {"slurm": "from harness.slurmcluster import ...", "ssh": "the sshd fixture"},
        set(),
    )
    marked = ast.parse("import pytest\nfrom harness import netns\npytestmark = [pytest.mark.root]\n")
    assert _needed_and_carried_markers(marked) == ({"root": "from harness import ..."}, {"root"})
    both = 'import pytest\n@pytest.mark.parametrize("tf", ["local", "ssh"], indirect=True)\ndef test_y(tf): ...\n'
    assert _bare_ssh_cases(ast.parse(both)) == [2]
    assert _bare_ssh_cases(ast.parse(both.replace('"ssh"]', 'pytest.param("ssh", marks=pytest.mark.ssh)]'))) == []


def test_each_constant_name_is_defined_in_one_module() -> None:
    """A constant's name means one thing: the values both sides share are in tfrun/constants.py, a module's
    own tuning values beside the code they tune, and no two modules define the same name (three
    `TAIL_BYTES` of three meanings, or one value written twice, as `config.toml`'s name was)."""
    where: dict[str, list[str]] = {}
    for name, path in sorted(tfrun_modules().items()):
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, (ast.Assign, ast.AnnAssign)):
                continue
            targets, value = (node.targets if isinstance(node, ast.Assign) else [node.target]), node.value
            if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "TypeVar":
                continue  # T, M: a type's placeholder, not a constant
            for target in targets:
                if isinstance(target, ast.Name) and target.id.isupper() and not target.id.startswith("_"):
                    where.setdefault(target.id, []).append(name)
    twice = {
        constant: modules for constant, modules in where.items() if len(modules) > 1 and constant != "TYPE_CHECKING"
    }
    assert twice == {}


def test_no_module_is_over_600_lines() -> None:
    """A module holds one job, as long as that job needs: a class is not split across files to meet a count (the
    store was Store(AlertRows) at 400; it is one class again). Past 600 lines a module holds more than one thing,
    and is split where they part. The tests and benches too (what several share is in tests/harness/); the
    published training scripts of tests/data are kept as their authors wrote them."""
    tests = [path for folder in ("tests", "bench") for path in (REPO / folder).rglob("*.py")]
    long = []
    for path in sorted([*tfrun_modules().values(), *(path for path in tests if DATA not in path.parents)]):
        lines = len(path.read_text().splitlines())
        if lines > 600:
            long.append(f"{path.relative_to(REPO)}: {lines}")
    assert long == []
