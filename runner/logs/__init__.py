"""A job's log as clients read it: streamed as bytes or as terminal lines through `tfrun logs`' filters
(logstream.py, lines.py), and the kernel's file events that wake followers (inotify.py, loggrowth.py). Its
(offset, time) index for `--since` and `--timestamps` is the shim's (runner/shim/logindex.py).

Stands on: shim. A job is what logstream.py's LoggedJob says it needs, not a record of records/. Never the
job's process: the job writes its log itself, and no pipe the daemon holds is in its way.
"""
