"""What a person sees: jobs' tables (render.py), reports of alerts, metrics, GPUs and checks (reports.py), styled
lines and tables without rich's console (styled.py), `ps`'s cut (joblist.py), `top` (top.py) and plots (plot.py).

Stands on: link (a followed look), calls, config, errors.
"""
