"""Where a checkpoint's tensors are read from, one tensor (or one slice of one) at a time.

A source lists its keys in reading order and reads a tensor, or part of one, only when
asked, so the loader never holds more than one checkpoint tensor: safetensors through
``safe_open``'s memory map (a single ``model.safetensors`` or HF's sharded
``*.safetensors.index.json``), ``torch.save`` files through ``torch.load(mmap=True)``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import torch

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

# A slice of each leading dimension of a tensor; () is the whole tensor.
Index = tuple[slice, ...]


class TensorSource(Protocol):
    """What the loader reads a checkpoint through."""

    where: str  # names the checkpoint in errors

    def keys(self) -> list[str]:
        """Every key, in the order reads are cheapest (shard by shard)."""
        ...

    def shape(self, key: str) -> tuple[int, ...]:
        """The tensor's shape, without reading it."""
        ...

    def read(self, key: str, index: Index = ()) -> torch.Tensor:
        """The tensor, or ``tensor[index]``, in the checkpoint's dtype."""
        ...

    def close(self) -> None:
        """Release open files; a later read opens them again."""
        ...


class SafetensorsSource:
    """A directory's ``model.safetensors``, or the shards its ``*.safetensors.index.json``
    names (the index wins when both are there). At most one file is open at a time: a
    shard's pages are mapped only while it is read (reading goes shard by shard)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.where = str(self.directory)
        self.weight_map = _weight_map(self.directory)  # key -> file name, grouped by file
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._open_file: str | None = None
        self._handle: Any = None

    def keys(self) -> list[str]:
        return list(self.weight_map)

    def __contains__(self, key: str) -> bool:
        return key in self.weight_map

    def shape(self, key: str) -> tuple[int, ...]:
        if key not in self._shapes:
            file = self.weight_map[key]
            handle = self._file(file)
            # One pass over the file's header serves every later shape question about it.
            for k in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
                if self.weight_map.get(k) == file:
                    self._shapes[k] = tuple(handle.get_slice(k).get_shape())
        return self._shapes[key]

    def read(self, key: str, index: Index = ()) -> torch.Tensor:
        handle = self._file(self.weight_map[key])
        return handle.get_slice(key)[index] if index else handle.get_tensor(key)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.__exit__(None, None, None)
        self._open_file, self._handle = None, None

    def _file(self, file: str) -> Any:
        from safetensors import safe_open

        if file != self._open_file:
            self.close()
            self._handle = safe_open(str(self.directory / file), framework="pt").__enter__()
            self._open_file = file
        return self._handle


def _weight_map(directory: Path) -> dict[str, str]:
    from safetensors import safe_open

    indexes = sorted(directory.glob("*.safetensors.index.json"))
    if len(indexes) > 1:
        raise FileNotFoundError(f"{directory} holds several safetensors indexes: {[p.name for p in indexes]}")
    if indexes:
        weight_map: dict[str, str] = json.loads(indexes[0].read_text())["weight_map"]
        absent = sorted({f for f in weight_map.values() if not (directory / f).is_file()})
        if absent:
            raise FileNotFoundError(f"{indexes[0]} names shard(s) that do not exist: {absent}")
        return dict(sorted(weight_map.items(), key=lambda kv: (kv[1], kv[0])))
    single = directory / SINGLE_FILE
    if not single.is_file():
        present = sorted(p.name for p in directory.iterdir()) if directory.is_dir() else "nothing: no such directory"
        raise FileNotFoundError(f"{directory} has neither {SINGLE_FILE} nor a *.safetensors.index.json (it holds {present})")
    with safe_open(str(single), framework="pt") as f:
        return dict.fromkeys(f.keys(), SINGLE_FILE)


class StateDictSource:
    """Tensors already addressable by key (e.g. a memory-mapped ``torch.load``)."""

    def __init__(self, state: Mapping[str, torch.Tensor], where: str) -> None:
        self.state = state
        self.where = where

    def keys(self) -> list[str]:
        return list(self.state)

    def __contains__(self, key: str) -> bool:
        return key in self.state

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self.state[key].shape)

    def read(self, key: str, index: Index = ()) -> torch.Tensor:
        return self.state[key][index] if index else self.state[key]

    def close(self) -> None:
        pass


_ZIP_MAGIC = b"PK\x03\x04"


def torch_file(path: str | Path) -> StateDictSource:
    """A ``torch.save`` file's tensors, memory-mapped (``weights_only``: no code runs).
    Nested dicts become dotted keys (``{"encoder": {"w": t}}`` → ``encoder.w``); values
    that are not tensors are dropped."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    # mmap needs the zip format torch.save has written since 1.6; older files are read whole.
    with path.open("rb") as f:
        mmap = f.read(4) == _ZIP_MAGIC
    raw = torch.load(str(path), map_location="cpu", weights_only=True, mmap=mmap)
    return StateDictSource(dict(_flatten(raw)), str(path))


def _flatten(tree: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(tree, torch.Tensor):
        yield prefix.removesuffix("."), tree
    elif isinstance(tree, Mapping):
        for key, value in tree.items():
            yield from _flatten(value, f"{prefix}{key}.")
