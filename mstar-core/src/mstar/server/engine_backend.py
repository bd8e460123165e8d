"""Where engine processes run: ``local`` (processes of this machine, talking over ipc://
sockets and shared memory) or ``ray`` (one Ray actor per engine on a node of a Ray cluster,
talking over TCP; ``mstar.server.ray_engines``). The runtime asks its backend for socket
addresses and engine handles and is otherwise the same for both."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from mstar.server.engine_handle import EngineHandle
from mstar.server.engine_process import EngineProcessSpec
from mstar.server.placement import Placement

BACKENDS = ("local", "ray")


class EngineBackend(Protocol):
    name: str

    def report_address(self, ipc_dir: Path) -> str:
        """Where the API process binds its report socket (a wildcard port is resolved by
        the caller after binding)."""
        ...

    def command_address(self, ipc_dir: Path, index: int, generation: int) -> str:
        """The command address written into an engine's spec ("" when the engine picks it)."""
        ...

    def shm_threshold(self, configured: int) -> int:
        ...

    def handle(self, spec: EngineProcessSpec, placement: Placement, ctx: Any) -> EngineHandle:
        """A handle on a new engine for ``spec`` (one of ``placement``'s groups)."""
        ...

    def close(self) -> None:
        ...


class LocalBackend:
    """Engine processes spawned on this machine (the default)."""

    name = "local"

    def report_address(self, ipc_dir: Path) -> str:
        return f"ipc://{ipc_dir}/reports"

    def command_address(self, ipc_dir: Path, index: int, generation: int) -> str:
        # Each generation binds its own socket: nothing sent to a dead one reaches its successor.
        return f"ipc://{ipc_dir}/engine-{index}-{generation}"

    def shm_threshold(self, configured: int) -> int:
        return configured

    def handle(self, spec: EngineProcessSpec, placement: Placement, ctx: Any) -> EngineHandle:
        return EngineHandle(spec, ctx)

    def close(self) -> None:
        pass


def make_backend(name: str, placement: Placement, ray_address: str | None = None) -> EngineBackend:
    if name == "local":
        if ray_address is not None:
            raise ValueError("--ray-address needs --placement-backend ray")
        return LocalBackend()
    if name == "ray":
        from mstar.server.ray_engines import RayBackend

        return RayBackend(placement, ray_address)
    raise ValueError(f"unknown placement backend {name!r}; known: {', '.join(BACKENDS)}")
