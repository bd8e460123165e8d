"""Real ``mstar serve`` processes on loopback for end-to-end tests (one per module)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

API_KEY = "e2e-secret-key"
SHM_DIR = Path("/dev/shm")
FAULTY_PLUGIN = Path(__file__).resolve().parents[1] / "fixtures" / "plugins" / "faulty"
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (read from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def shm_segments() -> set[str]:
    return {p.name for p in SHM_DIR.glob("mstar_*")} if SHM_DIR.is_dir() else set()


class ServerProcess:
    def __init__(self, args: list[str], log_path: Path, api_key: str | None = None, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.env = env
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = args
        self.log_path = log_path
        self.api_key = api_key
        self.proc: subprocess.Popen | None = None
        self.shm_before = shm_segments()
        self.children: set[int] = set()

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def start(self, timeout: float = 180.0) -> None:
        cmd = [sys.executable, "-m", "mstar.cli", "serve", *self.args, "--port", str(self.port)]
        if self.api_key:
            cmd += ["--api-key", self.api_key]
        self.log = self.log_path.open("wb")
        # Its own session: a stray process can be killed as a group in teardown.
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True, env=self.env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode} during start-up:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    self.children = descendants(self.proc.pid)
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server not healthy after {timeout}s:\n{self.log_tail()}")

    def health(self) -> httpx.Response:
        # With the key: a server with one shows engine pids and exit text to its holders only.
        return httpx.get(f"{self.url}/health", headers=self.headers, timeout=5)

    def engine_pids(self) -> dict[str, int]:
        return {name: e["pid"] for name, e in self.health().json()["engines"].items()}

    def metric(self, name: str, **labels: str) -> float:
        text = httpx.get(f"{self.url}/metrics", timeout=5).text
        want = ",".join(f'{k}="{v}"' for k, v in labels.items())
        total = 0.0
        found = False
        for line in text.splitlines():
            if line.startswith("#"):
                continue
            key, _, value = line.rpartition(" ")
            metric, _, lab = key.partition("{")
            if metric == name and (not want or all(f'{k}="{v}"' in lab for k, v in labels.items())):
                total += float(value)
                found = True
        if not found:
            raise KeyError(f"metric {name}{{{want}}} not found")
        return total

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.children |= descendants(self.proc.pid)
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
                raise AssertionError(f"server ignored signal {sig} for {timeout}s:\n{self.log_tail()}") from None
        self.log.close()
        return self.proc.returncode

    def kill_all(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    def assert_clean_exit(self) -> None:
        """No process of the server left, no shared-memory segment left."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(running(p) for p in self.children):
            time.sleep(0.1)
        left = [p for p in self.children if running(p)]
        assert not left, f"orphan processes {left} after shutdown:\n{self.log_tail()}"
        leaked = shm_segments() - self.shm_before
        assert not leaked, f"leaked shared-memory segments {sorted(leaked)}"


def _pip(*args: str | Path) -> None:
    proc = subprocess.run([*PIP, *map(str, args)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"pip {args[0]} failed:\n{proc.stdout}\n{proc.stderr}"


@pytest.fixture(scope="session")
def faulty_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``faultytoy`` fixture plugin (tests/fixtures/plugins/faulty) installed, with real
    dist-info and entry point, into a folder of its own: pass ``with_site(it)`` as env."""
    root = tmp_path_factory.mktemp("faulty-plugin")
    src = root / "src"  # a copy: setuptools' build/ and egg-info never litter the repo
    shutil.copytree(FAULTY_PLUGIN, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    _pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", root / "wheels", src)
    _pip("install", "--no-deps", "--no-index", "--target", root / "site", *(root / "wheels").glob("*.whl"))
    return root / "site"


def with_site(site: Path, **extra: str) -> dict[str, str]:
    """This process's environment with ``site`` on PYTHONPATH (after any given already)."""
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(site)) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


@pytest.fixture(scope="session")
def toy_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mstar_toy.checkpoint import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("toy-ckpt"))


@pytest.fixture(scope="session")
def start_server(tmp_path_factory: pytest.TempPathFactory, toy_checkpoint: Path) -> Iterator:
    """``start_server(extra_args, api_key=None, env=None) -> ServerProcess``; stopped at
    session end unless the test stopped it. A ``--model`` in ``extra_args`` replaces the toy
(on the toy's weights)."""
    servers: list[ServerProcess] = []

    def start(extra: list[str] | None = None, api_key: str | None = None, env: dict[str, str] | None = None) -> ServerProcess:
        log = tmp_path_factory.mktemp("server") / "server.log"
        extra, model = list(extra or []), "toy"
        if "--model" in extra:  # one model on the toy's weights (a repeated --model would add a second)
            i = extra.index("--model")
            model = extra.pop(i + 1)
            del extra[i]
        server = ServerProcess(["--model", model, "--weights", str(toy_checkpoint), *extra], log, api_key, env)
        servers.append(server)
        server.start()
        return server

    yield start
    for server in servers:
        try:
            server.stop()
        except AssertionError:
            pass
        finally:
            server.kill_all()
