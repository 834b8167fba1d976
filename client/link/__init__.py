"""Reaching a daemon: this machine's on its Unix socket (connection.py, syncchannel.py without asyncio), a box's
over SSH (ssh.py: the fast path and its proof; keeper.py, keeperclient.py, keepertrust.py: one connection per box
held open; tunnel.py, forward.py: ports; remotecommand.py, knownhosts.py, hostcache.py, hostcheck.py), a local
port's peer told by its uid (loopback.py), and carrying on through a daemon that goes away (follow.py).

Stands on: calls, config, errors.
"""
