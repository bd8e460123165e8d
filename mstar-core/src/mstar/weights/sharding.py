"""Loading a tensor-parallel rank's part of a node straight from the checkpoint.

While the engine builds a KV node of a tensor-parallel group it runs the plugin's factory
inside ``sharded_build(shard)``, where ``shard(module)`` rewrites a module into this rank's
part (``mstar.parallel.shard.shard_module``). Then:

- ``materialize(module, device)``, the factory's replacement for ``module.to_empty(device=...)``
  after a meta-device build, splits the module while it is still on the meta device, so the
  device only ever holds the rank's part;
- ``load_weights`` splits the module it is given (if the factory built it on a real device)
  and reads each split tensor's rows or columns from the files, not the whole tensor.

A split module names what it holds in ``mstar_shards``: parameter name -> (the whole
tensor's shape, the dim it is split along, the (start, end) spans of that dim it keeps, in
order). Outside ``sharded_build`` both functions do what they always did.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar

import torch
from torch import nn

#: parameter name -> (whole shape, dim, kept spans along dim)
ShardSpec = tuple[tuple[int, ...], int, tuple[tuple[int, int], ...]]

_shard: ContextVar[Callable[[nn.Module], object] | None] = ContextVar("mstar_shard", default=None)


@contextlib.contextmanager
def sharded_build(shard: Callable[[nn.Module], object]) -> Iterator[None]:
    """Within: ``materialize`` and ``load_weights`` split modules with ``shard`` first."""
    token = _shard.set(shard)
    try:
        yield
    finally:
        _shard.reset(token)


def shard_if_building(module: nn.Module) -> None:
    """Split ``module`` into this rank's part when a sharded build is under way (splitting
    is idempotent: what is split already stays as it is)."""
    shard = _shard.get()
    if shard is not None:
        shard(module)


def materialize(module: nn.Module, device: str | torch.device) -> nn.Module:
    """``module.to_empty(device=device)`` for a module built on the meta device, split into
    this rank's part first during a tensor-parallel build. Parameter ties and the marks
    split parameters carry survive (``to_empty`` makes a new parameter per name)."""
    shard_if_building(module)
    named = list(module.named_parameters(remove_duplicate=False))
    marks = {name: {k: v for k, v in vars(p).items() if k.startswith("mstar_")} for name, p in named}
    first: dict[int, str] = {}
    ties = [(name, first.setdefault(id(p), name)) for name, p in named]
    module = module.to_empty(device=device)
    for name, owner in ties:
        if name != owner:
            _set(module, name, module.get_parameter(owner))
    for name, found in marks.items():
        for key, value in found.items():
            setattr(module.get_parameter(name), key, value)
    return module


def _set(module: nn.Module, name: str, value: nn.Parameter) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(module.get_submodule(parent) if parent else module, leaf, value)


def shard_specs(module: nn.Module) -> dict[str, ShardSpec]:
    """State-dict name -> ``ShardSpec`` of every split parameter of ``module``."""
    out: dict[str, ShardSpec] = {}
    for prefix, sub in module.named_modules(remove_duplicate=False):
        for name, spec in getattr(sub, "mstar_shards", {}).items():
            out[f"{prefix}.{name}" if prefix else name] = spec
    return out
