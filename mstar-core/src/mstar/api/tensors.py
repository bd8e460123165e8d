"""Tensors in JSON (base64 of raw bytes) and as safetensors bytes, for ``/v1/generate``."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import torch

from mstar.api.errors import ApiError

_DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, name)
    for name in ("float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")
}


_NUMPY_OK = {d for n, d in _DTYPES.items() if n != "bfloat16"}


def dtype_from_name(name: str) -> torch.dtype:
    dtype = _DTYPES.get(name.removeprefix("torch."))
    if dtype is None:
        raise ValueError(f"unsupported dtype {name!r}; use one of {sorted(_DTYPES)}")
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def tensor_to_bytes(t: torch.Tensor) -> bytes:
    if t.device.type == "cpu" and t.dtype in _NUMPY_OK and not t.requires_grad:
        return t.numpy().tobytes()  # the fast path: one copy, C order whatever the strides
    # A uint8 view works for every dtype (bfloat16 has no numpy twin).
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


def tensor_from_bytes(data: bytes | bytearray | memoryview, dtype: torch.dtype, shape: list[int] | tuple[int, ...]) -> torch.Tensor:
    if len(data) == 0:
        return torch.empty(tuple(shape), dtype=dtype)
    flat = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return flat.view(dtype).reshape(tuple(shape))


def tensor_to_json(t: torch.Tensor) -> dict[str, Any]:
    return {"dtype": dtype_name(t.dtype), "shape": list(t.shape), "data": base64.b64encode(tensor_to_bytes(t)).decode()}


def tensor_from_json(value: Any, name: str) -> torch.Tensor:
    """A ``TensorJSON`` (dict or model) or a nested list / number; errors name the input."""
    param = f"inputs.{name}"
    try:
        if isinstance(value, Mapping) or hasattr(value, "dtype"):
            get = value.get if isinstance(value, Mapping) else lambda k: getattr(value, k)
            dtype = dtype_from_name(str(get("dtype")))
            shape = [int(s) for s in get("shape")]
            raw = base64.b64decode(get("data"), validate=True)
            expected = dtype.itemsize * _numel(shape)
            if len(raw) != expected:
                raise ValueError(f"data holds {len(raw)} bytes; dtype {dtype_name(dtype)} and shape {shape} need {expected}")
            return tensor_from_bytes(raw, dtype, shape)
        return torch.tensor(value)
    except ApiError:
        raise
    except Exception as exc:
        raise ApiError(400, f"input {name!r}: {exc}", param=param) from None


def _numel(shape: list[int]) -> int:
    n = 1
    for s in shape:
        if s < 0:
            raise ValueError(f"negative dimension in shape {shape}")
        n *= s
    return n


def concat_signal(parts: list[torch.Tensor]) -> torch.Tensor:
    """All values of one signal joined along dim 0 (scalars become length-1 vectors)."""
    parts = [p.reshape(1) if p.dim() == 0 else p for p in parts]
    return torch.cat(parts) if parts else torch.empty(0)


def safetensors_bytes(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> bytes:
    from safetensors.torch import save

    return save({k: v.contiguous() for k, v in tensors.items()}, metadata=dict(metadata))
