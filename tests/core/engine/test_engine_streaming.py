"""Streaming edges: decoder chunks arrive while the LM still decodes, in order, per policy."""

from __future__ import annotations

import pytest
import torch
from mstar import Engine
from mstar.engine.builder import EngineConfig
from mstar_toy.checkpoint import write_checkpoint
from mstar_toy.decoder import ToyDecoder
from toy_reference import prompts

POLICIES = {
    "fixed": {"policy": "fixed", "chunk": 5},
    "sliding_window": {"policy": "sliding_window", "window": 6, "hop": 3},
    "left_context": {"policy": "left_context", "chunk": 6, "left_context": 2, "first_chunk": 2},
}
SAMPLING = {"main": {"temperature": 0, "max_tokens": 30, "ignore_eos": True}, "aux": {"residual": {"temperature": 0}}}


def whole_decode(engine: Engine, codes: torch.Tensor) -> torch.Tensor:
    dec: ToyDecoder = engine.core.nodes["decoder"].submodule
    with torch.inference_mode():
        return dec.decode(codes[None])[0].reshape(-1)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_chunks_arrive_in_order_while_lm_decodes(tmp_path, name):
    ckpt = write_checkpoint(tmp_path, stream=POLICIES[name])
    with Engine.from_model("toy", weights=ckpt) as engine:
        events = list(engine.generate({"prompt_ids": prompts(1)[0]}, SAMPLING))
        kinds = [e.signal for e in events if e.signal]
        tokens = [int(e.data) for e in events if e.signal == "token"]
        audio = [e.data for e in events if e.signal == "audio"]
        assert len(tokens) == 30
        # Audio started before the LM's last token: the stream overlaps decoding.
        assert kinds.index("audio") < len(kinds) - 1 - kinds[::-1].index("token")
        samples = engine.built.config["decoder"]["samples_per_token"]
        assert sum(a.numel() for a in audio) == 30 * samples  # every frame once, in order
        codes = torch.stack([torch.tensor(tokens), torch.zeros(30, dtype=torch.long)], -1)
        # Which policies see enough left context to match one whole decode exactly.
        full = torch.cat(audio)
        residuals = _residuals_from(engine, prompts(1)[0])
        codes[:, 1] = torch.tensor(residuals)
        whole = whole_decode(engine, codes)
        if name in ("sliding_window", "left_context"):
            assert torch.allclose(full, whole, atol=1e-6)
        else:  # fixed chunks restart the causal conv at every seam
            assert not torch.allclose(full, whole, atol=1e-6)
            n = POLICIES[name]["chunk"] * samples
            assert torch.allclose(full[:n], whole[:n], atol=1e-6)


def _residuals_from(engine: Engine, prompt: torch.Tensor) -> list[int]:
    """Residual codes are not a client signal; capture them off the stream buffer feed."""
    captured: list[int] = []
    core = engine.core
    original = core._route

    def spy(req, name, value):
        if name == "codes":
            captured.extend(value[:, 1].tolist())
        return original(req, name, value)

    core._route = spy
    try:
        list(engine.generate({"prompt_ids": prompt}, SAMPLING))
    finally:
        core._route = original
    return captured


def test_split_placement_streams_across_engines(toy_ckpt):
    """LM in one engine, decoder in another; the stream crosses between them."""
    from mstar.engine.builder import build_core
    from mstar.engine.engine import Engine as E
    from mstar.plugins.loading import load_model

    loaded = load_model("toy")
    lm_side = E(build_core(loaded, toy_ckpt, EngineConfig(nodes=("lm",))), loaded, toy_ckpt)
    dec_side = E(build_core(loaded, toy_ckpt, EngineConfig(nodes=("decoder",))), loaded, toy_ckpt)
    whole = Engine.from_model("toy", weights=toy_ckpt)
    try:
        p = prompts(1)[0]
        ref = list(whole.generate({"prompt_ids": p}, SAMPLING))
        h_dec = dec_side.add_request({"prompt_ids": p}, SAMPLING, request_id="x")
        h_lm = lm_side.add_request({"prompt_ids": p}, SAMPLING, request_id="x")
        tokens = []
        while True:
            o = h_lm.queue.get()
            if o.stream_item:
                dec_side.push_stream("x", o.signal, o.data)
            elif o.stream_closed:
                dec_side.close_stream("x", o.signal)
            elif o.signal == "token":
                tokens.append(int(o.data))
            if o.finished:
                break
        audio = []
        while True:
            o = h_dec.queue.get()
            if o.signal == "audio":
                audio.append(o.data)
            if o.finished:
                assert o.error is None
                break
        assert tokens == [int(e.data) for e in ref if e.signal == "token"]
        assert torch.allclose(torch.cat(audio), torch.cat([e.data for e in ref if e.signal == "audio"]), atol=1e-6)
    finally:
        for e in (lm_side, dec_side, whole):
            e.close()
