"""The ranks of a tensor-parallel engine process other than rank 0.

An engine process whose group says ``tensor_parallel: N`` is rank 0: it starts N - 1
follower processes (``python -m mstar.server.tensor_parallel_ranks``, as the engine
process itself is daemonic), builds its engine, which meets them at a free local port
(``torch.distributed``), and serves requests; each follower builds the same nodes on its
device and steps with rank 0 (``Engine.follow``) until rank 0 closes. A follower dies with
its rank 0 (``PR_SET_PDEATHSIG``); a follower that dies makes rank 0's next collective
fail, so the engine process exits with a fatal error and the server restarts the group as
a unit.
"""

from __future__ import annotations

import base64
import logging
import os
import signal
import socket
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import msgspec

log = logging.getLogger("mstar.engine_process")


def rank_device(device: str, rank: int) -> str:
    """Rank ``rank``'s device when rank 0 has ``device``: the next CUDA indices, the CPU as is."""
    if device.startswith("cuda"):
        index = int(device.partition(":")[2] or 0)
        return f"cuda:{index + rank}"
    return device


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tensor_parallel_options(size: int, rank: int, init: str, experts: bool = False) -> dict[str, Any]:
    return {"tensor_parallel_size": size, "tensor_parallel_rank": rank, "tensor_parallel_init": init,
            "expert_parallel": experts}


def start_followers(spec: Any, init: str) -> list[subprocess.Popen]:
    """Ranks 1 .. N-1 of ``spec``'s engine (an ``EngineProcessSpec``), each its own process."""
    payload = base64.b64encode(msgspec.msgpack.encode(spec)).decode()
    return [
        subprocess.Popen([sys.executable, "-m", "mstar.server.tensor_parallel_ranks", payload, str(rank), init, str(os.getpid())])
        for rank in range(1, spec.tensor_parallel)
    ]


def stop_followers(followers: list[subprocess.Popen], timeout: float = 10.0) -> None:
    for p in followers:
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def build_engine(spec: Any, rank: int, init: str) -> Any:
    """Rank ``rank``'s engine of ``spec`` (rank 0: the engine process's own)."""
    from mstar.engine.builder import EngineConfig, build_core
    from mstar.engine.engine import Engine
    from mstar.plugins.loading import load_model

    if spec.torch_threads:
        import torch

        torch.set_num_threads(spec.torch_threads)
    given = sorted(k for k in spec.engine_options if k.startswith(("tensor_parallel", "expert_parallel")))
    if given:  # the ranks would wait for processes nobody starts
        raise ValueError(f"engine option(s) {given}: set tensor_parallel (and expert_parallel) on a placement group "
                         "instead (docs/serving.md)")
    loaded = load_model(spec.model)
    options = {**loaded.spec.engine_defaults, **spec.engine_options}  # the server's options win
    if spec.tensor_parallel > 1:
        options.update(tensor_parallel_options(spec.tensor_parallel, rank, init, getattr(spec, "expert_parallel", False)))
    config = EngineConfig(device=rank_device(spec.device, rank), nodes=tuple(spec.nodes), **options)
    ckpt = Path(spec.checkpoint_dir)
    return Engine(build_core(loaded, ckpt, config), loaded, ckpt)


def _follower_main(payload: str, rank: int, init: str, leader_pid: int) -> int:
    from mstar.server.parent_death import die_with_parent

    # The engine process's spec as plain fields (its class lives in engine_process, which
    # imports this module).
    spec = types.SimpleNamespace(**msgspec.msgpack.decode(base64.b64decode(payload)))
    logging.basicConfig(level=spec.log_level.upper(), format=f"%(asctime)s engine[{spec.name} rank {rank}] %(levelname)s %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # rank 0 owns shutdown
    die_with_parent(signal.SIGKILL, leader_pid)
    engine = build_engine(spec, rank, init)
    log.info("rank %d of %d ready on %s", rank, spec.tensor_parallel, rank_device(spec.device, rank))
    steps = engine.follow()
    log.info("rank %d stops after %d steps", rank, steps)
    return 0


if __name__ == "__main__":
    raise SystemExit(_follower_main(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])))
