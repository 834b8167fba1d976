#!/usr/bin/env bash
# The box's main process, under tini: prepares what lives on volumes, writes the image's environment where
# SSH sessions read it, keeps tfrund running and runs sshd in the foreground. SIGTERM (docker stop) stops
# both; running jobs are not signalled, and those the stop kills are recorded as lost at the next start.
#
# Environment:
#   TFRUN_AUTHORIZED_KEYS       public keys (one per line) allowed to log in as the box's user
#   TFRUN_AUTHORIZED_KEYS_FILE  a file of such keys (default /etc/tfrun/authorized_keys, e.g. a bind mount)
#   TFRUN_HOME                  tfrund's state (the image sets /var/lib/tfrun, a volume)
set -euo pipefail

user=$(cat /etc/tfrun/user)
uid=$(id -u "$user")
gid=$(id -g "$user")
home=$(getent passwd "$user" | cut -d: -f6)
state=${TFRUN_HOME:-/var/lib/tfrun}
keys_dir=/etc/ssh/keys
keys_file=${TFRUN_AUTHORIZED_KEYS_FILE:-/etc/tfrun/authorized_keys}

say() { printf 'tfrun-entrypoint: %s\n' "$*" >&2; }

if [ "$(id -u)" != 0 ]; then
    say "error: the box starts as root (no --user) and runs sessions and jobs as $user itself"
    exit 1
fi

# Made once, on the keys volume: a re-created container keeps its identity, so clients see no warning.
# The fingerprints go to `docker logs` for checking the first connection.
host_keys() {
    install -d -m 0700 "$keys_dir"
    local type key
    for type in ed25519 ecdsa rsa; do
        key=$keys_dir/ssh_host_${type}_key
        if [ ! -s "$key" ]; then
            ssh-keygen -q -t "$type" -N '' -C "tfrun-box" -f "$key"
            say "made host key $(ssh-keygen -l -f "$key.pub")"
        fi
    done
}

# The keys sshd accepts for the user besides ~/.ssh/authorized_keys: rewritten at every start, so removing
# a key from the variable or the file revokes it.
authorized_keys() {
    local out=/run/tfrun/authorized_keys/$user tmp
    install -d -m 0755 /run/tfrun /run/tfrun/authorized_keys
    tmp=$(mktemp /run/tfrun/authorized_keys/.new.XXXXXX)
    if [ -f "$keys_file" ]; then
        cat "$keys_file" >>"$tmp"
        printf '\n' >>"$tmp"
    elif [ -d "$keys_file" ]; then
        say "warning: $keys_file is a folder, not a file of keys (Docker makes one when the host file is missing)"
    fi
    printf '%s\n' "${TFRUN_AUTHORIZED_KEYS:-}" >>"$tmp"
    chmod 0644 "$tmp"
    mv "$tmp" "$out"
    local count
    count=$(grep -c -E '^[[:space:]]*[^#[:space:]]' "$out" || true)
    if [ "$count" -eq 0 ] && [ ! -s "$home/.ssh/authorized_keys" ]; then
        say "warning: no authorized keys: set TFRUN_AUTHORIZED_KEYS or mount a file at $keys_file; nobody can log in"
    elif ! ssh-keygen -l -f "$out" >/dev/null 2>&1 && [ "$count" -gt 0 ]; then
        say "warning: $out holds lines that are not public keys; sshd ignores them"
    else
        say "$count authorized key(s) for $user"
    fi
}

# Volumes may arrive empty (a new bind mount) or root-owned: give the user a home and its state folder.
# Only the top folder changes owner: what is inside belongs to whoever wrote it.
volumes() {
    if [ -z "$(ls -A "$home" 2>/dev/null)" ]; then
        cp -a /etc/skel/. "$home/"
        chown -R "$uid:$gid" "$home"
    fi
    local dir
    for dir in "$home" "$state"; do
        mkdir -p "$dir"
        [ "$(stat -c %u "$dir")" = "$uid" ] || chown "$uid:$gid" "$dir"
    done
    # A bind mount of a host folder that did not exist arrives empty and root's (Docker made it): the
    # user's. One with contents keeps its owner, with a warning if the user cannot write it.
    for dir in /mnt/checkpoints /mnt/data; do
        [ -d "$dir" ] || continue
        if [ "$(stat -c %u "$dir")" = 0 ] && [ -z "$(ls -A "$dir")" ]; then
            chown "$uid:$gid" "$dir"
        elif ! setpriv --reuid "$uid" --regid "$gid" --init-groups test -w "$dir"; then
            say "warning: $user (uid $uid) cannot write $dir; build with --build-arg TFRUN_UID=\$(id -u) or chown it"
        fi
    done
}

# sshd does not pass Docker's ENV on to sessions. pam_env gives /etc/environment to every SSH session
# (`ssh box cmd` and VS Code's server included); login shells reset PATH in /etc/profile, so
# /etc/profile.d restores the same values after it. tfrund inherits them from here, and its jobs from it.
environment() {
    local skip=" HOME HOSTNAME PWD OLDPWD SHLVL TERM _ USER LOGNAME SHELL MAIL TFRUN_AUTHORIZED_KEYS TFRUN_AUTHORIZED_KEYS_FILE "
    local envfile profile name value kv
    envfile=$(mktemp /etc/.environment.XXXXXX)
    profile=$(mktemp /etc/profile.d/.tfrun-env.XXXXXX)
    printf '# Written by tfrun-entrypoint at each start: the image environment, for SSH sessions.\n' |
        tee "$envfile" >"$profile"
    while IFS= read -r -d '' kv; do
        name=${kv%%=*}
        value=${kv#*=}
        [[ $name =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || continue
        [[ $skip == *" $name "* ]] && continue
        if [[ $value == *$'\n'* || $value == [\"\']* ]]; then
            say "warning: $name is not passed to SSH sessions: pam_env cannot carry its value"
            continue
        fi
        printf '%s=%s\n' "$name" "$value" >>"$envfile"
        printf "export %s='%s'\n" "$name" "${value//\'/\'\\\'\'}" >>"$profile"
    done < <(env -0)
    chown "root:$gid" "$envfile" "$profile"
    chmod 0640 "$envfile" "$profile"
    mv "$envfile" /etc/environment
    mv "$profile" /etc/profile.d/tfrun-env.sh
}

# Replaces the calling shell with the command, run as the user: called in a `( ... ) &` subshell, `$!` is the
# command's own PID (env and setpriv exec in turn), so a signal sent to `$!` reaches it. A shell function put in
# the background is a subshell that forks the command: `$!` was that subshell, the SIGTERM of `docker stop` ended
# it alone, and tfrund, reparented to tini, was SIGKILLed when the box went down.
exec_as_user() {
    exec env -u TFRUN_AUTHORIZED_KEYS -u TFRUN_AUTHORIZED_KEYS_FILE HOME="$home" USER="$user" LOGNAME="$user" \
        SHELL=/bin/bash setpriv --reuid "$uid" --regid "$gid" --init-groups -- "$@"
}

# tfrund in the foreground, started again whenever it exits. When it exits because a daemon that a client
# started holds the lock, wait for that one to go instead of spinning. A daemon that keeps failing at start
# is retried less and less often (1 s doubling to 30 s).
supervise_tfrund() {
    local child="" stopping="" delay=1 started status
    trap 'stopping=1; [ -z "$child" ] || kill -TERM "$child" 2>/dev/null || true' TERM
    cd /
    while [ -z "$stopping" ]; do
        started=$SECONDS
        (exec_as_user /opt/tfrun/venv/bin/tfrund run) &
        child=$!
        status=0
        wait "$child" || status=$?
        # A TERM lands in the first wait; the second collects the daemon's own exit.
        [ -z "$stopping" ] || { wait "$child" 2>/dev/null || true; break; }
        child=""
        if [ -e "$state/run/tfrund.lock" ] && ! flock -n "$state/run/tfrund.lock" true; then
            say "another tfrund holds $state; waiting for it to exit"
            flock "$state/run/tfrund.lock" true &
            child=$!
            wait "$child" || true
            child=""
            continue
        fi
        if ((SECONDS - started > 60)); then
            delay=1
        fi
        say "tfrund exited with status $status; starting it again in ${delay}s"
        sleep "$delay" &
        child=$!
        wait "$child" || true
        child=""
        delay=$((delay * 2 > 30 ? 30 : delay * 2))
    done
}

# shellcheck disable=SC2329 # called by the TERM/INT trap below
stop() {
    say "stopping: SIGTERM to tfrund and sshd"
    kill -TERM "$supervisor" "$sshd" 2>/dev/null || true
    wait "$supervisor" 2>/dev/null || true
    wait "$sshd" 2>/dev/null || true
    exit 0
}

host_keys
authorized_keys
volumes
environment
mkdir -p /run/sshd
chmod 0755 /run/sshd
/usr/sbin/sshd -t

supervise_tfrund &
supervisor=$!
/usr/sbin/sshd -D -e &
sshd=$!
trap stop TERM INT
say "sshd and tfrund started"
status=0
wait "$sshd" || status=$?
say "sshd exited with status $status; stopping"
kill -TERM "$supervisor" 2>/dev/null || true
wait "$supervisor" 2>/dev/null || true
exit "$status"
