"""Many boxes as one: a pool's members asked at once (members.py), where `submit --host POOL` puts a job
(placement.py) and a pool's `top` (top.py).

Stands on: library, views, link, calls, config, errors.
"""
