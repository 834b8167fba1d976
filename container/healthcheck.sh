#!/usr/bin/env bash
# The image's HEALTHCHECK: sshd answers with its banner, tfrund answers on its socket, and where the box has
# a GPU (nvidia-smi sees one) TensorFlow sees it too. Exit 0 healthy, 1 not, with one line saying why.
set -uo pipefail

user=$(cat /etc/tfrun/user)

fail() {
    printf 'unhealthy: %s\n' "$*"
    exit 1
}

if ! exec 3<>/dev/tcp/127.0.0.1/22; then
    fail "sshd does not accept connections on port 22"
fi
banner=""
read -r -t 10 banner <&3 || true
exec 3<&-
[[ $banner == SSH-2.0-* ]] || fail "port 22 answers without an SSH banner: ${banner:0:60}"

as_user() {
    setpriv --reuid "$(id -u "$user")" --regid "$(id -g "$user")" --init-groups -- "$@"
}

if ! as_user env HOME="$(getent passwd "$user" | cut -d: -f6)" /opt/tfrun/venv/bin/tfrund status >/dev/null 2>&1; then
    fail "tfrund does not answer (its log: docker logs)"
fi

if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    # The image's interpreter, the one jobs run with: it must see what nvidia-smi sees.
    check='import sys, tensorflow as tf; sys.exit(0 if tf.config.list_physical_devices("GPU") else 1)'
    if ! TF_CPP_MIN_LOG_LEVEL=3 as_user "${TFRUN_JOB_PYTHON:-/usr/bin/python3}" -c "$check" >/dev/null 2>&1; then
        fail "nvidia-smi lists a GPU but TensorFlow sees none"
    fi
fi
echo "healthy"
