"""Strict safetensors loading in the HF layout (``model.safetensors`` or a sharded
``model.safetensors.index.json``).

Strict: one error lists every missing key, unexpected key and shape mismatch before any
tensor is copied. Parameters tied to each other (e.g. an LM head sharing the embedding)
need one of their names in the checkpoint.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


class CheckpointMismatchError(ValueError):
    """The checkpoint's tensors do not match the module's (names or shapes)."""


def safetensors_keys(checkpoint_dir: str | Path) -> dict[str, str]:
    """``{key: shard file name}`` of the checkpoint."""
    from safetensors import safe_open

    checkpoint_dir = Path(checkpoint_dir)
    index = checkpoint_dir / INDEX_FILE
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        absent = sorted({f for f in weight_map.values() if not (checkpoint_dir / f).is_file()})
        if absent:
            raise FileNotFoundError(f"{index} names shard(s) that do not exist: {absent}")
        return dict(weight_map)
    single = checkpoint_dir / SINGLE_FILE
    if not single.is_file():
        raise FileNotFoundError(f"no {SINGLE_FILE} or {INDEX_FILE} in {checkpoint_dir}")
    with safe_open(single, "pt") as f:
        return dict.fromkeys(f.keys(), SINGLE_FILE)


def _short(keys: Iterable[str], limit: int = 10) -> str:
    keys = sorted(keys)
    more = f" (+{len(keys) - limit} more)" if len(keys) > limit else ""
    return f"{keys[:limit]}{more}"


def _alias_groups(state: dict[str, torch.Tensor]) -> list[set[str]]:
    """Names that share one tensor (tied parameters) form one group."""
    groups: dict[tuple[int, tuple[int, ...]], set[str]] = {}
    for name, t in state.items():
        groups.setdefault((t.data_ptr(), tuple(t.shape)), set()).add(name)
    return list(groups.values())


def load_safetensors(
    module: nn.Module,
    checkpoint_dir: str | Path,
    prefix: str = "",
    ignore: Iterable[str] = (),
) -> None:
    """Copy the checkpoint's tensors under ``prefix`` into ``module`` (names without the
    prefix must equal ``module.state_dict()`` names), cast to each parameter's dtype.

    ``ignore`` holds regular expressions of checkpoint keys (without the prefix) that the
    module does not use, e.g. ``r"\\.rotary_emb\\.inv_freq$"``. Keys outside ``prefix``
    belong to other nodes and are skipped.
    """
    from safetensors import safe_open

    checkpoint_dir = Path(checkpoint_dir)
    patterns = [re.compile(p) for p in ignore]
    files = {k[len(prefix):]: f for k, f in safetensors_keys(checkpoint_dir).items() if k.startswith(prefix)}
    files = {k: f for k, f in files.items() if not any(p.search(k) for p in patterns)}
    state = module.state_dict()
    groups = _alias_groups(state)
    missing = [name for g in groups if not g & files.keys() for name in sorted(g)]
    unexpected = files.keys() - state.keys()
    where = f"{checkpoint_dir} (prefix {prefix!r})" if prefix else str(checkpoint_dir)
    if missing or unexpected:
        raise CheckpointMismatchError(
            f"{where} does not match {type(module).__name__}: missing keys {_short(missing)}, "
            f"unexpected keys {_short(unexpected)}"
        )
    wrong = []
    by_file: dict[str, list[str]] = {}
    for key, file in files.items():
        by_file.setdefault(file, []).append(key)
    with torch.no_grad():
        handles = {f: safe_open(checkpoint_dir / f, "pt") for f in by_file}
        try:
            for file, keys in by_file.items():
                for key in keys:
                    shape = tuple(handles[file].get_slice(prefix + key).get_shape())
                    if shape != tuple(state[key].shape):
                        wrong.append(f"{key}: checkpoint {list(shape)} vs model {list(state[key].shape)}")
            if wrong:
                raise CheckpointMismatchError(f"{where}: shape mismatch for {len(wrong)} tensor(s): {wrong[:8]}")
            bar = _progress(len(files), f"loading {prefix.rstrip('.') or type(module).__name__} weights")
            for file, keys in by_file.items():
                for key in keys:
                    target = state[key]
                    target.copy_(handles[file].get_tensor(prefix + key).to(target.dtype))
                    bar.update(1)
            bar.close()
        finally:
            handles.clear()


def _progress(total: int, desc: str):
    """A tensor-count progress bar, shown only on a terminal (tqdm's ``disable=None``)."""
    import sys

    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="tensor", file=sys.stderr, disable=None, leave=False)
