"""Numbers and names that the client, the daemon and the shim must agree on, in one place."""

from __future__ import annotations

import sys

# Python's -P (3.11 and newer) for every tfrun process started as `python -m tfrun...` (the daemon, the shim,
# the keeper): its working folder is not put first on sys.path, where a folder named tfrun (a checkout's
# parent folder, /tfrun) would hide an editable install of tfrun and the process could not start.
SAFE_PATH: tuple[str, ...] = ("-P",) if sys.version_info >= (3, 11) else ()

# Exit codes of the `tfrun` and `tfrund` commands. A verb that follows a job (`wait`, `logs -f`,
# `submit --follow`) exits with the job's own code instead; these are for tfrun's own outcomes.
EXIT_OK = 0  # success
# the verb ran but what it was asked did not happen: `cancel` of a job that had ended already, `rm` of a job that
# has not ended, `tfrund status` when no daemon runs, `hosts check` and `doctor` of a box whose daemon answers but
# is not ready for jobs (no TensorFlow in the job python, another tfrund version, a check that failed), `submit
# --host POOL` when the members that answered cannot run the job
EXIT_FAILURE = 1
# bad options or bad input: a missing script, an unreadable work dir, a bad `--env`, an invalid name (click uses 2
# for usage errors too)
EXIT_USAGE = 2
EXIT_NO_SUCH_JOB = 3  # no job of that id or name
# the daemon cannot be reached or started (connection refused, ssh authentication failed, host key unknown or
# changed, tfrund missing on the box), or speaks another protocol version (like docker's 125); for `hosts check`,
# a step on the way to the daemon failed; for `submit --host POOL`, no member answered
EXIT_DAEMON = 125
# the job was lost: its shim vanished without recording an exit status (the machine rebooted, the shim was killed)
EXIT_LOST = 255
SPARE_EXIT_BYTES = 4096  # reserved per job outside its folder for its exit record (runner/shim/jobdir.py)
SIGNAL_EXIT_BASE = 128  # a job killed by signal N exits as 128+N, as a shell reports it (137: SIGKILL, 143: SIGTERM)

# Cancellation: SIGTERM to the job's process group, then SIGKILL after this many seconds.
DEFAULT_GRACE_S = 10.0
MAX_GRACE_S = 24 * 3600.0

# Wire limits: one frame's JSON header, and the raw bytes that may follow it.
MAX_HELLO_PROOF = 128  # characters of a hello's challenge or proof (hex of 32 bytes: 64)
MAX_HEADER_BYTES = 16 << 20  # the API's `jobs(all=True)` of many thousand jobs is one frame
MAX_PAYLOAD_BYTES = 4 << 20
LOG_CHUNK_BYTES = 256 << 10
FILE_CHUNK_BYTES = 1 << 20  # uploads and pulls
UPLOAD_WARN_BYTES = 100 << 20  # a work dir snapshot above this gets a warning naming its largest files

# How often the daemon looks at running jobs and growing logs when nothing woke it up earlier.
MONITOR_INTERVAL_S = 0.2
FOLLOW_POLL_S = 0.1  # a follower looks anyway after this long without a file event

# The daemon's config file in its home (tfrun/paths.py), and a setting's source when that file set it (`tfrun
# config` shows it; runner/config/settings.py, client/cli/daemonconfig.py).
CONFIG_FILE = "config.toml"

# Limits on what a request may carry. Lists are bounded by the header size too: a work dir of about
# 100,000 files still fits in one submit.
MAX_LIST_ITEMS = 1 << 20
MAX_ENV = 1024
MAX_STRING = 64 << 10
MAX_NAME = 128
MAX_STORAGE_URL = 512  # characters of an object storage URL (submit --checkpoints-to): tfrun/storage/place.py
MAX_CONTEXT = 10_000  # lines of `logs -A/-B` context a request may ask for
MAX_INT64 = (1 << 63) - 1  # the largest integer SQLite stores and C's off_t holds: the default bound of an int field
# `logs -e`: each pattern is compiled, and every filtered line matched against all of them together, so their
# number and size bound what one client's request costs the daemon.
MAX_PATTERNS = 1000
MAX_PATTERN_CHARS = 64 << 10  # all of a request's patterns together
FILTER_THREADS = 2  # threads that match `logs` patterns, so a costly filter never holds up the event loop
MAX_CANCEL_JOBS = 1000  # jobs one `cancel` names: each is looked up and signalled while other clients wait
MAX_RESTARTS = 1000  # submit --max-restarts
MAX_PRIORITY = 1_000_000  # submit --priority, either way
# submit --nodes (Slurm): srun reserves one port a task on every node (--resv-ports), from the cluster's
# MpiParams=ports range, which must hold that many
MAX_NODES = 128
MAX_ALERTS = 10_000  # alerts one `tfrun alerts` lists
MAX_TOP_RECENT = 100  # ended jobs `tfrun top` shows
PS_ALL_LAST = 100  # jobs `tfrun ps -a`'s table shows, the newest (`-n N` chooses; 0: all)
MAX_TOP_LOSSES = 1000  # losses per job `tfrun top` draws
MAX_LOSS_JOBS = 1000  # jobs one GetLosses asks about (a page of the jobs table asks about 50)

# A link that dies without closing (a laptop asleep, a Wi-Fi or VPN change, a NAT that forgot the flow): every
# SSH connection tfrun opens sends a keepalive after SSH_ALIVE_INTERVAL_S without a word from the box and is
# declared dead once SSH_ALIVE_COUNT_MAX of them go unanswered (15 s of silence), and a connect gives up after
# SSH_CONNECT_TIMEOUT_S. ~/.ssh/config's ServerAliveInterval, ServerAliveCountMax and ConnectTimeout win.
SSH_ALIVE_INTERVAL_S = 5.0
SSH_ALIVE_COUNT_MAX = 2
SSH_CONNECT_TIMEOUT_S = 15.0
# The known_hosts files OpenSSH reads when ~/.ssh/config names none (UserKnownHostsFile, GlobalKnownHostsFile):
# every one vouches for a box's key (client/link/knownhosts.py) and decides whom a kept connection may serve.
SSH_USER_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
SSH_GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
PROOF_TIMEOUT_S = 15.0  # how long a daemon at a remembered socket path has to answer the hello with its proof

# Sockets without XDG_RUNTIME_DIR (tfrun/private.py): a folder of the user's own under this shared one, named
# `tfrun-UID`; when another user took that name first, one under the user's cache folder instead.
SHARED_RUNTIME_ROOT = "/tmp"
CACHE_RUNTIME_DIR = ("tfrun", "run")  # under XDG_CACHE_HOME, else ~/.cache

# Seconds a client waits for a daemon it started to accept connections.
DAEMON_START_TIMEOUT_S = 30.0
HELLO_WAIT_S = 10.0  # how long `tfrund dial-stdio` waits for a client's hello before telling why no daemon started
MAX_CONFIG_VALUES = 1000  # the words of one `tfrun config set KEY VALUE...`
CONFIG_COUNT_DIGITS = 9  # `tfrun config set max_cpu_jobs N`: a count, never a number too long to write
# `wait`, `logs -f` and `submit` outlive any number of daemon restarts and dropped SSH links; they give up
# only once no daemon has answered for this long (TFRUN_RECONNECT_TIMEOUT, or reconnect_timeout in the
# client's config.toml), trying again every RECONNECT_PAUSE_S meanwhile.
DEFAULT_RECONNECT_TIMEOUT_S = 300.0
RECONNECT_PAUSE_S = 0.5
SPARE_COUNT = 4  # ready copies of recent snapshots that the daemon keeps for re-submits (runner/workdir/blobs.py)
SPARE_MAX_BYTES = 256 << 20  # no spare of a snapshot larger than this: it would double its disk use
# `tfrun metrics` of an ended job waits up to this long for the alert watch to finish reading its log.
METRICS_SETTLE_S = 5.0
MAX_METRIC_SAMPLES = 100_000  # the newest samples `tfrun metrics` gets at most: about 10 MB in one frame
MAX_METRIC_BUCKETS = 10_000  # a thinned answer's step ranges at most (GetMetrics.buckets): a chart's pixels
COMPLETE_VAR = "_TFRUN_COMPLETE"  # what the completion scripts set to ask `tfrun` for completions (click's name)
COMPLETION_TIMEOUT_S = 3.0  # Tab on a JOB asks the box for its job ids; one that has not answered by then offers none

# `tfrun hosts install`: where tfrund's venv goes on a box, and which of the box's Pythons may make it (tfrund
# needs 3.9: python3 first, then the newest python3.X), and the env naming a local folder of wheels for --offline.
DEFAULT_BOX_VENV = "~/.local/share/tfrun/venv"
MIN_BOX_PYTHON = (3, 9)
BOX_PYTHONS = ("python3", *(f"python3.{minor}" for minor in range(14, 8, -1)))
WHEELHOUSE_ENV = "TFRUN_WHEELHOUSE"
# Housekeeping (runner/housekeeping.py): `tfrun rm`, `prune`, `df`, and the uploaded contents kept.
MAX_REMOVE_JOBS = 1000  # jobs one `tfrun rm` names
BLOB_GRACE_S = 3600.0  # an uploaded content younger than this is never collected (blob_grace in config.toml)
END_ALERTS_WAIT_S = 5.0  # how long removing a job that just ended waits for its end alerts to be stored
DEFAULT_CONFIRM_UPLOAD_BYTES = 10**9  # `submit` asks on a terminal before sending more (confirm_upload_bytes)
# When the job interpreter has no TensorFlow, the doctor looks for interpreters on the box that have it: at
# most this many candidates, each given this long to answer, this many at a time; it names this many.
PYTHON_SEARCH_MAX = 40
PYTHON_SEARCH_TIMEOUT_S = 10.0
PYTHON_SEARCH_WORKERS = 8
PYTHONS_NAMED = 4

# tfrund's own secrets in its environment (the alert URLs of TFRUN_NOTIFY, the keys it stores checkpoints with):
# the daemon reads them, and neither a job nor a shim inherits them; a job that needs alerts asks the daemon
# (`--notify`), one that needs the keys is given them by its submit (`--env AWS_ACCESS_KEY_ID=...`).
DAEMON_ONLY_ENV = ("TFRUN_NOTIFY", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")

# A box is shared (issue 27): tfrund and its shims create everything private (umask 077: folders 0700, files
# 0600), and a job starts with the umask its user's daemon was started with, passed on in this variable, so
# the job's own outputs follow the user's habit. Work files keep their execute bit but never group or other
# write: a file sent with mode 0777 is built 0755 (the folders around it are the user's alone anyway).
PRIVATE_UMASK = 0o077
JOB_UMASK_ENV = "TFRUN_JOB_UMASK"
WORK_FILE_MODE_MASK = 0o755
PRIVATE_DIR_MODE = 0o700  # TFRUN_HOME and each job's checkpoint folder

# GPUs shared by every tfrund on the box (runner/shim/gpulease.py): leases held by the jobs' shims, in a folder of
# each user's own in this sticky one. A GPU where some process outside tfrun holds more memory than
# GPU_FOREIGN_BYTES (a notebook, another user's script) is not handed out either. While a job waits for a GPU
# held outside this daemon, it looks again every GPU_RECHECK_S (a lease's end makes no event).
GPU_LEASE_DIR = "/tmp/tfrun-gpus"
GPU_FOREIGN_BYTES = 256 << 20
GPU_RECHECK_S = 1.0
GPU_HELD_OUTSIDE = "held outside this daemon"  # in a job's waiting reason: `tfrun ps` then shows that reason
