"""``load_weights``: the one strict loader every node's weights go through (and
``check_weights``, its checks alone)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from mstar.weights.errors import mismatch_error
from mstar.weights.names import checkpoint_names
from mstar.weights.plan import Packed, Piece, Plan, Stacked, make_plan, tied_groups
from mstar.weights.sharding import shard_if_building, shard_specs
from mstar.weights.sources import SafetensorsSource, TensorSource


def load_weights(
    module: nn.Module,
    checkpoint: str | Path | TensorSource,
    *,
    prefix: str = "",
    skip: Iterable[str] | None = None,
    ignore: Iterable[str] = (),
    renames: Iterable[tuple[str, str]] = (),
    packed: Iterable[Packed] = (),
    stacked: Iterable[Stacked] = (),
) -> None:
    """Fill every tensor of ``module.state_dict()`` from the checkpoint, strictly.

    ``checkpoint``: a directory with ``model.safetensors`` or a ``*.safetensors.index.json``
    and its shards, or a ``TensorSource`` (e.g. ``torch_file(path)``).
    ``prefix``: the module's keys start with it (it is removed). ``skip``: key prefixes of
    other components, passed over; with ``skip`` None every key outside ``prefix`` is passed
    over, otherwise a key outside ``prefix`` and ``skip`` is unexpected. ``ignore``: regular
    expressions (``re.search``) of keys, without the prefix, that are present but not used.
    ``renames``: ``(pattern, replacement)`` pairs applied in turn with ``re.sub`` to turn a
    key without the prefix into the module's name. ``packed``/``stacked``: tensors that are
    slices or stacks of several (``Packed``, ``Stacked``).

    Every missing key, unexpected key and shape mismatch is listed in one
    ``CheckpointMismatchError`` before any tensor is copied. Then the tensors are read one
    at a time (memory-mapped) and cast to the dtype of the tensor they fill as they are
    copied: the module's dtypes and devices are the caller's choice, and no second copy
    of the model is ever held.
    """
    source = _source(checkpoint)
    shard_if_building(module)  # a tensor-parallel rank: its part of the module, read as such
    state = module.state_dict()
    if any(t.is_meta for t in state.values()):
        raise ValueError(f"{type(module).__name__} has tensors on the meta device: call to_empty() before loading")
    whole, parts = _whole_shapes(module, state)
    try:
        plan = _checked_plan(module, whole, source, prefix, skip, ignore, renames, packed, stacked)
        order = {key: i for i, key in enumerate(source.keys())}
        pieces = sorted(plan.pieces, key=lambda p: order[p.key])  # file by file
        bar = _progress(len(pieces), f"loading {prefix.rstrip('.') or type(module).__name__} weights")
        with torch.no_grad():
            for piece in pieces:
                base = piece.target if piece.target._base is None else piece.target._base
                part = parts.get(id(base))
                if part is None:
                    piece.target.copy_(source.read(piece.key, piece.index))
                else:
                    read_part(source, piece, base, *part)
                bar.update(1)
        bar.close()
    finally:
        source.close()


def _whole_shapes(module: nn.Module, state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[int, tuple]]:
    """``state`` with each split parameter (``mstar.weights.sharding``) replaced by a
    meta-device stand-in of the whole tensor, which the plan matches against the checkpoint;
    and, by the stand-in's id, what it stands for: (the rank's tensor, dim, spans)."""
    specs = shard_specs(module)
    if not specs:
        return state, {}
    params = dict(module.named_parameters(remove_duplicate=False))
    whole, parts, by_param = dict(state), {}, {}
    for name, (shape, dim, spans) in specs.items():
        if name not in state:
            continue
        key = id(params.get(name, state[name]))  # tied names share one stand-in
        if key not in by_param:
            by_param[key] = torch.empty(shape, dtype=state[name].dtype, device="meta")
            parts[id(by_param[key])] = (state[name], dim, spans)
        whole[name] = by_param[key]
    return whole, parts


def check_weights(
    module: nn.Module,
    checkpoint: str | Path | TensorSource,
    *,
    prefix: str = "",
    skip: Iterable[str] | None = None,
    ignore: Iterable[str] = (),
    renames: Iterable[tuple[str, str]] = (),
    packed: Iterable[Packed] = (),
    stacked: Iterable[Stacked] = (),
) -> None:
    """``load_weights``' checks alone, from names and shapes (no tensor is read, and
    ``module`` may be on the meta device): raises its ``CheckpointMismatchError``."""
    source = _source(checkpoint)
    try:
        _checked_plan(module, module.state_dict(), source, prefix, skip, ignore, renames, packed, stacked)
    finally:
        source.close()


def _source(checkpoint: str | Path | TensorSource) -> TensorSource:
    return SafetensorsSource(checkpoint) if isinstance(checkpoint, (str, Path)) else checkpoint


def _checked_plan(module: nn.Module, state: dict[str, torch.Tensor], source: TensorSource, prefix: str,
                  skip: Iterable[str] | None, ignore: Iterable[str], renames: Iterable[tuple[str, str]],
                  packed: Iterable[Packed], stacked: Iterable[Stacked]) -> Plan:
    names = checkpoint_names(source.keys(), prefix, skip, ignore, renames)
    plan = make_plan(state, tied_groups(module, state), names.own, source.shape, prefix, tuple(packed), tuple(stacked))
    where = f"{source.where} (keys {prefix}*)" if prefix else source.where
    error = mismatch_error(where, type(module).__name__, plan.missing, plan.unexpected + names.stray, plan.wrong_shapes)
    if error is not None:
        raise error
    return plan


def _progress(total: int, desc: str):
    """A tensor-count progress bar, shown only on a terminal (tqdm's ``disable=None``)."""
    import sys

    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="tensor", file=sys.stderr, disable=None, leave=False)


def read_part(source: TensorSource, piece: Piece, whole: torch.Tensor, local: torch.Tensor, dim: int,
              spans: tuple[tuple[int, int], ...]) -> None:
    """Copy the rank's share of ``piece`` (which fills a view of ``whole``, the meta stand-in
    of a split tensor) into ``local``, the rank's tensor holding ``spans`` of ``whole`` along
    ``dim`` side by side, reading only those rows or columns from the source."""
    view = piece.target
    starts, dims = _view_layout(view, whole)
    j = dims[dim]  # the view's dim along the split one (None: the view selects one index of it)
    at = starts[dim]
    size = 1 if j is None else view.shape[j]
    offset = 0
    for a, b in spans:
        lo, hi = max(a, at), min(b, at + size)
        if lo < hi:
            target, cur = local, 0
            for k in range(whole.dim()):
                if dims[k] is None:
                    target = target.select(cur, offset + lo - a if k == dim else starts[k])
                    continue
                first, length = (offset + lo - a, hi - lo) if k == dim else (starts[k], view.shape[dims[k]])
                target = target.narrow(cur, first, length)
                cur += 1
            index = list(piece.index) + [slice(None)] * (view.dim() - len(piece.index))
            if j is not None:
                base = index[j].start or 0
                index[j] = slice(base + lo - at, base + hi - at)
            target.copy_(source.read(piece.key, tuple(index)))
        offset += b - a


def _view_layout(view: torch.Tensor, whole: torch.Tensor) -> tuple[list[int], list[int | None]]:
    """For a view of contiguous ``whole`` made by narrowing and selecting: where it starts
    along each of ``whole``'s dims, and which of the view's dims each one is (None: selected)."""
    at = view.storage_offset()
    starts = [(at // whole.stride(k)) % whole.shape[k] if whole.shape[k] else 0 for k in range(whole.dim())]
    dims: list[int | None] = []
    j = 0
    for k in range(whole.dim()):
        if j < view.dim() and view.stride(j) == whole.stride(k) and starts[k] + view.shape[j] <= whole.shape[k]:
            dims.append(j)
            j += 1
        else:
            dims.append(None)
    if j != view.dim():
        raise ValueError(f"a view of shape {list(view.shape)} is not a slice of a tensor of shape {list(whole.shape)}")
    return starts, dims
