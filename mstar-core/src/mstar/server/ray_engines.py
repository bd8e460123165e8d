"""Engines as Ray actors (``mstar serve --placement-backend ray``).

Each engine process of the placement becomes one Ray actor, scheduled by its group's
resource request (``resources: {GPU: 1, my_label: 1}``, ``node: <ip>``). Inside the actor an
``EngineWorker`` runs as in a local engine process; only the transport differs: the actor
binds the engine's command socket on its node's TCP address (a free port) and reports that
address, the engine connects to the API process's report socket over TCP, and tensors travel
inline in the messages (nodes share no memory). Every message still carries the server's
per-run secret (``mstar.server.ipc_auth``), so a peer that can reach a port but lacks the
secret is dropped; the secret reaches an actor in its method call's arguments (Ray's own
RPC), never on a command line.

Lifecycle: ``bind`` (creates the worker, binds the socket; the API process connects), then
``run`` (builds the engine and serves until ``stop``, a Shutdown command or a fatal error;
returns the exit code). A killed actor or a lost node makes ``run``'s result raise, which
the handle reports as the engine's exit; the runtime then fails the engine's requests and,
with ``--restart-engines``, its supervisor starts a new actor (Ray's own restart stays off,
so back-off and ``/health`` behave as on one machine).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import zmq

from mstar.server.engine_handle import EngineHandle
from mstar.server.engine_process import EngineProcessSpec, EngineWorker
from mstar.server.placement import DeviceGroup, Placement

log = logging.getLogger("mstar.server")

# No tensor goes through shared memory: an engine may sit on another node.
NO_SHM = 1 << 62


def _tcp_host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip


def actor_options(group: DeviceGroup) -> dict[str, Any]:
    """Ray actor options for one engine of ``group``: CPU (default 1), GPU and memory from
    its ``resources``, the other keys as custom resources, ``node`` as Ray's node:<ip>
    resource. Ray's own restarts stay off (our supervisor restarts, with back-off)."""
    custom = dict(group.resources)
    options: dict[str, Any] = {
        "num_cpus": custom.pop("CPU", 1),
        "num_gpus": custom.pop("GPU", 0),
        "max_restarts": 0,
        "max_concurrency": 2,  # stop() arrives while run() serves
    }
    if "memory" in custom:
        options["memory"] = custom.pop("memory")
    if group.node:
        custom[f"node:{group.node}"] = 0.001
    if custom:
        options["resources"] = custom
    return options


def _needs(options: dict[str, Any]) -> dict[str, float]:
    need = {"CPU": options["num_cpus"], "GPU": options["num_gpus"], **options.get("resources", {})}
    if "memory" in options:
        need["memory"] = options["memory"]
    return {k: v for k, v in need.items() if v}


def check_feasible(placement: Placement, nodes: list[dict[str, Any]]) -> None:
    """A group no alive node of the cluster could ever host fails start-up in one line
    (Ray would otherwise wait for such a node forever)."""
    alive = [n.get("Resources", {}) for n in nodes if n.get("Alive")]
    for group in placement.groups:
        need = _needs(actor_options(group))
        if not any(all(res.get(k, 0) >= v for k, v in need.items()) for res in alive):
            raise ValueError(
                f"placement group {group.name!r} requests {need}, which no node of the Ray cluster has "
                f"(its nodes: {[{k: v for k, v in r.items() if not k.startswith('object_store')} for r in alive]})"
            )


class EngineActor:
    """The body of one engine actor (wrapped by ``ray.remote`` in the API process)."""

    def __init__(self) -> None:
        self.stop_event = threading.Event()
        self.ctx = zmq.Context()
        self.worker: EngineWorker | None = None
        self.commands: Any = None

    def bind(self, spec_bytes: bytes) -> tuple[str, int, str, str]:
        """Create the engine worker and bind its command socket on this node; returns
        (command address, pid, node IP, Ray node id)."""
        import ray

        spec = msgspec.msgpack.decode(spec_bytes, type=EngineProcessSpec)
        # The engine stops when its parent (the node's raylet) is gone; Ray itself ends the
        # actor when its owner, the API process, exits.
        spec.parent_pid = os.getppid()
        logging.basicConfig(level=spec.log_level.upper(), format=f"%(asctime)s engine[{spec.name}] %(levelname)s %(message)s")
        ip = ray.util.get_node_ip_address()
        self.commands = self.ctx.socket(zmq.PULL)
        self.commands.bind(f"tcp://{_tcp_host(ip)}:*")
        spec.command_addr = self.commands.getsockopt_string(zmq.LAST_ENDPOINT)
        self.worker = _BoundWorker(spec, self.stop_event, self.commands)
        return spec.command_addr, os.getpid(), ip, ray.get_runtime_context().get_node_id()

    def run(self) -> int:
        """Build the engine and serve until stopped (or a fatal error): its exit code."""
        assert self.worker is not None, "bind first"
        try:
            return self.worker.run()
        finally:
            self.commands.close(linger=0)
            self.ctx.term()

    def stop(self) -> None:
        """End ``run`` cleanly (called while ``run`` serves, hence two concurrent calls)."""
        self.stop_event.set()


class _BoundWorker(EngineWorker):
    def __init__(self, spec: EngineProcessSpec, stop: threading.Event, commands: Any) -> None:
        super().__init__(spec, stop)
        self._bound = commands

    def _command_socket(self) -> Any:
        return self._bound


@dataclass
class _ActorProcess:
    pid: int  # the actor's process on its node (what /health reports)


class RayEngineHandle(EngineHandle):
    """The API process's handle on one engine actor (same interface as a local engine's)."""

    def __init__(self, spec: EngineProcessSpec, ctx: zmq.Context, actor_class: Any, options: dict[str, Any]) -> None:
        # No super().__init__: the command address is known only once the actor bound it.
        self.spec = spec
        self.name = spec.name
        self.nodes = tuple(spec.nodes)
        self.process: _ActorProcess | None = None
        self.sock = ctx.socket(zmq.PUSH)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.ready = False
        self.down_reason: str | None = None
        self.stats = None
        self.actor_class = actor_class
        self.options = options
        self.actor: Any = None
        self.node_ip: str | None = None
        self.node_id: str | None = None
        self.command_addr: str | None = None
        self._run_ref: Any = None
        self._exit: str | None = None
        self._stopping = False
        self._task: asyncio.Task | None = None

    @property
    def alive(self) -> bool:
        return self.down_reason is None and self.actor is not None and self._exit is None

    def describe(self) -> dict[str, Any]:
        return {"ray_node": self.node_ip, "ray_node_id": self.node_id, "command_addr": self.command_addr}

    def start(self) -> None:
        self.actor = self.actor_class.options(**self.options).remote()
        log.info("engine %s (nodes %s, %s) requested as a Ray actor with %s", self.name, list(self.nodes), self.spec.device, self.options)

    def watch(self, loop: asyncio.AbstractEventLoop, on_exit: Callable[[EngineHandle], None]) -> None:
        self._task = loop.create_task(self._lifecycle(on_exit))

    async def _lifecycle(self, on_exit: Callable[[EngineHandle], None]) -> None:
        try:
            addr, pid, ip, node_id = await self.actor.bind.remote(msgspec.msgpack.encode(self.spec))
            self.sock.connect(addr)
            self.command_addr, self.process, self.node_ip, self.node_id = addr, _ActorProcess(pid), ip, node_id
            log.info("engine %s: Ray actor pid %s on node %s, commands at %s", self.name, pid, ip, addr)
            # Only now (connected) may it build and report Ready.
            self._run_ref = self.actor.run.remote()
            code = await self._run_ref
            self._exit = f"exited with code {code}"
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the actor died (killed, its node lost, or it failed to start)
            self._exit = "Ray actor died: " + (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        if not self._stopping:
            on_exit(self)

    def reap(self) -> None:
        pass  # Ray collects the actor's process

    def exit_description(self) -> str:
        return self._exit or "is not running"

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the engine to stop (its stop event, through Ray: no command socket needed),
        wait up to ``timeout`` for it, then kill the actor: never leave it running."""
        import ray

        self._stopping = True
        if self.actor is not None:
            if self._exit is None and self._run_ref is not None:
                try:
                    self.actor.stop.remote()
                    ray.wait([self._run_ref], timeout=timeout)
                except Exception as exc:  # already dead: the kill below is all there is
                    log.debug("engine %s: stop: %s", self.name, exc)
            try:
                ray.kill(self.actor, no_restart=True)
            except Exception as exc:  # already gone with its node
                log.debug("engine %s: ray.kill: %s", self.name, exc)
        self.sock.close(linger=0)


class RayBackend:
    """Engines as Ray actors on the nodes of a Ray cluster."""

    name = "ray"

    def __init__(self, placement: Placement, address: str | None) -> None:
        try:
            import ray
        except ImportError as exc:
            raise ValueError("--placement-backend ray needs Ray: pip install 'mstar-core[ray]'") from exc
        self._owns = not ray.is_initialized()
        if self._owns:
            kwargs: dict[str, Any] = {"namespace": "mstar", "log_to_driver": True}
            if address is None:
                kwargs["include_dashboard"] = False  # a local Ray instance of our own
            ray.init(address=address, **kwargs)
        self.ip = ray.util.get_node_ip_address()
        check_feasible(placement, ray.nodes())
        self.actor_class = ray.remote(EngineActor)
        log.info("Ray backend: driver on %s; cluster resources %s", self.ip, ray.cluster_resources())

    def report_address(self, ipc_dir: Path) -> str:
        return f"tcp://{_tcp_host(self.ip)}:*"

    def command_address(self, ipc_dir: Path, index: int, generation: int) -> str:
        return ""  # the actor binds a free port on its node and reports it

    def shm_threshold(self, configured: int) -> int:
        return NO_SHM

    def handle(self, spec: EngineProcessSpec, placement: Placement, ctx: Any) -> EngineHandle:
        name = placement.group_of_node(spec.nodes[0])  # a node sits in one group
        group = next(g for g in placement.groups if g.name == name)
        return RayEngineHandle(spec, ctx, self.actor_class, actor_options(group))

    def close(self) -> None:
        import ray

        if self._owns and ray.is_initialized():
            ray.shutdown()
