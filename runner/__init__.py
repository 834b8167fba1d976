"""tfrund, the daemon on the box: it runs jobs through shims, records them in SQLite, serves the protocol.

Kept empty on purpose: the shim (`tfrun.runner.shim`) is started once per job and must stay cheap, and
importing it imports this package first.
"""
