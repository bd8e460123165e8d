"""Matching a module's tensors with checkpoint tensors: which key (or slice of one) fills
which tensor (or slice of one), and everything that does not fit, found from names and
shapes alone (nothing is read).

Besides one key per tensor: fused and split projections (``Packed``), tensors stacked from
one key per row (``Stacked``), and tied tensors (one name of the tie suffices).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from mstar.weights.sources import Index


@dataclass(frozen=True)
class Packed:
    """Tensors named ``...<part>...`` side by side along ``dim`` in one named
    ``...<fused>...`` (``fused`` and ``parts`` are whole components of a dotted name), e.g.
    ``Packed("qkv_proj", ("q_proj", "k_proj", "v_proj"))``. Works both ways: a fused module
    tensor is filled from the checkpoint's parts (each into its slice, sized by the
    checkpoint), a module's parts are sliced from the checkpoint's fused tensor (sized by
    the module)."""

    fused: str
    parts: tuple[str, ...]
    dim: int = 0


@dataclass(frozen=True)
class Stacked:
    """A module tensor named ``...<name>`` whose row ``i`` (along dim 0) is the checkpoint
    tensor ``...<each.format(i)>`` (same parent), e.g. MoE experts run from one stacked
    tensor and stored one module per expert: ``Stacked("mlp.down",
    "mlp.experts.{}.down_proj.weight")``. A row's name may itself be a ``Packed`` fused
    name."""

    name: str
    each: str


@dataclass(frozen=True)
class Piece:
    key: str  # checkpoint key
    index: Index  # the part of the checkpoint tensor it takes; () = all of it
    target: torch.Tensor  # the module tensor, or the view of it, that it fills


@dataclass
class Plan:
    pieces: list[Piece] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    wrong_shapes: list[str] = field(default_factory=list)


@dataclass
class _Resolved:
    pieces: list[Piece] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    wrong_shapes: list[str] = field(default_factory=list)
    claimed: list[str] = field(default_factory=list)  # keys it would use: not unexpected

    def add(self, other: _Resolved) -> None:
        self.pieces += other.pieces
        self.missing += other.missing
        self.wrong_shapes += other.wrong_shapes
        self.claimed += other.claimed


def tied_groups(module: nn.Module, state: dict[str, torch.Tensor]) -> list[list[str]]:
    """State-dict names grouped by the parameter or buffer object they name (a tie)."""
    owner = {name: id(t) for name, t in module.named_parameters(remove_duplicate=False)}
    owner |= {name: id(t) for name, t in module.named_buffers(remove_duplicate=False)}
    groups: dict[object, list[str]] = {}
    for name in state:
        groups.setdefault(owner.get(name, name), []).append(name)
    return list(groups.values())


def make_plan(
    state: dict[str, torch.Tensor],
    groups: list[list[str]],
    own: dict[str, str],
    shape_of: Callable[[str], tuple[int, ...]],
    prefix: str = "",
    packed: Sequence[Packed] = (),
    stacked: Sequence[Stacked] = (),
) -> Plan:
    """``own``: module-side name -> checkpoint key. Missing names are reported as
    ``prefix + module-side name``; unexpected keys and shape mismatches by checkpoint key."""
    resolver = _Resolver(state, own, shape_of, prefix, packed, stacked)
    plan, claimed = Plan(), set()
    for names in groups:
        tries = [resolver.resolve(name, state[name]) for name in names]
        found = [r for r in tries if not r.missing]
        if not found:  # report the first name of a tie, naming the others
            tied = f" (or tied {[prefix + n for n in names[1:]]})" if len(names) > 1 else ""
            plan.missing += [m + tied for m in tries[0].missing]
            found = [tries[0]]
        for r in found:
            plan.pieces += r.pieces
            plan.wrong_shapes += r.wrong_shapes
            claimed.update(r.claimed)
    used = {p.key for p in plan.pieces} | claimed
    plan.unexpected = sorted(set(own.values()) - used)
    plan.wrong_shapes += _uncovered(plan.pieces, shape_of)
    return plan


def _components(name: str) -> list[str]:
    return name.split(".")


def _replace(parts: list[str], old: str, new: str) -> str:
    return ".".join(new if p == old else p for p in parts)


class _Resolver:
    def __init__(self, state: dict[str, torch.Tensor], own: dict[str, str], shape_of: Callable[[str], tuple[int, ...]],
                 prefix: str, packed: Sequence[Packed], stacked: Sequence[Stacked]) -> None:
        self.state, self.own, self.shape_of, self.prefix = state, own, shape_of, prefix
        self.packed, self.stacked = packed, stacked

    def resolve(self, name: str, target: torch.Tensor) -> _Resolved:
        if name in self.own:
            return self._whole(name, target)
        for rule in self.stacked:
            if name == rule.name or name.endswith("." + rule.name):
                parent = name[: len(name) - len(rule.name)]
                out = _Resolved()
                for i in range(target.shape[0]):
                    out.add(self._flat(parent + rule.each.format(i), target[i]))
                return out
        return self._flat(name, target)

    def _flat(self, name: str, target: torch.Tensor) -> _Resolved:
        if name in self.own:
            return self._whole(name, target)
        comps = _components(name)
        for rule in self.packed:
            if rule.fused in comps:
                return self._fuse(rule, comps, target)
            for j, part in enumerate(rule.parts):
                if part in comps and _replace(comps, part, rule.fused) in self.own:
                    return self._split(rule, comps, j, target)
        return _Resolved(missing=[self.prefix + name])

    def _whole(self, name: str, target: torch.Tensor) -> _Resolved:
        key = self.own[name]
        shape = self.shape_of(key)
        wrong = [] if shape == tuple(target.shape) else [f"{key}: checkpoint {list(shape)} vs model {list(target.shape)}"]
        return _Resolved([Piece(key, (), target)], wrong_shapes=wrong)

    def _fuse(self, rule: Packed, comps: list[str], target: torch.Tensor) -> _Resolved:
        """The module's fused tensor from the checkpoint's parts, each into its slice."""
        names = [_replace(comps, rule.fused, p) for p in rule.parts]
        absent = [self.prefix + n for n in names if n not in self.own]
        if absent:  # the parts that are there are not unexpected
            return _Resolved(missing=absent, claimed=[self.own[n] for n in names if n in self.own])
        keys = [self.own[n] for n in names]
        shapes = [self.shape_of(k) for k in keys]
        fused = tuple(target.shape)
        if any(len(s) != len(fused) for s in shapes) or sum(s[rule.dim] for s in shapes) != fused[rule.dim]:
            return _Resolved(wrong_shapes=[f"{keys}: checkpoint {[list(s) for s in shapes]} do not stack along dim "
                                           f"{rule.dim} into model {'.'.join(comps)} {list(fused)}"])
        out, offset = _Resolved(), 0
        for key, shape in zip(keys, shapes, strict=True):
            view = target.narrow(rule.dim, offset, shape[rule.dim])
            offset += shape[rule.dim]
            out.pieces.append(Piece(key, (), view))
            if tuple(view.shape) != shape:
                out.wrong_shapes.append(f"{key}: checkpoint {list(shape)} vs model slice {list(view.shape)}")
        return out

    def _split(self, rule: Packed, comps: list[str], j: int, target: torch.Tensor) -> _Resolved:
        """The module's part ``j`` sliced from the checkpoint's fused tensor, at the offset
        the module's earlier parts take."""
        key = self.own[_replace(comps, rule.parts[j], rule.fused)]
        siblings = [_replace(comps, rule.parts[j], p) for p in rule.parts]
        absent = [s for s in siblings if s not in self.state]
        if absent:
            return _Resolved(wrong_shapes=[f"{key}: the module has only some of its parts (no {absent})"], claimed=[key])
        offset = sum(self.state[s].shape[rule.dim] for s in siblings[:j])
        size = target.shape[rule.dim]
        index = (slice(None),) * rule.dim + (slice(offset, offset + size),)
        shape = list(self.shape_of(key))
        sliced = list(shape)
        if len(shape) == target.dim():
            sliced[rule.dim] = max(0, min(shape[rule.dim], offset + size) - offset)
        out = _Resolved([Piece(key, index, target)])
        if tuple(sliced) != tuple(target.shape):
            out.wrong_shapes.append(f"{key}[{offset}:{offset + size} along dim {rule.dim}]: checkpoint "
                                    f"{shape} vs model {list(target.shape)}")
        return out


def _uncovered(pieces: list[Piece], shape_of: Callable[[str], tuple[int, ...]]) -> list[str]:
    """Checkpoint tensors that are split into module parts must be used whole: parts that
    add up to less than the fused tensor are a shape mismatch too."""
    taken: dict[str, int] = {}
    dims: dict[str, int] = {}
    for p in pieces:
        if p.index:
            dim = len(p.index) - 1
            taken[p.key] = taken.get(p.key, 0) + p.index[-1].stop - p.index[-1].start
            dims[p.key] = dim
    out = []
    for key, rows in taken.items():
        shape = shape_of(key)
        if dims[key] < len(shape) and rows < shape[dims[key]]:
            out.append(f"{key}: checkpoint {list(shape)}, the module's parts take {rows} of its "
                       f"{shape[dims[key]]} along dim {dims[key]}")
    return out
