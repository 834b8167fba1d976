"""`tfrun config` and `doctor`: the box's daemon config, shown, set, unset and reloaded (rendered by
client/cli/daemonconfig.py), and the box checked for training as its daemon sees it."""

from __future__ import annotations

import sys
from typing import Optional

import click

from tfrun.constants import EXIT_FAILURE, EXIT_OK
from tfrun.protocol.admin import ConfigReply

from ...calls import Call, admin
from ...views import render, reports
from .. import daemonconfig, hostoptions
from .. import main as cli


@click.group("config", invoke_without_command=True)
@hostoptions.host_options
@click.option("--json", "as_json", is_flag=True, help="Print path, values and sources as JSON.")
@click.option("--show-secrets", is_flag=True, help="Show notify URLs whole, not masked past their host.")
@click.pass_context
def config_verb(ctx: click.Context, as_json: bool, show_secrets: bool) -> None:
    """The box's daemon config (config.toml in tfrund's TFRUN_HOME): show it, change it, reload it.

    Without a command: every setting as tfrund uses it now, as TOML, with where it came from when that is
    not the file (the default, or a TFRUN_* variable in tfrund's environment); notify URLs masked past their
    scheme and host (json://hooks.example.com/***) unless --show-secrets.

    Every change applies without a restart, and says from when: notify, gpus, max_cpu_jobs, name (the box's
    name in its alerts and top; default its hostname) and the alert cooldown at once (notify for the alerts
    of jobs already running too); job_python, checkpoint_root, default_gpus and the alert rules for jobs
    submitted from then on. Only what tfrund reads from its
    environment at start (TFRUN_HOME: its state and socket; the TFRUN_* overrides) needs `tfrund stop`.

    \b
    Examples:
      tfrun config                                what tfrund uses now (--json for scripts)
      tfrun config --show-secrets                 the notify URLs whole
      tfrun config set notify 'mailtos://me:app-password@smtp.example.com?to=me@example.com'
      pass show tfrun-alerts | tfrun config set notify -   the URLs from stdin, one a line: off the
                                                  command line, which every user's ps shows
      tfrun config set alerts.rules oom failed stall=1h
      tfrun config set max_cpu_jobs 2
      tfrun config --host box2 set name box2      box2's alerts say "on box2", not its container's id
      tfrun config unset max_cpu_jobs             back to its default
      tfrun config reload                         after editing config.toml by hand (or: kill -HUP tfrund)
    """
    if ctx.invoked_subcommand is not None:
        return
    reply = cli.call(admin.config(show_secrets))
    if as_json:
        click.echo(daemonconfig.as_json(reply))
    else:
        daemonconfig.show(reply)


@config_verb.command("set", context_settings={"ignore_unknown_options": True})
@hostoptions.host_options
@click.argument("key")
@click.argument("values", nargs=-1, required=True, metavar="VALUE...", type=click.UNPROCESSED)
@click.option("--json", "as_json", is_flag=True, help="Print path, changes, values and sources as JSON.")
def config_set(key: str, values: tuple[str, ...], as_json: bool) -> None:
    """Set KEY in the box's config.toml to VALUE, then reload it. Only KEY's lines change, comments stay,
    and the whole would-be file is checked first: a value tfrund would refuse changes nothing.

    KEY is a key of the file, TABLE.KEY inside a table (alerts.cooldown); `tfrun config` lists them. A
    list (notify, gpus, alerts.rules, alerts.metric_patterns, slurm.sbatch_options) takes each VALUE as an
    item, replacing the list. A VALUE may begin with a dash: `tfrun config set slurm.sbatch_options
    --qos=high --constraint=a100`.

    VALUE `-` alone reads the values from stdin, one a line (# comments): a notify URL with a password or a
    token in it then never sits on the command line, which every user of the machine can read (ps)."""
    given = cli.lines_of("-", "VALUE") if values == ("-",) else list(values)
    _config_change(admin.set_config(key, given), as_json, f"set {key} in")


@config_verb.command("unset")
@hostoptions.host_options
@click.argument("key")
@click.option("--json", "as_json", is_flag=True, help="Print path, changes, values and sources as JSON.")
def config_unset(key: str, as_json: bool) -> None:
    """Remove KEY from the box's config.toml, back to its default, then reload it."""
    _config_change(admin.unset_config(key), as_json, f"unset {key} in")


@config_verb.command("reload")
@hostoptions.host_options
@click.option("--json", "as_json", is_flag=True, help="Print path, changes, values and sources as JSON.")
def config_reload(as_json: bool) -> None:
    """Read the box's config.toml again and use it now (as SIGHUP to tfrund does); say what changed and from
    when. A file tfrund cannot use is refused with its line, and the running config stays."""
    _config_change(admin.reload_config(), as_json, "reloaded")


def _config_change(change: Call[ConfigReply, ConfigReply], as_json: bool, what: str) -> None:
    reply = cli.call(change)
    if as_json:
        click.echo(daemonconfig.as_json(reply))
    else:
        daemonconfig.changed(reply, what)


@click.command()
@hostoptions.host_options
@click.option("--python", metavar="PATH", help="Check this job interpreter on the box (default: the one jobs get).")
@click.option("--json", "as_json", is_flag=True, help="Print the checks as a JSON list.")
def doctor(python: Optional[str], as_json: bool) -> None:
    """Check the box for training, as its daemon sees it: the job interpreter and its TensorFlow (built
    with CUDA, GPUs seen, memory growth), the NVIDIA driver and CUDA version from nvidia-smi, the
    checkpoint root (writable, free space), and the box's object storage ([storage] checkpoints_to) where it
    names one. Each line passes or says what to do; exits 1 if any fails. A box without GPUs gets warnings,
    not failures."""
    host = cli.target().host
    checks = cli.call(admin.doctor(python or (host.python if host else None)))
    if as_json:
        click.echo(render.to_json(checks))
    else:
        reports.check_lines(checks, cli.output())
    sys.exit(EXIT_FAILURE if any(check.status == "fail" for check in checks) else EXIT_OK)
