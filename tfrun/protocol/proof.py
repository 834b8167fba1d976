"""How a daemon proves it is the user's own when the client cannot see who listens.

A local client checks the peer of the daemon's socket (SO_PEERCRED: tfrun/private.py). Through SSH's socket
forwarding it cannot: sshd connects to whatever listens at the path, and a daemon whose home is too long for a
socket path listens in `/tmp/tfrun-UID`, a name another user of the box can take after a reboot or a /tmp
clean-up. So the fast path trusts a remembered path only once the daemon behind it proves it holds the daemon's
key (`GetDaemonKey`, learnt through the exec channel, which runs as the user): the client's `Hello` carries a
fresh random challenge, the daemon's answers with HMAC-SHA256(key, challenge). Another user's listener cannot
answer it, and it cannot relay the challenge to the real daemon, which hangs up on other users unheard.

The client sends nothing but its hello before the proof is checked. hashlib is imported only here, and this
module only on the paths that prove (a local `tfrun ps` never pays for OpenSSL).
"""

from __future__ import annotations

import hmac
import secrets

KEY_BYTES = 32  # the daemon key's length: a 256-bit secret for HMAC-SHA256
CHALLENGE_BYTES = 32
_CONTEXT = b"tfrund hello proof\0"  # so a proof can never be mistaken for an HMAC made for another purpose


def new_challenge() -> str:
    """A fresh challenge for one hello, as hex."""
    return secrets.token_hex(CHALLENGE_BYTES)


def proof_of(key: bytes, challenge: str) -> str:
    """What the daemon holding `key` answers to `challenge`, as hex."""
    return hmac.new(key, _CONTEXT + challenge.encode("ascii", "replace"), "sha256").hexdigest()


def proves(key: bytes, challenge: str, proof: str) -> bool:
    """Whether `proof` is the answer of the daemon holding `key` to `challenge` (in constant time)."""
    return hmac.compare_digest(proof_of(key, challenge), proof)
