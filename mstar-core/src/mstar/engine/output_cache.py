"""Outputs of a stateless node's rows kept by key (``NodeSubmodule.output_cache_key``), so
a repeated input — the same image re-sent with each turn of a conversation — is not
encoded again.

Bounded by bytes, least recently used first out. Values are kept on the CPU (host memory,
nothing taken from an accelerator's KV budget) and moved to the node's device when a hit
returns them. A hit returns the tensors stored, not copies: outputs are read-only to the
engine and to the nodes that read them.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping

import torch

Outputs = Mapping[str, torch.Tensor]


class OutputCache:
    def __init__(self, capacity_bytes: int, device: torch.device) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self.device = device
        self._entries: OrderedDict[Hashable, tuple[dict[str, torch.Tensor], int]] = OrderedDict()
        # A node with concurrent_forwards may run batches on two threads at once.
        self._lock = threading.Lock()
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> dict[str, torch.Tensor] | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
        return {name: value.to(self.device) for name, value in entry[0].items()}

    def put(self, key: Hashable, outputs: Outputs) -> None:
        """Keep ``outputs`` under ``key``; an entry larger than the whole cache is not kept."""
        size = sum(v.numel() * v.element_size() for v in outputs.values())
        if size > self.capacity_bytes:
            return
        # A copy: an output is often a view of the whole batch's tensor, whose storage it would pin.
        kept = {name: value.detach().to("cpu", copy=True) for name, value in outputs.items()}
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.bytes -= old[1]
            while self._entries and self.bytes + size > self.capacity_bytes:
                _, (_, freed) = self._entries.popitem(last=False)
                self.bytes -= freed
                self.evictions += 1
            self._entries[key] = (kept, size)
            self.bytes += size
