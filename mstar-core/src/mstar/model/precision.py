"""Which dtype each node runs in, decided once, in core (``--dtype``, ``EngineConfig.dtype``).

``auto`` is the checkpoint's dtype on accelerators and float32 on the CPU (bfloat16 matmuls
are slow there); an explicit dtype wins on any device, bfloat16 on the CPU included (slower,
half the memory). Nodes a plugin lists in ``ModelSpec.float32_nodes`` (codecs) run in
float32 whatever is asked.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# Names users may give, as vLLM and HF accept them, and the dtype each means.
DTYPE_NAMES: dict[str, str] = {
    "auto": "auto",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "half": "float16",
    "fp16": "float16",
    "float32": "float32",
    "float": "float32",
    "fp32": "float32",
}
# Config keys holding a checkpoint's dtype: ``torch_dtype`` (transformers < 4.56) and ``dtype``.
CONFIG_DTYPE_KEYS = ("dtype", "torch_dtype")


def canonical_dtype(name: str) -> str:
    """``name`` as ``auto``/``bfloat16``/``float16``/``float32``; ValueError naming the choices."""
    canonical = DTYPE_NAMES.get(str(name).lower())
    if canonical is None:
        raise ValueError(f"unknown dtype {name!r}; choose one of {sorted(set(DTYPE_NAMES))}")
    return canonical


def checkpoint_dtype(config: Mapping[str, Any]) -> torch.dtype | None:
    """The dtype a checkpoint's config states: its top-level ``dtype``/``torch_dtype`` key,
    else the first one found in its nested configs (breadth first: e.g. a composite model's
    ``thinker_config``); None when it states none."""
    import torch

    level: list[Mapping[str, Any]] = [config]
    while level:
        for cfg in level:
            for key in CONFIG_DTYPE_KEYS:
                value = cfg.get(key)
                if isinstance(value, str) and DTYPE_NAMES.get(value) not in (None, "auto"):
                    return getattr(torch, DTYPE_NAMES[value])
        level = [v for cfg in level for v in cfg.values() if isinstance(v, Mapping)]
    return None


def resolve_dtype(requested: str, config: Mapping[str, Any], device: Any) -> torch.dtype:
    """The dtype of the model's nodes on ``device`` for ``requested`` (see the module docstring)."""
    import torch

    name = canonical_dtype(requested)
    if name != "auto":
        return getattr(torch, name)
    if torch.device(device).type == "cpu":
        return torch.float32
    return checkpoint_dtype(config) or torch.float32


def node_dtypes(requested: str, config: Mapping[str, Any], device: Any, nodes: Iterable[str],
                float32_nodes: Iterable[str] = ()) -> dict[str, torch.dtype]:
    """``{node: dtype}``: ``resolve_dtype`` for every node but the ``float32_nodes``."""
    import torch

    model = resolve_dtype(requested, config, device)
    keep = set(float32_nodes)
    return {n: torch.float32 if n in keep else model for n in nodes}
