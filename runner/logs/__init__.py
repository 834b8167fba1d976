"""A job's log as clients read it: streamed as bytes or as terminal lines through `tfrun logs`' filters
(logstream.py, lines.py), its (offset, time) index for `--since` and `--timestamps` (logindex.py), and the
kernel's file events that wake followers (inotify.py, loggrowth.py).

May touch: records, executors (a Slurm task's log name). Never the job's process: the job writes its log
itself, and no pipe the daemon holds is in its way.
"""
