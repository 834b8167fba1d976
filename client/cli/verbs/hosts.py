"""`tfrun hosts` (list, add, remove, install, check), `tfrun ssh-config` and `tfrun completion`: the boxes
tfrun knows and how it reaches them, and Tab completion."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any, Optional

import click

from tfrun.constants import DEFAULT_BOX_VENV, EXIT_USAGE, WHEELHOUSE_ENV

from ...config import settings as config
from ...errors import TfrunError
from ...views import render
from .. import completion
from .. import main as cli


@click.group()
def hosts() -> None:
    """The boxes tfrun knows (kept in ~/.config/tfrun/config.toml, or TFRUN_CONFIG)."""


@hosts.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the hosts as JSON.")
def hosts_list(as_json: bool) -> None:
    """List configured hosts; the default is marked with *."""
    try:
        cfg = config.load()
    except TfrunError as exc:
        cli.fail(exc.message, exc.exit_code)
    if as_json:
        click.echo(
            render.to_json({"default_host": cfg.default_host, "hosts": {n: h.as_toml() for n, h in cfg.hosts.items()}})
        )
        return
    if not cfg.hosts:
        click.echo("no hosts configured; add one with: tfrun hosts add NAME user@host[:port]")
    for name, host in sorted(cfg.hosts.items()):
        mark = "*" if name == cfg.default_host else " "
        extra = "".join(f" {k}={v}" for k, v in sorted(host.env.items()))
        extra += f" pools={','.join(host.pools)}" if host.pools else ""
        click.echo(f"{mark} {name}  {host.destination}  tfrund={host.tfrund}{extra}")


@hosts.command("add")
@click.argument("name")
@click.argument("destination", required=False)
@click.option("--tfrund", "tfrund_command", metavar="COMMAND", help="tfrund's command on the box (default: tfrund; "
              "hosts install records the one it installs).")  # fmt: skip
@click.option("--python", help="Job interpreter on the box (default: the daemon's).")
@click.option("--identity-file", metavar="PATH", help="The private key to log in with, also on --jump hosts "
              "(default: ~/.ssh/config's IdentityFile, the agent's keys, ~/.ssh/id_*).")  # fmt: skip
@click.option("--jump", metavar="USER@HOST[:PORT][,...]", help="Reach the box through these hosts in turn, "
              "each host key checked (like ssh -J; ProxyJump).")  # fmt: skip
@click.option("--env", "env_pairs", multiple=True, metavar="NAME[=VALUE]", help="Environment for tfrund, e.g. "
              "TFRUN_HOME; repeatable. NAME alone takes its value from your environment, off the command line "
              "(which every user's ps shows).")  # fmt: skip
@click.option("--accept-new-host-key/--no-accept-new-host-key", default=None, help="Trust the box's host key the "
              "first time it is seen (default: no).")  # fmt: skip
@click.option("--default", "make_default", is_flag=True, help="Make it the default host.")
@click.option("--pool", "pools", multiple=True, metavar="POOL", help="Make it a member of POOL (repeatable): "
              "`--host POOL` then means every member, for ps and submit (tfrun pools).")  # fmt: skip
@click.option("--replace", is_flag=True, help="Start an existing NAME over from what is given: its recorded "
              "tfrund, python, env, pools and the rest go.")  # fmt: skip
@click.option("--install", is_flag=True, help="Then install this tfrun on the box and start tfrund there, as tfrun "
              f"hosts install does ({WHEELHOUSE_ENV}=DIR: --offline with the wheels in DIR).")  # fmt: skip
def hosts_add(
    name: str,
    destination: Optional[str],
    tfrund_command: Optional[str],
    python: Optional[str],
    env_pairs: tuple[str, ...],
    accept_new_host_key: Optional[bool],
    make_default: bool,
    replace: bool,
    install: bool,
    identity_file: Optional[str],
    jump: Optional[str],
    pools: tuple[str, ...],
) -> None:
    """Add host NAME reached at DESTINATION (user@host[:port], or a Host of ~/.ssh/config), or change it.

    For a host that exists, only what is given changes, and DESTINATION may be left out: the tfrund that
    `hosts install` recorded, the --env (TFRUN_HOME: which daemon, hence which jobs) and the rest stay, so
    `tfrun hosts add box --python PATH`, as `hosts check` advises, changes the interpreter alone. --env
    NAME=VALUE sets NAME beside the others, --pool joins POOL; --replace starts the host over instead.

    NAME and each POOL need names of their own: a pool named like a host is refused, and `all` (every
    host) and `local` (this machine) are taken.

    \b
    Examples:
      tfrun hosts add box alice@gpu-box --install        add the host and install tfrun there
      tfrun hosts add box2 alice@gpu2 --pool gpu         box2 joins pool gpu: tfrun ps --host gpu
      tfrun hosts add box --python /opt/conda/bin/python  change box's job interpreter, keep the rest
      HF_TOKEN=... tfrun hosts add box --env HF_TOKEN    tfrund gets HF_TOKEN, given off the command line
    """
    from ...pools.members import check_names

    try:
        cfg = config.load()
        check_names(name, pools, cfg)
        current = cfg.hosts.get(name)
        where = destination or (current.destination if current else None)
        if where is None:
            raise TfrunError(
                f"no host {name!r} yet: give its destination, tfrun hosts add {name} USER@HOST", EXIT_USAGE
            )
        config.parse_destination(where)  # one ssh cannot read is refused now, not at every verb that uses it
        old = None if replace else current
        given: dict[str, Any] = {"destination": destination, "tfrund": tfrund_command, "python": python,
                                 "accept_new_host_key": accept_new_host_key,
                                 "identity_file": config.identity_path(identity_file) if identity_file else None,
                                 "jump": config.check_jump(jump) if jump else None}  # fmt: skip
        base = old or config.Host(destination=where, name=name)
        host = dataclasses.replace(
            base,
            **{key: value for key, value in given.items() if value is not None},
            env={**base.env, **cli.parse_env(env_pairs)},
            pools=list(dict.fromkeys([*base.pools, *pools])),
        )
        cfg.hosts[name] = host
        was_default = cfg.default_host == name
        if make_default or cfg.default_host is None:
            cfg.default_host = name
        cfg.save()
    except TfrunError as exc:
        cli.fail(exc.message, exc.exit_code)
    default = cfg.default_host == name and not was_default
    if old is None:
        made = "replaced" if current else "added"
        click.echo(f"{made} {name} ({host.destination}){' as the default host' if default else ''}")
    else:
        click.echo(_updated(old, host) + ("; now the default host" if default else ""))
    if install:
        wheels = os.environ.get(WHEELHOUSE_ENV)
        _install_on(name, host.accept_new_host_key, offline=False, wheels=Path(wheels) if wheels else None)


def _updated(old: config.Host, new: config.Host) -> str:
    """What `hosts add` of an existing host did, setting by setting (env by variable name, never by value): the
    user sees what changed and that the rest was kept."""
    before, after = old.as_toml(), new.as_toml()
    before.pop("env", None), after.pop("env", None)
    changed = [key for key in after if before.get(key) != after[key]]
    kept = [key for key in after if key not in changed and key != "destination"]
    changed += [f"env {key}" for key in sorted(new.env) if old.env.get(key) != new.env[key]]
    kept += [f"env {key}" for key in sorted(new.env) if old.env.get(key) == new.env[key]]
    said = f"updated {new.label} ({new.destination}): " + (f"set {', '.join(changed)}" if changed else "no change")
    return said + (f"; kept {', '.join(kept)}" if kept else "")


@hosts.command("remove")
@click.argument("name")
def hosts_remove(name: str) -> None:
    """Forget host NAME."""
    try:
        cfg = config.load()
    except TfrunError as exc:
        cli.fail(exc.message, exc.exit_code)
    if name not in cfg.hosts:
        cli.fail(f"no host {name!r} (see tfrun hosts list)", EXIT_USAGE)
    del cfg.hosts[name]
    if cfg.default_host == name:
        cfg.default_host = None
    cfg.save()
    click.echo(f"removed {name}")


@hosts.command("install")
@click.argument("name", required=False, envvar="TFRUN_HOST")
@click.option("--offline", is_flag=True, help="Send the dependencies along: wheels for the box's Python and "
              "platform, downloaded here, so the box needs no package index.")  # fmt: skip
@click.option("--wheels", type=click.Path(exists=True, file_okay=False, path_type=Path), envvar=WHEELHOUSE_ENV,
              metavar="DIR", help=f"Take those wheels from DIR instead of downloading them; implies --offline "
              f"(env {WHEELHOUSE_ENV}).")  # fmt: skip
@click.option("--python", metavar="PY", help="The box's Python to make the venv with (default: python3, else the "
              "newest python3.X; 3.9 or newer).")  # fmt: skip
@click.option("--venv", default=DEFAULT_BOX_VENV, show_default=True, metavar="DIR", help="Where the venv goes on "
              "the box (~ is the box's home).")  # fmt: skip
@click.option("--force", is_flag=True, help="Install even when the box has this version (e.g. a development build "
              "of other files).")  # fmt: skip
@click.option("--accept-new-host-key", is_flag=True, help="Trust the box's host key the first time it is seen.")
@click.option("--json", "as_json", is_flag=True, help="Print what was done as JSON: action (installed, upgraded, "
              "downgraded, reinstalled, unchanged), version, previous, tfrund, python, daemon_pid, ...")  # fmt: skip
def hosts_install(
    name: Optional[str],
    offline: bool,
    wheels: Optional[Path],
    python: Optional[str],
    venv: str,
    force: bool,
    accept_new_host_key: bool,
    as_json: bool,
) -> None:
    """Install this client's own tfrun on host NAME's box and start tfrund there, with nothing but SSH.

    It builds a wheel of this tfrun, copies it over tfrun's SSH connection, makes a venv on the box with its
    Python (3.9 or newer), installs the wheel there with its dependencies (from the box's package index, or
    with --offline from wheels sent from here), starts tfrund from it and records that tfrund for NAME.
    Run again, it does nothing while the box has this version (--force: install anyway), and upgrades it
    otherwise (tfrund is restarted; jobs keep running). `tfrun hosts check` says when the versions differ.
    Progress goes to stderr.

    \b
    Examples:
      tfrun hosts add box alice@gpu-box --install   # add the host and install at once
      tfrun hosts install box --offline             # for a box that reaches no package index
    """
    _install_on(name, accept_new_host_key, offline, wheels, python, venv, force, as_json)


def _install_on(
    name: Optional[str],
    accept_new: bool,
    offline: bool,
    wheels: Optional[Path],
    python: Optional[str] = None,
    venv: str = DEFAULT_BOX_VENV,
    force: bool = False,
    as_json: bool = False,
) -> None:
    """`hosts install` and `hosts add --install`: the install (client/install/steps.py), then one summary line."""
    from ...install import steps as install

    options = install.Options(venv=venv, python=python, offline=offline, wheels=wheels, force=force)
    result = cli.run(install.install(name, options, accept_new, lambda line: click.echo(f"tfrun: {line}", err=True)))
    click.echo(render.to_json(result) if as_json else result.summary())


@hosts.command("check")
@click.argument("name", required=False, envvar="TFRUN_HOST")
@click.option("--accept-new-host-key", is_flag=True, help="Trust the box's host key the first time it is seen.")
@click.option("--json", "as_json", is_flag=True, help="Print the steps as a JSON list of status (ok, warn, fail) "
              "and step, once all are done.")  # fmt: skip
def hosts_check(name: Optional[str], accept_new_host_key: bool, as_json: bool) -> None:
    """Check a host step by step: ssh, host key, tfrund and its version, socket forwarding, then the doctor's
    checks (tfrun doctor) with the interpreter jobs get there (the host's --python, else tfrund's job_python):
    its TensorFlow, CUDA build, GPUs, the driver, the checkpoint root; on a Slurm login node, Slurm's version,
    partitions, GPUs per node and accounting. Exits 125 if the daemon cannot be reached (ssh, tfrund, the
    daemon), 1 if it answers but the box is not ready (another tfrund version, a check that failed)."""
    try:
        host = config.resolve(name, config.load())
    except TfrunError as exc:
        cli.fail(exc.message, exc.exit_code)
    if host is None:
        cli.fail("no host given and no default host configured", EXIT_USAGE)
    from ...link import hostcheck

    steps: list[dict[str, str]] = []

    def report(good: bool | str, step: str) -> None:
        if as_json:  # a step's status as the doctor names it: ok, warn, fail
            steps.append({"status": _STEP_LABEL[good].strip().lower(), "step": step})
        else:
            click.echo(f"{_STEP_LABEL[good]} {step}")

    code = cli.run(hostcheck.check(host, accept_new_host_key, report))
    if as_json:
        click.echo(render.to_json(steps))
    sys.exit(code)


# How `hosts check` marks a step: passed or failed, or a doctor's check by its status.
_STEP_LABEL: dict[bool | str, str] = {True: "ok ", False: "FAIL", "ok": "ok ", "warn": "warn", "fail": "FAIL"}


@click.command("ssh-config")
@click.argument("name")
@click.argument("destination", required=False)
@click.option("--identity-file", metavar="PATH", help="The private key to log in with (IdentityFile, and "
              "IdentitiesOnly yes: ssh offers no other key). Written as given, ~ and all; a relative path is made "
              "absolute.")  # fmt: skip
@click.option("--user", metavar="USER", help="The user to log in as, over DESTINATION's (the tfrun container: tf).")
@click.option("--port", type=click.IntRange(1, 65535), metavar="PORT", help="The port, over DESTINATION's (the "
              "tfrun container: 2222).")  # fmt: skip
@click.option("--jump", metavar="USER@HOST[:PORT][,...]", help="Reach the box through these hosts in turn "
              "(ProxyJump, like ssh -J).")  # fmt: skip
@click.option("--write", is_flag=True, help="Add the block to ~/.ssh/config (at the top), or replace the one "
              "written before for NAME; tfrun's host NAME, if any, then reaches the box through it.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print name, hostname, port, user, identity_file, jump, block "
              "and written (the file, or null) as JSON.")  # fmt: skip
def ssh_config(
    name: str,
    destination: Optional[str],
    identity_file: Optional[str],
    user: Optional[str],
    port: Optional[int],
    jump: Optional[str],
    write: bool,
    as_json: bool,
) -> None:
    """Print the OpenSSH Host block that names a box NAME; with --write, add it to ~/.ssh/config.

    Written once, it serves everything that reaches the box: `ssh NAME`, VS Code Remote-SSH (whose "Connect
    to Host" lists NAME) and tfrun (`tfrun ps --host NAME`, any verb). DESTINATION is user@host[:port] or ssh://user@host:port
    (default: the destination, identity file and jump hosts of tfrun's host NAME, see tfrun hosts list, or the
    block written before). The block keeps idle connections alive (ServerAliveInterval 30) and sets no
    ControlMaster, which VS Code on Windows cannot use.

    --write puts the block at the top of ~/.ssh/config, where OpenSSH's first match wins, between
    `# >>> tfrun ssh-config NAME >>>` and `# <<< ... <<<`; running it again replaces that block and nothing
    else. A `Host NAME` of your own is left alone: that is an error. tfrun's host NAME, if there is one, then
    reaches the box through the block (destination NAME), so ssh, VS Code and tfrun use one address, user,
    port and key: the same as `tfrun hosts add NAME NAME` after writing the block.

    \b
    Example, for the tfrun container (user tf, port 2222):
      tfrun ssh-config box tf@gpu-host:2222 --identity-file ~/.ssh/id_ed25519 --write
      ssh box
      tfrun submit --host box train.py
    """
    from ...config import sshconfig

    written: Optional[Path] = None
    pointed = False
    try:
        entry = sshconfig.entry_for(name, destination, user, port, identity_file, jump)
        if write:
            written = sshconfig.write(entry)
            pointed = sshconfig.point_host_at_block(name)
    except TfrunError as exc:
        cli.fail(exc.message, exc.exit_code)
    if as_json:
        fields = dataclasses.asdict(entry)
        click.echo(render.to_json({**fields, "block": entry.block(), "written": str(written) if written else None}))
    elif written is not None:
        click.echo(f"wrote Host {name} to {written}" + (f"; tfrun's host {name} now reaches the box through it"
                                                         if pointed else ""))  # fmt: skip
    else:
        click.echo(entry.block(), nl=False)


# -- shell completion ---------------------------------------------------------------------------------------


@click.command("completion")
@click.argument("shell", type=click.Choice(completion.SHELLS))
def completion_script(shell: str) -> None:
    """Print the Tab-completion script for bash, zsh or fish.

    It completes verbs, options, files for SCRIPT, host names (from your config) and job ids, asked of the
    box that --host or the default host names: a daemon that is not running is not started, and one that
    does not answer within a few seconds offers none.

    \b
      bash:  echo 'eval "$(tfrun completion bash)"' >> ~/.bashrc
      zsh:   echo 'eval "$(tfrun completion zsh)"' >> ~/.zshrc    (after compinit)
      fish:  tfrun completion fish > ~/.config/fish/completions/tfrun.fish
    """
    click.echo(completion.script(click.get_current_context().find_root().command, shell))
