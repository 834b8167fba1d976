"""The alert path: the rules and their settings (rules.py), what a line or a metric fires (oom.py: OOM text;
spikes.py: loss spikes), the watch over each job (watch.py: stalls, ends; jobwatch.py: where it stands in a job's
output), the box's GPU memory (gpumemory.py), an alert's summary and message (alertmessage.py) and its text for
each receiver (alerttext.py), and the outbox (outbox.py), which stores every alert before it sends it and retries
until it is sent or expires.

May touch: records, metrics, logs (file events, terminal lines), box (config, GPUs), executors (the OOM killer's
count, a Slurm task's log).
"""
