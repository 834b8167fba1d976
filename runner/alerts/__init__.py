"""The alert path: the rules and their settings (rules.py), what a line or a metric fires (spikes.py: loss
spikes; an OOM is records/oom.py's), the watch over each job (watch.py: stalls, ends; jobwatch.py: where it
stands in a job's output), the box's GPU memory (gpumemory.py), an alert's summary and message (alertmessage.py)
and its text for each receiver (alerttext.py), and the outbox (outbox.py), which stores every alert before it
sends it and retries until it is sent or expires.

Stands on: metrics, gpus, records, logs (file events, terminal lines), shim. Its settings: AlertConfig.
"""
