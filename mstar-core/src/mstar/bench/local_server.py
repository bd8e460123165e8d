"""A ``mstar serve`` subprocess on a free loopback port, for benchmark scripts."""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalServer:
    """``with LocalServer(["--model", "toy", "--random-weights"]) as url: ...`` starts
    ``mstar serve ARGS`` (its log in a temporary file), waits until ``/health`` answers 200,
    and terminates it on exit."""

    def __init__(self, args: Sequence[str], startup_timeout_s: float = 600.0, env: Mapping[str, str] | None = None) -> None:
        self.env = dict(env) if env is not None else None
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = [*args, "--port", str(self.port)]
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen | None = None
        self.log_path = ""

    def __enter__(self) -> str:
        log = tempfile.NamedTemporaryFile(prefix="mstar-serve-", suffix=".log", delete=False)  # noqa: SIM115 (lives with the server)
        self.log_path = log.name
        self.proc = subprocess.Popen([sys.executable, "-m", "mstar.cli", "serve", *self.args], stdout=log, stderr=subprocess.STDOUT, env=self.env)
        log.close()
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mstar serve exited with {self.proc.returncode}; see {self.log_path}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self.url
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.__exit__()
        raise RuntimeError(f"mstar serve not healthy after {self.startup_timeout_s}s; see {self.log_path}")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
