"""Authenticated messages on the internal sockets (API process <-> engine processes).

Every message is two frames: the server's per-run secret, then the payload. A receiver
accepts a payload only behind the right secret (compared in constant time), so a process
that can reach the socket but does not hold the secret cannot command an engine or forge
an engine's report. The secret reaches engine processes inside their spawn arguments, never
on a command line or in the environment.
"""

from __future__ import annotations

import hmac
import logging
import secrets
from typing import Any

log = logging.getLogger("mstar.server")


def new_secret() -> bytes:
    return secrets.token_bytes(32)


class SignedSocket:
    """A sending zmq socket that puts the secret in front of every payload."""

    def __init__(self, sock: Any, secret: bytes) -> None:
        self.sock = sock
        self.secret = secret

    def send(self, payload: bytes, flags: int = 0) -> None:
        self.sock.send_multipart([self.secret, payload], flags)


def authenticated(frames: list[bytes], secret: bytes, where: str) -> bytes | None:
    """The payload of ``frames`` if they carry ``secret``; else ``None`` (logged, dropped)."""
    if len(frames) == 2 and hmac.compare_digest(frames[0], secret):
        return frames[1]
    log.warning("%s: dropped a message without the server's secret (%d frame(s), %d bytes)", where, len(frames), sum(map(len, frames)))
    return None
