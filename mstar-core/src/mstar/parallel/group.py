"""A tensor-parallel group: this process's rank among ``size`` processes, and the two
collectives the sharded layers need. gloo on CPU, NCCL on CUDA (through ``torch.distributed``).
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

JOIN_TIMEOUT_S = 300


class GroupFailure(RuntimeError):
    """A collective of the tensor-parallel group failed (typically: another rank died). The
    engine's failure, not a request's: the executor lets it through so the step fails."""


@dataclass
class TensorParallelGroup:
    rank: int
    size: int
    group: Any = None  # the torch.distributed process group (None: the default group)
    # MoE blocks place whole experts on the ranks (each its E / N) rather than splitting
    # every expert's columns; a block's shard_tensor_parallel decides what it supports.
    expert_parallel: bool = False

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The elementwise sum over the ranks, in place (every rank gets the same values)."""
        with self._failing():
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """The ranks' tensors side by side along ``dim``, in rank order."""
        parts = [torch.empty_like(x) for _ in range(self.size)]
        with self._failing():
            dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=dim)

    def broadcast_object(self, obj: Any = None) -> Any:
        """Rank 0's ``obj`` on every rank (pickled)."""
        box = [obj]
        with self._failing():
            dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    @contextlib.contextmanager
    def _failing(self) -> Iterator[None]:
        try:
            yield
        except RuntimeError as exc:  # gloo/NCCL errors: a peer closed its connection, a timeout
            raise GroupFailure(
                f"tensor-parallel rank {self.rank} of {self.size}: a collective failed, another rank has "
                f"probably exited ({exc})"
            ) from exc


def init_tensor_parallel(rank: int, size: int, init_method: str, device: torch.device | str = "cpu") -> TensorParallelGroup:
    """Join (or reuse) the default process group of ``size`` ranks at ``init_method`` (e.g.
    ``tcp://127.0.0.1:29500``) and return it as the tensor-parallel group."""
    if not 0 <= rank < size:
        raise ValueError(f"tensor-parallel rank {rank} is outside 0..{size - 1}")
    if not dist.is_initialized():
        backend = "nccl" if torch.device(device).type == "cuda" else "gloo"
        # A rank that never comes (it failed to start) fails the others after this long.
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=size,
                                timeout=datetime.timedelta(seconds=JOIN_TIMEOUT_S))
    elif dist.get_world_size() != size or dist.get_rank() != rank:
        raise ValueError(
            f"a process group of {dist.get_world_size()} ranks (this one {dist.get_rank()}) exists; "
            f"tensor parallelism asked for rank {rank} of {size}"
        )
    return TensorParallelGroup(rank, size)
