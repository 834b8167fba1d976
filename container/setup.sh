#!/usr/bin/env bash
# Turn a TensorFlow image (or any Debian/Ubuntu root) into a tfrun box. The Dockerfile's one RUN step, and
# what tests/test_container.py runs in a debootstrap chroot, so the test checks the image's real recipe.
#
# Environment (the Dockerfile passes its build arguments):
#   TFRUN_USER, TFRUN_UID, TFRUN_GID  the non-root user who logs in and owns jobs (default tf, 1000, 1000)
#   TFRUN_SRC                         the tfrun source to install (default: the folder above this script)
# pip reads its own PIP_* variables, so an offline build can pass PIP_NO_INDEX=1 PIP_FIND_LINKS=/wheels.
set -euo pipefail

user=${TFRUN_USER:-tf}
uid=${TFRUN_UID:-1000}
gid=${TFRUN_GID:-1000}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=${TFRUN_SRC:-$(dirname "$here")}
venv=/opt/tfrun/venv
export DEBIAN_FRONTEND=noninteractive

say() { printf 'setup: %s\n' "$*"; }

# Older CUDA images list NVIDIA's apt repository, whose signing key NVIDIA rotated in 2022: `apt-get
# update` then fails on it although nothing we install comes from there. Retry without those lists, and put
# them back afterwards so the image stays as its maker left it.
apt_update() {
    if apt-get update -qq; then
        return
    fi
    say "apt-get update failed; retrying without NVIDIA's repository lists"
    local list parked=()
    for list in /etc/apt/sources.list.d/cuda*.list /etc/apt/sources.list.d/nvidia*.list; do
        [ -e "$list" ] || continue
        mv "$list" "$list.tfrun-parked"
        parked+=("$list")
    done
    apt-get update -qq
    for list in "${parked[@]}"; do
        mv "$list.tfrun-parked" "$list"
    done
}

# tfrund needs Python 3.9+ and must not share the image's TF interpreter: a venv of its own, from the
# system python3 when it is new enough, else from python3.9 (Ubuntu 20.04, under TF 2.9, has 3.8).
daemon_python() {
    if command -v python3 >/dev/null && python3 -c 'import sys; sys.exit(sys.version_info < (3, 9))'; then
        apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
        command -v python3
    else
        apt-get install -y -qq --no-install-recommends python3.9 python3.9-venv >/dev/null
        command -v python3.9
    fi
}

apt_update
say "installing sshd, tini, tmux, git, rsync"
if ! command -v python3 >/dev/null; then
    apt-get install -y -qq --no-install-recommends python3 >/dev/null
fi
# curl and procps: VS Code Remote-SSH downloads its server with curl and watches it with ps.
apt-get install -y -qq --no-install-recommends \
    openssh-server tini tmux git rsync ca-certificates curl procps util-linux >/dev/null
python=$(daemon_python)

say "installing tfrun into $venv with $("$python" --version)"
"$python" -m venv "$venv"
"$venv/bin/pip" install --quiet --no-cache-dir --upgrade pip
"$venv/bin/pip" install --quiet --no-cache-dir "$src"
ln -sf "$venv/bin/tfrun" /usr/local/bin/tfrun
ln -sf "$venv/bin/tfrund" /usr/local/bin/tfrund

say "adding user $user ($uid:$gid)"
if ! getent group "$gid" >/dev/null; then
    groupadd --gid "$gid" "$user"
fi
useradd --uid "$uid" --gid "$gid" --create-home --home-dir "/home/$user" --shell /bin/bash "$user"
# No password at all ('*' matches none), yet not a locked account, which sshd would refuse even for keys.
usermod --password '*' "$user"
mkdir -p /etc/tfrun
printf '%s\n' "$user" >/etc/tfrun/user

# The volumes' mount points, owned as they will be used: Docker gives a new named volume this ownership (and
# mode). tfrund's state is its user's alone (alert URLs, jobs' environments): 0700; each job's checkpoint folder
# under /mnt/checkpoints is made 0700 by tfrund.
group=$(getent group "$gid" | cut -d: -f1)
install -d -o "$user" -g "$group" -m 0700 /var/lib/tfrun
install -d -o "$user" -g "$group" -m 0755 /mnt/checkpoints /mnt/data
install -d -o root -g root -m 0700 /etc/ssh/keys

say "configuring sshd"
# openssh-server's install made host keys: never ship them, every box makes its own at first start.
rm -f /etc/ssh/ssh_host_*
install -m 0644 "$here/sshd_config" /etc/ssh/sshd_config
install -m 0755 "$here/entrypoint.sh" /usr/local/sbin/tfrun-entrypoint
install -m 0755 "$here/healthcheck.sh" /usr/local/sbin/tfrun-healthcheck

apt-get clean
rm -rf /var/lib/apt/lists/*
say "done"
