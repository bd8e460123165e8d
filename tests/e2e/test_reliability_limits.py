"""Issue 33: what a hostile client or local process can hold, and how the server outlives its
own parts, through a real ``mstar serve`` on loopback: an oversized header and a slowloris
body (raw sockets), junk and oversized frames on the internal sockets, a SIGKILLed API
process (no orphans, no leftovers), and engine restarts as a rate, not a lifetime cap."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
import zmq
from conftest import descendants, running, shm_segments

pytestmark = pytest.mark.e2e

CHAT = b'{"model": "toy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _semaphores() -> set[str]:
    return {p.name for p in Path("/dev/shm").glob("sem.mp-*")}


def _semaphores_of(pids: set[int]) -> set[str]:
    """The multiprocessing semaphores these processes have open (mapped)."""
    out: set[str] = set()
    for pid in pids:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        out |= {line.rsplit("/", 1)[1] for line in maps.splitlines() if "/dev/shm/sem.mp-" in line}
    return out


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.fixture(scope="module")
def ipc_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("ipc")


@pytest.fixture(scope="module")
def server(start_server, ipc_root):
    env = {**os.environ, "TMPDIR": str(ipc_root)}
    srv = start_server(["--preprocess-workers", "1", "--header-timeout", "2", "--body-timeout", "2"], env=env)
    yield srv
    srv.kill_all()


def _connect(server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def _read_all(s: socket.socket, timeout: float) -> bytes:
    """What the server sends until it closes the connection (or ``timeout``)."""
    s.settimeout(timeout)
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return out


# ---- finding 3: the HTTP layer ---------------------------------------------------------------


def test_oversized_header_is_refused_without_growing_memory(server):
    pid = server.proc.pid
    before = rss_mib(pid)
    for _ in range(4):
        s = _connect(server)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ")
        sent = 0
        try:
            while sent < (32 << 20):  # 32 MiB of one header line, never ended
                s.sendall(b"a" * (1 << 20))
                sent += 1 << 20
        except OSError:
            pass  # the server closed it: what we want
        reply = _read_all(s, 5)
        s.close()
        assert sent < (32 << 20) or reply.startswith(b"HTTP/1.1 400"), (sent, reply[:80])
        assert not reply or reply.startswith((b"HTTP/1.1 400", b"HTTP/1.1 431")), reply[:80]
    assert rss_mib(pid) - before < 40, (before, rss_mib(pid))
    assert server.health().status_code == 200


def test_slowloris_headers_and_bodies_are_cut_and_health_answers_meanwhile(server):
    pid = server.proc.pid
    fds_before = open_fds(pid)
    stalled = []
    for i in range(60):
        s = _connect(server)
        if i % 2:  # a body promised and never sent
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n" + CHAT[:20])
        else:  # headers never finished
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        stalled.append(s)
    # While they are open, health and chat answer at once.
    t0 = time.monotonic()
    assert server.health().status_code == 200
    r = httpx.post(f"{server.url}/v1/chat/completions", content=CHAT, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 200, r.text
    assert time.monotonic() - t0 < 10
    # A trickling body does not keep its connection either: a byte a second, past the timeout.
    trickle = _connect(server)
    trickle.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
    t0 = time.monotonic()
    closed = False
    while time.monotonic() - t0 < 8:
        try:
            trickle.sendall(b" ")
        except OSError:
            closed = True
            break
        trickle.settimeout(0.5)
        try:
            data = trickle.recv(65536)
        except TimeoutError:
            continue
        assert data.startswith(b"HTTP/1.1 408") or not data, data[:80]
        closed = True
        break
    assert closed, "a trickling body kept its connection past --body-timeout"
    trickle.close()
    # Every stalled connection was cut (408 for the bodies) within the timeouts.
    for i, s in enumerate(stalled):
        reply = _read_all(s, 6)
        if i % 2:
            assert reply.startswith(b"HTTP/1.1 408"), reply[:120]
        else:
            assert reply == b"", reply[:120]
        s.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and open_fds(pid) > fds_before + 5:
        time.sleep(0.2)
    assert open_fds(pid) <= fds_before + 5, (fds_before, open_fds(pid))


# ---- finding 5: the internal sockets -------------------------------------------------------------


def test_oversized_frames_and_junk_floods_on_internal_sockets(server, ipc_root):
    (ipc,) = ipc_root.glob("mstar-*")
    pid = server.proc.pid
    engine_pid = server.engine_pids()["0"]
    rss_api, rss_engine = rss_mib(pid), rss_mib(engine_pid)
    ctx = zmq.Context()
    try:
        # A 256 MiB frame to each receiving socket: refused at the cap, never held whole.
        big = b"\0" * (256 << 20)
        for target in (ipc / "engine-0-0", ipc / "reports"):
            sock = ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.connect(f"ipc://{target}")
            sock.send_multipart([b"x" * 32, big], copy=False)
            sock.close(linger=3000)
        del big
        time.sleep(1)
        assert rss_mib(pid) - rss_api < 100, (rss_api, rss_mib(pid))
        assert rss_mib(engine_pid) - rss_engine < 100, (rss_engine, rss_mib(engine_pid))
        # A junk flood on the report socket: health stays quick, the log does not explode.
        stop = threading.Event()

        def flood(target: Path) -> None:
            sock = ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.SNDHWM, 1000)
            sock.connect(f"ipc://{target}")
            while not stop.is_set():
                try:
                    sock.send_multipart([b"j" * 32, b"junk"], zmq.NOBLOCK)
                except zmq.Again:
                    time.sleep(0.0005)
            sock.close(linger=0)

        log_size = server.log_path.stat().st_size
        floods = [threading.Thread(target=flood, args=(ipc / "reports",)), threading.Thread(target=flood, args=(ipc / "engine-0-0",))]
        for t in floods:
            t.start()
        try:
            time.sleep(0.5)
            worst = 0.0
            for _ in range(10):
                t0 = time.monotonic()
                assert server.health().status_code == 200
                worst = max(worst, time.monotonic() - t0)
                time.sleep(0.2)
        finally:
            stop.set()
            for t in floods:
                t.join()
        assert worst < 1.0, f"/health took {worst:.2f}s during a junk flood"
        assert server.log_path.stat().st_size - log_size < 20_000
    finally:
        ctx.destroy(linger=0)
    r = httpx.post(f"{server.url}/v1/chat/completions", content=CHAT, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 200, r.text
    assert server.engine_pids()["0"] == engine_pid


# ---- finding 6: a killed API process leaves nothing behind ------------------------------------------


def test_sigkilled_api_process_leaves_no_orphans_or_leftovers(start_server, tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    srv = start_server(["--preprocess-workers", "1"], env=env)
    r = httpx.post(f"{srv.url}/v1/chat/completions", content=CHAT, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 200
    children = descendants(srv.proc.pid)
    assert len(children) >= 3, children  # engine, preprocess worker, resource tracker
    ours = _semaphores_of({srv.proc.pid, *children})  # the preprocess pool's (multiprocessing's)
    assert ours
    os.kill(srv.proc.pid, signal.SIGKILL)
    srv.proc.wait(10)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(running(p) for p in children):
        time.sleep(0.2)
    assert not [p for p in children if running(p)], "orphans after the API process was killed"
    assert not list(tmp_path.glob("mstar-*")), "the ipc folder was left behind"
    assert not (shm_segments() - srv.shm_before), "shared-memory segments were left behind"
    while time.monotonic() < deadline and ours & _semaphores():
        time.sleep(0.2)
    assert not ours & _semaphores(), f"semaphores left behind: {sorted(ours & _semaphores())}"


# ---- finding 7: restarts are a rate ------------------------------------------------------------------


def _wait_restarted(srv, restarts: int, timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = srv.health()
        if r.status_code == 200 and r.json()["engines"]["0"]["restarts"] == restarts:
            return r.json()
        time.sleep(0.2)
    raise AssertionError(srv.log_tail())


def test_restarts_are_a_rate_not_a_lifetime_cap(start_server):
    window = 6.0
    srv = start_server(["--preprocess-workers", "0", "--max-engine-restarts", "1", "--engine-restart-window", str(window)])
    last_restart = None
    for n in range(1, 4):  # three deaths, spaced over windows: more than the old lifetime cap (1)
        if last_restart is not None:
            time.sleep(max(0.0, last_restart + window + 0.5 - time.monotonic()))
        os.kill(srv.engine_pids()["0"], signal.SIGKILL)
        last_restart = time.monotonic()
        _wait_restarted(srv, n)
    r = httpx.post(f"{srv.url}/v1/chat/completions", content=CHAT, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 200
    # Two deaths within one window: more than --max-engine-restarts 1 allows, so it stays down.
    assert time.monotonic() - last_restart < window, "the engine took longer than the window to restart"
    os.kill(srv.engine_pids()["0"], signal.SIGKILL)
    time.sleep(2.5)
    health = srv.health()
    assert health.status_code == 503 and health.json()["status"] == "unhealthy", health.text
    assert health.json()["engines"]["0"]["restart_limit_reached"] is True
    srv.kill_all()


def test_a_websocket_outlives_the_header_timeout(server):
    from websockets.sync.client import connect

    url = server.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    with connect(url, proxy=None, open_timeout=30) as ws:
        time.sleep(3.5)  # past --header-timeout 2: the timer is for HTTP, not for an upgraded socket
        assert ws.ping().wait(5)
