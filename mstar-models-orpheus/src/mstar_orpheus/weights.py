"""Strict weight loading: HF safetensors (single file or sharded index) and SNAC's
``pytorch_model.bin`` with weight-norm parameters.

Strict means one error listing every missing and unexpected key (and every shape
mismatch) before any tensor is copied.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def _short(keys: Iterable[str], limit: int = 12) -> str:
    keys = sorted(keys)
    more = f" (+{len(keys) - limit} more)" if len(keys) > limit else ""
    return f"{keys[:limit]}{more}"


def check_keys(where: str, expected: set[str], found: set[str], ignored: set[str] = frozenset()) -> None:  # type: ignore[assignment]
    missing = expected - found
    unexpected = found - expected - ignored
    if missing or unexpected:
        raise ValueError(
            f"{where} does not match the model: missing keys {_short(missing)}, unexpected keys {_short(unexpected)}"
        )


def check_shapes(where: str, module: nn.Module, shapes: dict[str, tuple[int, ...]]) -> None:
    state = module.state_dict()
    wrong = [f"{k}: checkpoint {list(s)} vs model {list(state[k].shape)}" for k, s in sorted(shapes.items())
             if k in state and tuple(state[k].shape) != tuple(s)]
    if wrong:
        raise ValueError(f"{where}: shape mismatch for {len(wrong)} tensor(s): {wrong[:8]}")


def safetensors_files(checkpoint_dir: Path) -> dict[str, list[str]]:
    """{shard file: [keys]} from ``model.safetensors`` or the sharded index."""
    from safetensors import safe_open

    checkpoint_dir = Path(checkpoint_dir)
    index = checkpoint_dir / INDEX_FILE
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        shards: dict[str, list[str]] = {}
        for key, file in weight_map.items():
            shards.setdefault(file, []).append(key)
        absent = [f for f in shards if not (checkpoint_dir / f).is_file()]
        if absent:
            raise FileNotFoundError(f"{index} names shard(s) that do not exist: {absent}")
        return shards
    single = checkpoint_dir / SINGLE_FILE
    if single.is_file():
        with safe_open(str(single), framework="pt") as f:
            return {SINGLE_FILE: list(f.keys())}
    present = sorted(p.name for p in checkpoint_dir.iterdir()) if checkpoint_dir.is_dir() else []
    raise FileNotFoundError(f"{checkpoint_dir} has neither {SINGLE_FILE} nor {INDEX_FILE} (it holds {present})")


def load_safetensors(module: nn.Module, checkpoint_dir: Path, ignore: str | None = None, desc: str = "weights") -> None:
    """Copy every tensor of the checkpoint into ``module`` (names as in its state dict).

    ``ignore`` is a regex of checkpoint keys that may be present but are not loaded.
    """
    from safetensors import safe_open

    checkpoint_dir = Path(checkpoint_dir)
    shards = safetensors_files(checkpoint_dir)
    found = {k for keys in shards.values() for k in keys}
    pattern = re.compile(ignore) if ignore else None
    ignored = {k for k in found if pattern and pattern.search(k)}
    state = module.state_dict()
    check_keys(str(checkpoint_dir), set(state), found, ignored)
    shapes: dict[str, tuple[int, ...]] = {}
    for file, keys in shards.items():
        with safe_open(str(checkpoint_dir / file), framework="pt") as f:
            shapes.update({k: tuple(f.get_slice(k).get_shape()) for k in keys if k in state})
    check_shapes(str(checkpoint_dir), module, shapes)
    with torch.no_grad(), tqdm(total=len(shapes), desc=f"loading {desc}", unit="tensor", disable=None) as bar:
        for file, keys in shards.items():
            with safe_open(str(checkpoint_dir / file), framework="pt") as f:
                for key in keys:
                    if key in state:
                        state[key].copy_(f.get_tensor(key))
                        bar.update(1)


_WEIGHT_NORM = (
    (".parametrizations.weight.original0", ".parametrizations.weight.original1"),  # torch >= 2.1
    (".weight_g", ".weight_v"),  # the legacy torch.nn.utils.weight_norm names
)


def fold_weight_norm(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Replace every (g, v) weight-norm pair by the plain ``weight = g * v / ||v||``
    (norm over all dims but 0, torch's default), computed once at load time."""
    out = dict(state)
    for g_suffix, v_suffix in _WEIGHT_NORM:
        for key in [k for k in state if k.endswith(g_suffix)]:
            base = key[: -len(g_suffix)]
            v = out.pop(base + v_suffix, None)
            if v is None:
                raise ValueError(f"weight-norm magnitude {key} has no direction {base + v_suffix}")
            out[base + ".weight"] = _weight_norm(out.pop(key).float(), v.float())
    return out


def _weight_norm(g: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    # torch's own kernel when present: bit-identical to what its weight_norm computes.
    if hasattr(torch, "_weight_norm"):
        return torch._weight_norm(v, g, 0)
    return v * (g / v.norm(dim=tuple(range(1, v.dim())), keepdim=True))


def load_torch_bin(module: nn.Module, path: Path, ignore: str | None = None) -> None:
    """Strictly load a ``torch.save``d state dict (weights only) with weight norm folded."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    raw = torch.load(str(path), map_location="cpu", weights_only=True)
    state = fold_weight_norm(raw)
    pattern = re.compile(ignore) if ignore else None
    ignored = {k for k in state if pattern and pattern.search(k)}
    expected = module.state_dict()
    check_keys(str(path), set(expected), set(state), ignored)
    check_shapes(str(path), module, {k: tuple(v.shape) for k, v in state.items() if k in expected})
    with torch.no_grad():
        for key, target in expected.items():
            target.copy_(state[key])
