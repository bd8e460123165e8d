"""Strict loading of one component's tensors from the checkpoint (``model.safetensors`` or a
sharded index): every key under the component's prefix must fill a parameter and every
parameter must be filled, with matching shapes, or one error lists what is wrong. Unlike
``mstar.layers.load_safetensors`` a parameter may be filled from several checkpoint keys
(the MoE experts, stored one module per expert, run from stacked tensors)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from mstar.layers import CheckpointMismatchError, safetensors_keys
from torch import nn

# state-dict key, its tensor -> [(checkpoint key relative to the prefix, the view it fills)]
Expander = Callable[[str, torch.Tensor], list[tuple[str, torch.Tensor]]]


def _short(keys: Iterable[str], limit: int = 10) -> str:
    keys = sorted(keys)
    more = f" (+{len(keys) - limit} more)" if len(keys) > limit else ""
    return f"{keys[:limit]}{more}"


def _identity(key: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    return [(key, tensor)]


def load_component(
    module: nn.Module,
    checkpoint_dir: Path,
    prefix: str,
    *,
    expand: Expander = _identity,
    exclude: tuple[str, ...] = (),
    ignore: Callable[[str], bool] = lambda key: False,
) -> None:
    """Fill ``module`` from the checkpoint keys ``prefix + name``; keys under
    ``prefix + e`` for ``e`` in ``exclude`` belong to other components and are skipped;
    ``ignore(name)`` names keys that may be present but are not loaded."""
    checkpoint_dir = Path(checkpoint_dir)
    where = f"{checkpoint_dir} ({prefix}*)"
    keys = safetensors_keys(checkpoint_dir)
    found = {
        k[len(prefix):]: f
        for k, f in keys.items()
        if k.startswith(prefix) and not any(k.startswith(prefix + e) for e in exclude)
    }
    targets: dict[str, torch.Tensor] = {}
    for name, tensor in module.state_dict().items():
        for ckpt_key, view in expand(name, tensor):
            targets[ckpt_key] = view
    missing = set(targets) - set(found)
    unexpected = {k for k in set(found) - set(targets) if not ignore(k)}
    if missing or unexpected:
        raise CheckpointMismatchError(f"{where} does not match the model: missing keys {_short(missing)}, unexpected keys {_short(unexpected)}")
    _copy(checkpoint_dir, where, prefix, found, targets)


def _copy(checkpoint_dir: Path, where: str, prefix: str, found: dict[str, str], targets: dict[str, torch.Tensor]) -> None:
    from safetensors import safe_open

    by_file: dict[str, list[str]] = {}
    for key in targets:
        by_file.setdefault(found[key], []).append(key)
    handles = {file: safe_open(str(checkpoint_dir / file), framework="pt") for file in by_file}
    wrong = [
        f"{key}: checkpoint {list(shape)} vs model {list(targets[key].shape)}"
        for file, names in by_file.items()
        for key in names
        if (shape := tuple(handles[file].get_slice(prefix + key).get_shape())) != tuple(targets[key].shape)
    ]
    if wrong:  # before any tensor is copied
        raise CheckpointMismatchError(f"{where}: shape mismatch for {len(wrong)} tensor(s): {wrong[:8]}")
    with torch.no_grad():
        for file, names in by_file.items():
            for key in names:
                targets[key].copy_(handles[file].get_tensor(prefix + key).to(targets[key].dtype))
