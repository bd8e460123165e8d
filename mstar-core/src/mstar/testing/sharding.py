"""Rewriting a written checkpoint's safetensors file as HF's shards (tests of sharded
releases: the loader must read them as it reads the single file)."""

from __future__ import annotations

import json
from pathlib import Path

SUFFIX = ".safetensors"


def shard_checkpoint(path: Path, num_shards: int, file: str = "model.safetensors") -> list[Path]:
    """Replace ``path / file`` by ``<stem>-0000i-of-0000N.safetensors`` and
    ``<file>.index.json`` beside it, in HF's format (``{"metadata": {"total_size"},
    "weight_map": {key: shard}}``), tensors in key order cut into ``num_shards`` runs of
    about equal bytes. ``file`` may name a sub-directory's file (``codec/model.safetensors``).
    Returns the shards' paths."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    single = Path(path) / file
    if not single.name.endswith(SUFFIX):
        raise ValueError(f"{single} is not a safetensors file")
    with safe_open(str(single), framework="pt") as f:
        metadata = f.metadata()
        tensors = {k: f.get_tensor(k) for k in sorted(f.keys())}
    if not 1 <= num_shards <= len(tensors):
        raise ValueError(f"cannot cut {len(tensors)} tensors into {num_shards} shards")
    runs = _runs([t.numel() * t.element_size() for t in tensors.values()], num_shards)
    stem = single.name.removesuffix(SUFFIX)
    keys = list(tensors)
    weight_map: dict[str, str] = {}
    shards = []
    for i, (start, stop) in enumerate(runs):
        shard = single.with_name(f"{stem}-{i + 1:05d}-of-{num_shards:05d}{SUFFIX}")
        save_file({k: tensors[k] for k in keys[start:stop]}, str(shard), metadata=metadata)
        weight_map.update(dict.fromkeys(keys[start:stop], shard.name))
        shards.append(shard)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    del tensors  # they map the file removed next
    single.with_name(single.name + ".index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    single.unlink()
    return shards


def _runs(sizes: list[int], count: int) -> list[tuple[int, int]]:
    """``count`` non-empty consecutive runs of ``sizes``, each ending once it reaches its
    share of the total."""
    total, runs, start, acc = sum(sizes), [], 0, 0
    for i, size in enumerate(sizes):
        acc += size
        left_after = len(sizes) - i - 1  # items after this one
        runs_left = count - len(runs) - 1  # runs still to start after this one
        if runs_left == 0:
            continue
        if acc * count >= total * (len(runs) + 1) or left_after == runs_left:
            runs.append((start, i + 1))
            start = i + 1
    runs.append((start, len(sizes)))
    return runs
