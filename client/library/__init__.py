"""The Python API: `Client` and `JobHandle` (api.py), `AsyncClient` (asyncclient.py), and what a submit does
(submission.py). `tfrun.Client` is api.py's.

Stands on: files, link, calls, config, errors.
"""
