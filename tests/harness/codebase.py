"""tfrun's modules as the codebase tests read them: each by its import name, and the tfrun modules each imports."""

from __future__ import annotations

import ast
from pathlib import Path

from .paths import REPO


def tfrun_modules() -> dict[str, Path]:
    """Every module of tfrun by its import name (runner/, client/ and jobs/ are tfrun.runner, .client and .jobs)."""
    found = {}
    for folder in ("runner", "client", "jobs", "tfrun"):
        for path in (REPO / folder).rglob("*.py"):
            parts = path.relative_to(REPO / folder).with_suffix("").parts
            name = ".".join(["tfrun", *([] if folder == "tfrun" else [folder]), *parts])
            found[name.removesuffix(".__init__")] = path
    return found


def imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The tfrun modules `path` imports anywhere in it: in a function and under TYPE_CHECKING too, by name or
    relative to its own package (`from ..records import job` in runner/queue/)."""
    name = next(module for module, where in modules.items() if where == path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found |= {m for m in (module, *(f"{module}.{a.name}" for a in node.names)) if m in modules}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in modules}
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, round the loop (Tarjan's strongly connected components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        for other in graph[name]:
            if other not in index:
                visit(other)
                low[name] = min(low[name], low[other])
            elif other in stack:
                low[name] = min(low[name], index[other])
        if low[name] == index[name]:
            group = [stack.pop()]
            while group[-1] != name:
                group.append(stack.pop())
            if len(group) > 1:
                groups.append(sorted(group))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return sorted(groups)
