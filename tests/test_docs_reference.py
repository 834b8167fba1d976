"""The reference pages (docs/reference/*.md) are what docs/reference/generate.py makes of the code now, and they cover
it: every verb and option of the CLI, every config key of the client and of tfrund, the API's names, every alert
rule, exit code and file of a job's folder. A page left stale by a change to the code fails here."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import re
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import click
import pytest
from harness.paths import REPO

REFERENCE = REPO / "docs" / "reference"
RUN_IT = "run .venv/bin/python docs/reference/generate.py"


@pytest.fixture(scope="module")
def generator() -> ModuleType:
    """docs/reference/generate.py, loaded as a module (it is a script, not a package)."""
    spec = importlib.util.spec_from_file_location("docs_reference_generate", REFERENCE / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # where its dataclasses look themselves up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pages(generator: ModuleType) -> dict[str, str]:
    made: dict[str, str] = generator.pages()
    return made


def _page(name: str) -> str:
    return (REFERENCE / name).read_text()


def test_the_committed_pages_are_what_the_generator_writes_now(pages: dict[str, str]) -> None:
    assert sorted(pages) == sorted(path.name for path in REFERENCE.glob("*.md")), RUN_IT
    for name, text in pages.items():
        assert (REFERENCE / name).exists(), f"docs/reference/{name} is missing: {RUN_IT}"
        assert _page(name) == text, f"docs/reference/{name} is stale: {RUN_IT}"


def test_a_change_to_a_verbs_help_makes_its_page_stale(generator: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison above sees a change to the code: a word added to submit's help changes cli.md."""
    from tfrun.client.cli.verbs.submit import submit

    assert submit.help is not None
    monkeypatch.setattr(submit, "help", submit.help.replace("detached job", "detached, stale job", 1))
    made: str = generator.cli_page()
    assert made != _page("cli.md")
    assert "detached, stale job" in made


def _commands() -> Iterator[tuple[list[str], click.Command]]:
    """Every command of tfrun and tfrund with its path, walked here apart from the generator's own walk."""
    from tfrun.client.cli.main import main as tfrun_main
    from tfrun.runner.cli import main as tfrund_main

    def walk(command: click.Command, path: list[str]) -> Iterator[tuple[list[str], click.Command]]:
        yield path, command
        if isinstance(command, click.Group):
            context = click.Context(command)
            for name in command.list_commands(context):
                sub = command.get_command(context, name)
                assert sub is not None
                yield from walk(sub, [*path, name])

    yield from walk(tfrun_main, ["tfrun"])
    yield from walk(tfrund_main, ["tfrund"])


def _sections(text: str) -> dict[str, str]:
    """cli.md's sections by heading (## or ###), each up to the next heading."""
    found: dict[str, str] = {}
    parts = re.split(r"^#{2,3} (.+)$", text, flags=re.M)
    for heading, body in zip(parts[1::2], parts[2::2]):
        assert heading not in found, f"cli.md has two sections {heading!r}"
        found[heading] = body
    return found


def test_every_verb_and_every_option_is_on_cli_md() -> None:
    sections = _sections(_page("cli.md"))
    verbs = 0
    for path, command in _commands():
        heading = " ".join(path[1:]) if path[0] == "tfrun" and len(path) > 1 else " ".join(path)
        assert heading in sections, f"cli.md has no section for {' '.join(path)}: {RUN_IT}"
        section = sections[heading]
        for param in command.params:
            if isinstance(param, click.Option):
                for opt in [*param.opts, *param.secondary_opts]:
                    assert re.search(rf"(`|<code>)[^`<]*(?<![\w-]){re.escape(opt)}(?![\w-])", section), (
                        f"cli.md's {heading} does not show {opt}: {RUN_IT}"
                    )
            else:
                assert f"`{param.human_readable_name}" in section or f"`[{param.human_readable_name}" in section, (
                    f"cli.md's {heading} does not show its argument {param.human_readable_name}: {RUN_IT}"
                )
        verbs += path[0] == "tfrun" and len(path) == 2
    assert verbs >= 30
    assert "## submit" in _page("cli.md") and "### hosts add" in _page("cli.md")  # cli.md#submit, cli.md#hosts-add


def _schema_keys(schema: dict[Any, Any], prefix: str = "") -> Iterator[str]:
    from tfrun import tomltext

    for name, inner in schema.items():
        shown = "NAME" if name is tomltext.ANY else name
        if isinstance(inner, dict):
            yield from _schema_keys(inner, f"{prefix}{shown}.")
        else:
            yield f"{prefix}{shown}"


def test_every_config_key_is_on_config_md() -> None:
    from tfrun.client.config import settings as client_settings
    from tfrun.runner.config import settings as daemon_settings

    page = _page("config.md")
    client = list(_schema_keys(client_settings._schema()))
    assert "hosts.NAME.destination" in client and "pools.NAME.checkpoints_to" in client
    for key in [*client, *daemon_settings.KEYS]:
        assert f"| `{key}` |" in page, f"config.md has no row for the key {key}: {RUN_IT}"


def test_the_other_pages_cover_what_the_code_declares() -> None:
    import tfrun
    from tfrun import constants
    from tfrun.runner.alerts import rules
    from tfrun.runner.shim import jobdir

    api = _page("api.md")
    jobs = importlib.import_module("tfrun.jobs")  # its names load lazily, and TensorFlow with them: not here
    for name in [*getattr(tfrun, "_API"), *jobs.__all__]:  # noqa: B009 - the lazy table, not a public name
        assert re.search(rf"\b{name}\b", api), f"api.md does not show {name}: {RUN_IT}"
    exits = _page("exit-codes.md")
    for name in dir(constants):
        if name.startswith("EXIT_"):
            assert f"| `{getattr(constants, name)}` | `{name}` |" in exits, f"exit-codes.md lacks {name}: {RUN_IT}"
    alerts = _page("alert-rules.md")
    for rule in rules.RULES:
        assert re.search(rf"\| `{re.escape(rule)}[`\[]", alerts), f"alert-rules.md lacks the rule {rule}: {RUN_IT}"
    files = _page("files.md")
    for name, value in vars(jobdir).items():
        if name.isupper() and isinstance(value, str):
            assert re.search(rf"\| `{re.escape(value)}/?` \|", files), f"files.md lacks {value}: {RUN_IT}"
    assert "| `metrics.jsonl` |" in files and "| `tfrun.db` |" in files


def test_the_job_options_table_has_every_field() -> None:
    from tfrun.protocol.submit import JobOptions

    api = _page("api.md")
    for field in dataclasses.fields(JobOptions):
        assert f"| `{field.name}` |" in api, f"api.md's JobOptions lacks {field.name}: {RUN_IT}"


def test_the_pages_link_only_to_pages_that_exist_or_will() -> None:
    """Links between reference pages name pages that exist; those to other areas name the site's pages."""
    for path in REFERENCE.glob("*.md"):
        for target in re.findall(r"\]\(([^)#:]+\.md)(?:#[^)]*)?\)", path.read_text()):
            assert (path.parent / target).resolve().is_relative_to(REPO / "docs"), (path.name, target)
            if "/" not in target:
                assert (REFERENCE / target).exists(), f"{path.name} links to {target}, which does not exist"


def test_each_page_opens_with_a_title_and_an_intro() -> None:
    for path in sorted(REFERENCE.glob("*.md")):
        lines = path.read_text().splitlines()
        assert lines[0].startswith("# "), path.name
        intro = next(line for line in lines[1:] if line and not line.startswith("<!--"))
        assert not intro.startswith(("#", "|", "```")), f"{path.name} opens with no intro paragraph"
