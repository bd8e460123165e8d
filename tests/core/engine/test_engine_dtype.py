"""``--dtype``: core decides each node's dtype once; factories build in it; float32 nodes stay."""

from __future__ import annotations

import pytest
import torch
from mstar import Engine
from mstar.engine.builder import accepts_keyword
from mstar.model.precision import canonical_dtype, checkpoint_dtype, node_dtypes, resolve_dtype
from mstar.model.spec import lazy
from toy_reference import prompts

CONFIG = {"dtype": "bfloat16", "decoder": {"hidden_size": 4}}


@pytest.mark.parametrize(("requested", "device", "expected"), [
    ("auto", "cpu", torch.float32),  # bf16 matmuls are slow on CPU
    ("auto", "cuda:0", torch.bfloat16),  # the checkpoint's
    ("auto", "meta", torch.bfloat16),
    ("bf16", "cpu", torch.bfloat16),  # explicit wins on any device
    ("half", "cuda", torch.float16),
    ("float32", "cuda", torch.float32),
])
def test_resolve_dtype(requested, device, expected):
    assert resolve_dtype(requested, CONFIG, device) == expected


def test_checkpoint_dtype_keys_and_nesting():
    assert checkpoint_dtype({"torch_dtype": "float16"}) == torch.float16
    assert checkpoint_dtype({"dtype": "bfloat16", "torch_dtype": "float32"}) == torch.bfloat16
    # A composite checkpoint states it in a sub-config only.
    assert checkpoint_dtype({"thinker_config": {"text_config": {"dtype": "bfloat16"}}}) == torch.bfloat16
    assert checkpoint_dtype({"hidden_size": 8}) is None
    assert resolve_dtype("auto", {}, "cuda") == torch.float32


def test_float32_nodes_and_unknown_names():
    assert node_dtypes("bfloat16", {}, "cpu", ["lm", "codec"], ["codec"]) == {"lm": torch.bfloat16, "codec": torch.float32}
    with pytest.raises(ValueError, match=r"unknown dtype 'bf32'.*bfloat16"):
        canonical_dtype("bf32")


def test_accepts_keyword_sees_through_lazy():
    def old(config, checkpoint_dir, device):
        return None

    assert accepts_keyword(lazy("mstar_toy.checkpoint:build_lm"), "dtype")
    assert not accepts_keyword(old, "dtype")
    assert accepts_keyword(lambda *a, **kw: None, "dtype")


def node_dtypes_of(engine: Engine) -> dict[str, set[torch.dtype]]:
    return {name: {p.dtype for p in node.submodule.parameters()} for name, node in engine.core.nodes.items()}


def test_toy_serves_in_bfloat16_on_cpu_within_its_tolerance(make_engine):
    """The toy's stated tolerance (examples/mstar-models-toy/README.md): greedy bfloat16
    tokens equal float32's over the first 4 steps; the decoder stays float32, so the same
    codes give the same audio bits."""
    f32, bf16 = make_engine(), make_engine(dtype="bfloat16")
    assert node_dtypes_of(f32) == {"lm": {torch.float32}, "decoder": {torch.float32}}
    assert node_dtypes_of(bf16) == {"lm": {torch.bfloat16}, "decoder": {torch.float32}}
    assert bf16.core.nodes["lm"].kv.dtype == torch.bfloat16  # the cache follows the node
    sampling = {"main": {"temperature": 0.0, "max_tokens": 4, "ignore_eos": True}, "aux": {"residual": {"temperature": 0.0}}}
    ps = prompts(4, seed=2)
    a = f32.run_batch([{"inputs": {"prompt_ids": p}, "sampling": sampling} for p in ps])
    b = bf16.run_batch([{"inputs": {"prompt_ids": p}, "sampling": sampling} for p in ps])
    assert [r.cat("token").tolist() for r in a] == [r.cat("token").tolist() for r in b]
    for x, y in zip(a, b, strict=True):
        assert y.cat("audio").dtype == torch.float32
        assert torch.equal(x.cat("audio"), y.cat("audio"))


def test_a_factory_without_dtype_is_cast_when_a_dtype_is_asked(make_engine, monkeypatch, caplog):
    import mstar_toy.checkpoint as toy

    build_lm = toy.build_lm
    monkeypatch.setattr(toy, "build_lm", lambda config, checkpoint_dir, device: build_lm(config, checkpoint_dir, device))
    assert node_dtypes_of(make_engine())["lm"] == {torch.float32}
    engine = make_engine(dtype="bfloat16")
    assert node_dtypes_of(engine)["lm"] == {torch.bfloat16}
    assert "its factory takes no dtype argument" in caplog.text
