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
import math
import secrets
import time
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


MIN_MAX_MESSAGE_BYTES = 64 << 20
DROP_LOG_INTERVAL_S = 10.0


def max_message_bytes(shm_threshold: int, max_body_bytes: int) -> int:
    """The largest frame a receiving internal socket accepts (``zmq.MAXMSGSIZE``; a peer
    sending a larger one is disconnected before it is buffered whole): tensors of
    ``shm_threshold`` bytes and more travel through shared memory, so a message holds small
    ones only, plus at most a request body's worth. 0 (no cap) when nothing goes through
    shared memory (engines on other machines)."""
    if shm_threshold >= 1 << 40:
        return 0
    return max(MIN_MAX_MESSAGE_BYTES, 2 * max_body_bytes, 256 * shm_threshold)


def cap_frames(sock: Any, max_bytes: int) -> None:
    """Set ``zmq.MAXMSGSIZE`` on a receiving socket (before it binds or connects)."""
    import zmq

    if max_bytes > 0:
        sock.setsockopt(zmq.MAXMSGSIZE, max_bytes)


class _DropLog:
    """One log line per ``DROP_LOG_INTERVAL_S`` per socket, with the count since the last."""

    def __init__(self) -> None:
        self.last: dict[str, float] = {}
        self.count: dict[str, int] = {}

    def dropped(self, where: str, frames: int, nbytes: int) -> None:
        now = time.monotonic()
        self.count[where] = self.count.get(where, 0) + 1
        if now - self.last.get(where, -math.inf) >= DROP_LOG_INTERVAL_S:
            n = self.count.pop(where)
            self.last[where] = now
            log.warning("%s: dropped %d message(s) without the server's secret (the last: %d frame(s), %d bytes); "
                        "next report in %gs at the earliest", where, n, frames, nbytes, DROP_LOG_INTERVAL_S)


_drops = _DropLog()


def authenticated(frames: list[bytes], secret: bytes, where: str) -> bytes | None:
    """The payload of ``frames`` if they carry ``secret``; else ``None`` (dropped, and
    counted in a rate-limited log line). The secret frame is checked before anything else."""
    if len(frames) == 2 and hmac.compare_digest(frames[0], secret):
        return frames[1]
    _drops.dropped(where, len(frames), sum(map(len, frames)))
    return None
