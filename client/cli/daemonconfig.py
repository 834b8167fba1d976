"""What `tfrun config` prints: the box's daemon config as tfrund uses it, and what a change did.

The text form is TOML, as config.toml itself is written (a key's source, when it is not the file, in a
comment after it), so a line can be copied into the file; `--json` gives the values typed, with their
sources beside them.
"""

from __future__ import annotations

import json
from typing import Any

import click

from tfrun.constants import CONFIG_FILE
from tfrun.protocol.admin import ConfigReply

from ..views import render


def values(reply: ConfigReply) -> dict[str, Any]:
    """The settings as nested JSON values: {"notify": [...], "alerts": {"cooldown": "15m", ...}}."""
    out: dict[str, Any] = {}
    for setting in reply.settings:
        *tables, leaf = setting.key.split(".")
        node = out
        for table in tables:
            node = node.setdefault(table, {})
        node[leaf] = json.loads(setting.value)
    return out


def as_json(reply: ConfigReply) -> str:
    record: dict[str, Any] = {"path": reply.path, "values": values(reply)}
    record["sources"] = {setting.key: setting.source for setting in reply.settings}
    if reply.changes:
        record["changes"] = reply.changes
    return render.to_json(record)


def show(reply: ConfigReply) -> None:
    """The config as TOML: top-level keys, then each table; a key not from the file says where it is from."""
    click.echo(f"# tfrund's config: {reply.path}")
    table = ""
    for setting in reply.settings:
        here, _, leaf = setting.key.rpartition(".")
        if here != table:
            click.echo(f"\n[{here}]")
            table = here
        # JSON's strings, numbers and arrays are TOML's too
        line = f"{leaf} = {json.dumps(json.loads(setting.value), ensure_ascii=False)}"
        click.echo(line if setting.source == CONFIG_FILE else f"{line}  # {setting.source}")


def changed(reply: ConfigReply, what: str) -> None:
    """What was done to the file ("set notify in", "reloaded"), then each key that changed and from when."""
    done = f"{what} {reply.path}"
    click.echo(done if reply.changes else f"{done}: nothing changed")
    for line in reply.changes:
        click.echo(f"  {line}")
