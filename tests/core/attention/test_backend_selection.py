from types import SimpleNamespace

import pytest
import torch
from mstar.attention import TorchAttentionBackend, create_backend, select_backend
from mstar.attention import selection as backend
from mstar.kv import KVCacheManager


def test_cpu_gets_torch() -> None:
    assert select_backend("cpu") == "torch"
    assert select_backend(torch.device("cpu"), "torch") == "torch"


def test_cuda_falls_back_to_torch_without_flashinfer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend, "flashinfer_import_error", lambda: "ImportError: missing")
    assert select_backend("cuda") == "torch"
    with pytest.raises(ImportError, match=r"mstar-core\[cuda\]"):
        select_backend("cuda", "flashinfer")


def test_cuda_prefers_flashinfer_when_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend, "flashinfer_import_error", lambda: None)
    assert select_backend("cuda") == "flashinfer"
    assert select_backend("cuda:1", "torch") == "torch"


def test_bad_overrides() -> None:
    with pytest.raises(ValueError, match="unknown attention backend"):
        select_backend("cpu", "sdpa")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        select_backend("cpu", "flashinfer")


def test_create_backend_builds_torch_on_cpu() -> None:
    kv = KVCacheManager(1, 1, 4, block_size=4, num_blocks=2)
    attn = create_backend(kv)
    assert isinstance(attn, TorchAttentionBackend) and attn.name == "torch" and attn.kv is kv


def test_auto_choice_falls_back_when_flashinfer_lacks_the_dtype(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(backend, "flashinfer_import_error", lambda: None)
    fp32_cuda_cache = SimpleNamespace(device=torch.device("cuda"), dtype=torch.float32)
    attn = create_backend(fp32_cuda_cache)  # type: ignore[arg-type]
    assert isinstance(attn, TorchAttentionBackend)
    with pytest.raises(ValueError, match="supports"):
        create_backend(fp32_cuda_cache, "flashinfer")  # type: ignore[arg-type]
