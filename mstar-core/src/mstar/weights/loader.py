"""``load_weights``: the one strict loader every node's weights go through (and
``check_weights``, its checks alone)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from mstar.weights.errors import mismatch_error
from mstar.weights.names import checkpoint_names
from mstar.weights.plan import Packed, Plan, Stacked, make_plan, tied_groups
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
    state = module.state_dict()
    if any(t.is_meta for t in state.values()):
        raise ValueError(f"{type(module).__name__} has tensors on the meta device: call to_empty() before loading")
    try:
        plan = _checked_plan(module, state, source, prefix, skip, ignore, renames, packed, stacked)
        order = {key: i for i, key in enumerate(source.keys())}
        pieces = sorted(plan.pieces, key=lambda p: order[p.key])  # file by file
        bar = _progress(len(pieces), f"loading {prefix.rstrip('.') or type(module).__name__} weights")
        with torch.no_grad():
            for piece in pieces:
                piece.target.copy_(source.read(piece.key, piece.index))
                bar.update(1)
        bar.close()
    finally:
        source.close()


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
