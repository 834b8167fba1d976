#!/usr/bin/env python3
"""What `tfrun ps --host all` costs over 1, 3 and 8 boxes, side by side with a shell loop of plain ssh. By hand.

    .venv/bin/python -m bench.fleet [--runs 5] [--boxes 1,3,8]

Each box is a real sshd on 127.0.0.1 with a daemon of its own (its TFRUN_HOME, as tests/test_fleet.py sets
boxes up), started once before: "cold" means the SSH side only. For each count N, with exactly N hosts
configured (so `all` is those N):
  - cold: no connection keeper runs (this bench's keepers are killed, by pid, before each run): the verb
    starts keepers, which import asyncssh and do the handshakes;
  - warm: the keepers are up, as for every verb but the first of a while;
  - the baseline: `for h in boxes; do ssh h tfrund status; done`, each a fresh OpenSSH connection and the
    daemon asked once (`tfrund status` reads the daemon's job counts, as `ps` reads its jobs);
  - keeper processes: how many keeper processes a cold `ps --host all` leaves running (each one a Python
    that imported asyncssh, about 0.3 s of CPU).
Prints a Markdown table of medians (p50) and p90, and tfrun's p50 as a multiple of the baseline's.
"""

from __future__ import annotations

import argparse
import compileall
import getpass
import os
import shlex
import signal
import statistics
import tempfile
from pathlib import Path

from bench.timing import stats, timed
from tests.harness import TFRUN, TFRUND, Sshd, Tfrun, alive, keepers_of, wait_for


def kill_keepers(client: Tfrun) -> None:
    """Stop this bench's keepers (they carry its client's TFRUN_HOME), by pid, and wait until they are gone."""
    pids = keepers_of(client)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    for pid in pids:
        wait_for(lambda: not alive(pid), what="a keeper to die")  # noqa: B023


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--boxes", default="1,3,8", help="The box counts, comma-separated.")
    args = parser.parse_args()
    counts = [int(n) for n in args.boxes.split(",")]
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # run as an installed tfrun runs: from bytecode
    repo = Path(__file__).resolve().parent.parent
    for folder in ("tfrun", "client", "runner"):
        compileall.compile_dir(repo / folder, quiet=1)
    work = Path(tempfile.mkdtemp(prefix="tfrun-bench-fleet-"))
    client = Tfrun(work / "client-state", client_home=work / "client-home")
    client.env["XDG_RUNTIME_DIR"] = str(work / "run")  # the keepers' sockets: this bench's own
    client.env.pop("TFRUN_SSH_PERSIST", None)
    (work / "run").mkdir(mode=0o700)
    ssh_dir = client.client_home / ".ssh"
    ssh_dir.mkdir(mode=0o700)
    known_hosts = ssh_dir / "known_hosts"
    boxes: list[Sshd] = []
    homes: list[Path] = []
    rows = []
    try:
        for count in counts:
            while len(boxes) < count:  # one more box: its sshd, its host entry, its daemon started once
                name, server, home = (
                    f"box{len(boxes) + 1}",
                    Sshd(work / f"sshd-{len(boxes) + 1}"),
                    work / f"home-{len(boxes) + 1}",
                )
                boxes.append(server)
                homes.append(home)
                with open(known_hosts, "a") as f:
                    f.write(server.known_hosts_line)
                client.ok("hosts", "add", name, f"{getpass.getuser()}@127.0.0.1:{server.port}",
                          "--identity-file", str(server.user_key), "--tfrund", shlex.join(TFRUND),
                          "--env", f"TFRUN_HOME={home}", "--env", "TFRUN_GPUS=0")  # fmt: skip
                client.ok("ps", "--host", name)
            ps = [*TFRUN, "ps", "--host", "all"]
            loop = "; ".join(
                shlex.join(
                    [*server.ssh_command(known_hosts), shlex.join(["env", f"TFRUN_HOME={home}", *TFRUND, "status"])]
                )
                for server, home in zip(boxes, homes)
            )
            cold, kept = [], []
            for _ in range(args.runs):
                kill_keepers(client)
                cold.append(timed(ps, client.env))
                kept.append(len(keepers_of(client)))
            warm = [timed(ps, client.env) for _ in range(args.runs)]
            baseline = [timed(["sh", "-c", loop], client.env) for _ in range(args.runs)]
            rows.append((count, cold, warm, baseline, kept))
    finally:
        kill_keepers(client)
        for home in homes:
            Tfrun(home).cleanup()
        client.cleanup()
        for server in boxes:
            server.stop()

    print(f"\n{args.runs} runs each, {os.cpu_count()} CPUs; seconds, p50 (p90)\n")
    print("| boxes | `ps --host all`, cold | `ps --host all`, keepers up | `for h; do ssh h tfrund status; done` "
          "| cold / ssh loop | warm / ssh loop | keeper processes after a cold ps |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for count, cold, warm, baseline, kept in rows:
        (c50, c90), (w50, w90), (b50, b90) = stats(cold), stats(warm), stats(baseline)
        print(f"| {count} | {c50:.3f} ({c90:.3f}) | {w50:.3f} ({w90:.3f}) | {b50:.3f} ({b90:.3f}) "
              f"| {c50 / b50:.2f}x | {w50 / b50:.2f}x | {statistics.median(kept):g} |")  # fmt: skip


if __name__ == "__main__":
    main()
