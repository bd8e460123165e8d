"""Start-up progress bars of ``mstar serve`` on a terminal (a pseudo-terminal here):
weights loading per node, engines starting, warm-up, then the ready line. (That a log
file gets none is checked in test_serve_hub.py.)"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import socket
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
READY = b"mstar serve ready:"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_on_a_terminal(args: list[str], timeout: float = 180.0) -> str:
    """What the server writes to its terminal up to the end of its ready line."""
    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 150, 0, 0))  # tqdm needs a width
    cmd = [sys.executable, "-m", "mstar.cli", "serve", *args, "--port", str(_free_port())]
    proc = subprocess.Popen(cmd, stdout=secondary, stderr=secondary, start_new_session=True)
    os.close(secondary)
    out = b""
    try:
        deadline = time.monotonic() + timeout
        while not (READY in out and out.endswith(b"\n")) and time.monotonic() < deadline and proc.poll() is None:
            if select.select([primary], [], [], 0.5)[0]:
                try:
                    out += os.read(primary, 65536)
                except OSError:
                    break
    finally:
        proc.terminate()
        proc.wait(60)
        os.close(primary)
    return out.decode(errors="replace")


def test_progress_bars_on_a_terminal_then_the_ready_line(toy_checkpoint: Path) -> None:
    text = _serve_on_a_terminal([str(toy_checkpoint), "--preprocess-workers", "1", "--log-level", "warning"])
    assert READY.decode() in text, text[-3000:]
    frames = text.replace("\r", "\n")
    # toy: the lm node has 23 tensors, the decoder 6; bars are redrawn at most every 0.1 s
    # and cleared when done, so only their first frame is certain
    for bar in ("loading lm weights:", "/23 [", "loading decoder weights:", "/6 [", "starting engines:", "warming up:"):
        assert bar in frames, (bar, frames[-3000:])
    assert frames.index("starting engines:") < frames.index("warming up:") < frames.index(READY.decode())

