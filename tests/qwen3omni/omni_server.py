"""``mstar serve --model qwen3omni`` in a subprocess for the HTTP tests: a free loopback port,
waiting for ``/health``, and SIGTERM (then SIGKILL of its process group) at the end."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx


@contextlib.contextmanager
def omni_server(args: list[str], log_path: Path, env: dict[str, str] | None = None, start_s: float = 600,
                weights: Path | None = None) -> Iterator[str]:
    """Yields the server's URL. ``args`` follow ``mstar serve --model qwen3omni --random-weights``
    (``--weights weights`` when given); ``start_s``: a loaded 2-core machine writes the random
    checkpoint and warms up for minutes."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    source = ["--weights", str(weights)] if weights is not None else ["--random-weights"]
    cmd = [sys.executable, "-m", "mstar.cli", "serve", "--model", "qwen3omni", *source, "--port", str(port), *args]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + start_s
        try:
            while True:
                assert proc.poll() is None, f"server exited with {proc.returncode}: {log_path.read_text()[-3000:]}"
                assert time.monotonic() < deadline, log_path.read_text()[-3000:]
                try:
                    if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
            yield url
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
