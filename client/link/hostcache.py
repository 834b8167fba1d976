"""What the client learnt of each box's daemon (hosts.json in the client's cache folder): where its socket is,
and whether the box refuses to forward to it, so that the next connection goes straight there (client/link/ssh.py).
No asyncssh here: reading it costs a verb nothing it would not pay anyway."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from ..config import privatefiles


class SocketCache:
    """What we learnt of each host's daemon: its socket path, and whether forwarding to it is refused.

    Kept in hosts.json, this user's alone (client/config/privatefiles.py: 0600 in a 0700 folder, written in one
    rename). A host is filed under a digest of its identity, never the identity itself, which holds its --env
    values (a token); entries an older tfrun filed under the identity are dropped when the file is read."""

    def __init__(self) -> None:
        self.path = privatefiles.cache_dir() / "hosts.json"
        self.data: dict[str, Any] = self._on_disk()

    def get(self, key: str) -> dict[str, Any]:
        entry = self.data.get(_digest(key))
        return entry if isinstance(entry, dict) else {}

    def put(self, key: str, **values: Any) -> None:
        """Merge `values` into the file as it is now: a keeper connecting to several boxes at once learns of
        each in turn, and must not write back what it read before the others were learnt."""
        self.data = {**self.data, **self._on_disk()}
        self.data[_digest(key)] = {**self.get(key), **values}
        privatefiles.write(self.path, json.dumps(self.data).encode())

    def _on_disk(self) -> dict[str, Any]:
        """The file's entries filed by digest; none if it is missing or broken (a cache: learnt again)."""
        try:
            found = json.loads(privatefiles.read(self.path) or b"{}")
        except ValueError:
            return {}
        return {k: v for k, v in found.items() if _HEX_DIGEST.fullmatch(k)} if isinstance(found, dict) else {}


_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")


def _digest(identity: str) -> str:
    """What hosts.json files a host under: its identity's SHA-256, which tells no --env value."""
    return hashlib.sha256(identity.encode()).hexdigest()
