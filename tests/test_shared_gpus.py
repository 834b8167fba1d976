"""A box shared by a team (issue 44), the GPU leases: another real user of the machine (`mallory`) tries to freeze
every user's tfrund, to squat the leases' names, to hold GPUs without saying who she is, and to steal a lease
from under its holder (runner/shim/gpulease.py). The victim's jobs still run, or wait saying by name who holds
their GPU or what is wrong with which file, within seconds.

The GPUs are the stand-in's (two, with UUIDs: tests/test_gpu_leases.py), leased in `<stand-in>.leases/`, a name
anyone could make first in the 1777 folder around it, as /tmp/tfrun-gpus is in /tmp. The victim is the test itself
(root, through the `tf` fixture); a holder the kernel gives no name would be this test's bug, not tfrun's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import test_gpu_leases
from harness import Tfrun, otheruser, wait_for
from harness.otheruser import OtherUser, other_user
from test_gpu_leases import Other, recording_job, records, standin, waiting_reason

pytestmark = [pytest.mark.root]

mallory = otheruser.mallory  # the fixture: another user of the box, who tries each attack
shared = test_gpu_leases.shared  # the fixture: a 1777 folder both users reach, as /tmp is
KEYS = ("GPU-0aa-test", "GPU-1aa-test")  # the stand-in's UUIDs: what names each GPU's lease
SECONDS = 10  # how soon a job must run, or say why it waits, once the pass that decides it is due

# Makes the shared lease folder (argv[1]) hers, as anyone may who comes first, and a folder of her own in it
# (argv[2], 0755 as tfrun makes one).
FOLDERS = """
import os, sys
os.mkdir(sys.argv[1])
os.chmod(sys.argv[1], 0o1777)
os.mkdir(sys.argv[2])
os.chmod(sys.argv[2], 0o755)
"""

# Puts `kind` (fifo, directory, private file) at every name tfrun ever opened in the lease folder (the hand-out
# lock, each GPU's lease file) and at lease names in her own folder in it.
SQUAT = """
import os, sys
leases, mine, kind, keys = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
names = [os.path.join(leases, "handout.lock")]
for key in keys:
    names += [os.path.join(leases, "gpu-%s.lock" % key), os.path.join(mine, "gpu-%s.0123456789abcdef.lock" % key)]
for name in names:
    if kind == "fifo":
        os.mkfifo(name)
        os.chmod(name, 0o666)
    elif kind == "directory":
        os.mkdir(name)
        os.chmod(name, 0o777)
    else:
        os.close(os.open(name, os.O_CREAT | os.O_WRONLY, 0o600))
"""

# Locks a file at each path in argv[1:] (made 0644 if missing), says "held", and holds them until killed: a lease of
# hers where the path follows tfrun's scheme, a lock at a bare name otherwise.
HOLD = """
import fcntl, os, sys, time
fds = []
for path in sys.argv[1:]:
    fd = os.open(path, os.O_CREAT | os.O_RDONLY, 0o644)
    os.fchmod(fd, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    fds.append(fd)
print("held", flush=True)
time.sleep(600)
"""

# Removes every file she can anywhere in the lease folder (argv[1]), renames every folder in it she can, and
# prints what she managed: the sticky bit lets her do this to anything of hers, and (the folder being hers) to
# any entry of the folder itself.
STEAL = """
import os, sys
top = sys.argv[1]
done = []
for name in os.listdir(top):
    path = os.path.join(top, name)
    if os.path.isdir(path) and not os.path.islink(path):
        for inner in os.listdir(path):
            try:
                os.unlink(os.path.join(path, inner))
                done.append("removed " + os.path.join(name, inner))
            except OSError:
                pass
        try:
            os.rename(path, path + ".moved")
            done.append("renamed " + name)
        except OSError:
            pass
    else:
        os.unlink(path)
        done.append("removed " + name)
print("\\n".join(done))
"""


def her_folders(user: OtherUser, leases: Path) -> Path:
    """`user` makes the lease folder and a folder of her own in it (FOLDERS); the latter."""
    mine = leases / f"uid{user.uid}.0123456789abcdef"
    made = user.python(FOLDERS, str(leases), str(mine))
    assert made.returncode == 0, made.stderr
    return mine


def squatting(user: OtherUser, leases: Path, kind: str) -> None:
    """`user` makes the lease folder and puts `kind` at every lease name she can (SQUAT)."""
    squat = user.python(SQUAT, str(leases), str(her_folders(user, leases)), kind, *KEYS)
    assert squat.returncode == 0, squat.stderr


def holding(user: OtherUser, *paths: str) -> subprocess.Popen[str]:
    """`user` holding locks on `paths` (HOLD), once they are all held."""
    holder = user.popen([sys.executable, "-c", HOLD, *paths], stdout=subprocess.PIPE)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def lease_folder(shared: Path, tf: Tfrun) -> Path:
    """The stand-in's GPUs, given to the victim's daemon; where their leases are."""
    gpus = standin(shared)
    tf.env["TFRUN_GPU_STANDIN"] = str(gpus)
    return Path(f"{gpus}.leases")


def submitted(tf: Tfrun, *args: str) -> int:
    """A job submitted within SECONDS: a daemon that froze (issue 44: a FIFO at a lease name) answers no more."""
    result = tf.run("submit", *args, timeout=SECONDS * 3)
    assert result.returncode == 0, result.stderr
    return int(result.stdout)


def one_line(why: str) -> bool:
    return bool(why) and "\n" not in why and "Traceback" not in why


@pytest.mark.slow  # more than 10 s
def test_fifos_at_every_name_tfrun_opens_in_the_lease_folder_freeze_no_daemon(
    tf: Tfrun, mallory: OtherUser, shared: Path, project: Path
) -> None:
    squatting(mallory, lease_folder(shared, tf), "fifo")
    gated = str(recording_job(project, shared, "root", gated=True))
    first = submitted(tf, "--gpus", "1", gated)
    wait_for(lambda: tf.job(first)["state"] == "running", timeout=SECONDS, what="the first job to run")
    both = submitted(tf, "--gpus", "2", str(recording_job(project, shared, "both")))
    assert "waiting for 2 GPU(s); 1 free" in waiting_reason(tf, both)
    tf.kill_daemon()  # a GPU job waits: the daemon started next makes a pass before it listens
    answer = tf.run("ps", timeout=SECONDS * 3)
    assert answer.returncode == 0 and "queued" in answer.stdout, answer.stderr
    assert "held by" not in tf.ok("gpus")  # her FIFOs are no leases
    (shared / "gates" / f"root-{first}").touch()
    wait_for(lambda: f"both-{both}" in records(shared), timeout=SECONDS * 2, what="the two-GPU job to run")
    assert records(shared)[f"both-{both}"][0] == "0,1"


@pytest.mark.parametrize("kind", ["fifo", "file", "link"])
def test_a_lease_folder_that_is_no_folder_is_refused_naming_whose_it_is(
    tf: Tfrun, mallory: OtherUser, shared: Path, project: Path, kind: str
) -> None:
    leases = lease_folder(shared, tf)
    make = {
        "fifo": "import os, sys; os.mkfifo(sys.argv[1], 0o666)",
        "file": "import os, sys; os.close(os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY, 0o666))",
        "link": "import os, sys; os.mkdir(sys.argv[1] + '.hers'); os.symlink(sys.argv[1] + '.hers', sys.argv[1])",
    }[kind]
    made = mallory.python(make, str(leases))
    assert made.returncode == 0, made.stderr
    job = submitted(tf, "--gpus", "1", str(recording_job(project, shared, "root")))
    wait_for(lambda: "held outside" in waiting_reason(tf, job), timeout=SECONDS, what="the job to say why it waits")
    why = waiting_reason(tf, job)
    named = {"fifo": "a FIFO", "file": "a file", "link": "a link"}[kind]
    assert f"GPU lease folder {leases} is {named} of user {mallory.name} (uid {mallory.uid}), not a folder" in why
    assert "ask them or root to remove it" in why and one_line(why)
    assert f"user {mallory.name}" in tf.ok("ps")
    tf.run("cancel", str(job))


@pytest.mark.parametrize("kind", ["directory", "private file", "held lock"])
def test_squatting_the_lease_names_keeps_no_job_off_a_gpu(mallory: OtherUser, shared: Path, kind: str) -> None:
    """The victim is a user too (root would open her private files, as no user's daemon can)."""
    gpus = standin(shared)
    leases = Path(f"{gpus}.leases")
    holder = None
    if kind == "held lock":  # at the names every daemon locked; a lease of her own is the next test's
        her_folders(mallory, leases)
        holder = holding(mallory, str(leases / "handout.lock"), *(str(leases / f"gpu-{key}.lock") for key in KEYS))
    else:
        squatting(mallory, leases, kind)
    try:
        with other_user("tfa") as alice:
            victim = Other(alice, gpus)
            script = str(victim.project(shared))
            jobs = [victim.submit("--gpus", "1", script) for _ in range(2)]
            wait_for(lambda: len(records(shared)) == 2, timeout=SECONDS * 2, what="both jobs to run")
            assert {records(shared)[f"{alice.name}-{job}"][0] for job in jobs} <= {"0", "1"}
            assert "held by" not in victim.ok("gpus")
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()


def test_a_gpu_whose_lease_another_user_holds_waits_saying_who_within_seconds(
    tf: Tfrun, mallory: OtherUser, shared: Path, project: Path
) -> None:
    folder = her_folders(mallory, lease_folder(shared, tf))
    holder = holding(mallory, *(f"{folder}/gpu-{key}.0123456789abcdef.lock" for key in KEYS))
    try:
        job = submitted(tf, "--gpus", "1", str(recording_job(project, shared, "root")))
        asked = time.monotonic()
        held = f"a lease of user {mallory.name} (uid {mallory.uid}) that pid {holder.pid} (python"
        wait_for(lambda: held in waiting_reason(tf, job), timeout=SECONDS, what="the job to say who holds its GPU")
        assert time.monotonic() - asked < SECONDS and one_line(waiting_reason(tf, job))
        assert f"GPU 0 by {held}" in waiting_reason(tf, job) and f"GPU 1 by {held}" in waiting_reason(tf, job)
        assert f"held by {held}" in tf.ok("gpus")
        assert f"user {mallory.name}" in tf.ok("ps")
    finally:
        holder.kill()
        holder.wait()
    wait_for(lambda: f"root-{job}" in records(shared), timeout=SECONDS, what="the job to run once she let go")


@pytest.mark.slow  # more than 10 s
def test_a_lease_cannot_be_stolen_by_the_owner_of_the_lease_folder(
    tf: Tfrun, mallory: OtherUser, shared: Path, project: Path
) -> None:
    leases = lease_folder(shared, tf)
    squatting(mallory, leases, "private file")  # her folders, and files of hers at the old names
    mine = submitted(tf, "--gpus", "1", str(recording_job(project, shared, "root", gated=True)))
    wait_for(lambda: tf.job(mine)["state"] == "running", timeout=SECONDS, what="the victim's job to run")
    device = tf.job(mine)["gpus"][0]
    steal = mallory.python(STEAL, str(leases))
    assert steal.returncode == 0, steal.stderr
    assert "removed gpu-GPU-0aa-test.lock" in steal.stdout  # hers: the sticky bit let her
    assert not [line for line in steal.stdout.splitlines() if line.startswith("removed uid0.")], steal.stdout
    other = Other(mallory, Path(tf.env["TFRUN_GPU_STANDIN"]))
    theirs = str(other.project(shared, gated=True))
    jobs = [other.submit("--gpus", "1", theirs) for _ in range(2)]

    def states() -> list[dict[str, Any]]:
        return [json.loads(other.ok("status", "--json", str(job))) for job in jobs]

    wait_for(lambda: sorted(job["state"] for job in states()) == ["queued", "running"], timeout=SECONDS * 2,
             what="one of her jobs to run, the other to wait")  # fmt: skip
    running, waiting = sorted(states(), key=lambda job: job["state"] != "running")
    assert running["gpus"] != [device] and tf.job(mine)["state"] == "running"
    assert "a lease of user root (uid 0) that pid " in str(waiting.get("waiting")), waiting
    for job in jobs:
        (shared / "gates" / f"{mallory.name}-{job}").touch()
    (shared / "gates" / f"root-{mine}").touch()
    wait_for(lambda: len(records(shared)) == 3, timeout=SECONDS * 3, what="every job to end")


# Claims GPU argv[2]'s lease in folder argv[1] until it has held it argv[3] times (at most 20,000 tries: on a loaded
# machine 150 tries each held it 8 times in all); each time it holds it, it writes when it had it (monotonic, after
# the claim) and when it let go (before the release) to stdout: the kernel's clock, one for all.
CLAIMS = """
import sys, time
from tfrun.runner.shim import gpulease
wanted = int(sys.argv[3])
for _ in range(20000):
    found = gpulease.claim(sys.argv[1], sys.argv[2])
    if isinstance(found, gpulease.Lease):
        had = time.monotonic()
        time.sleep(0.001)
        print(had, time.monotonic(), flush=True)
        gpulease.release(found)
        wanted -= 1
        if not wanted:
            break
"""


def test_of_claimants_at_once_of_two_users_at_most_one_holds_a_gpu(mallory: OtherUser, shared: Path) -> None:
    leases = shared / "claims"
    argv = [sys.executable, "-c", CLAIMS, str(leases), KEYS[0], "3"]
    claimants = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) for _ in range(3)]
    claimants += [mallory.popen(argv, stdout=subprocess.PIPE) for _ in range(3)]
    held = sorted(
        tuple(map(float, line.split())) for c in claimants for line in c.communicate(timeout=120)[0].split("\n") if line
    )
    assert all(c.returncode == 0 for c in claimants)
    assert len(held) >= 10  # they took turns (often all let go: each backs off from the others' tries)
    overlaps = [(a, b) for a, b in zip(held, held[1:]) if b[0] < a[1]]
    assert overlaps == [], f"{len(overlaps)} times two held GPU 0 at once"
