"""Engine properties on qwen3tts: batched == alone, chunked prefill and preemption change
nothing, a bad request fails alone, EOS ends the utterance (withheld from the codec)."""

from __future__ import annotations

import pytest
import torch
from qwen3tts_helpers import frames, greedy, sampling, speech_inputs

TEXTS = [
    ("A first sentence to say.", "vivian", "english", True),
    ("Second, said incrementally.", "ryan", "auto", False),
    ("你好, 第三个.", "eric", "chinese", True),
    ("Fourth one, quite a bit longer than the others so its prefill is long too.", "dylan", "auto", False),
]


@pytest.fixture(scope="module")
def requests(tiny_ckpt):
    return [
        {"inputs": speech_inputs(tiny_ckpt, *t), "sampling": sampling({"seed": 10 + i, "max_tokens": 10 + 3 * i}, {})}
        for i, t in enumerate(TEXTS)
    ]


@pytest.fixture(scope="module")
def alone(tiny_engine, requests):
    return [tiny_engine.run_batch([r])[0] for r in requests]


def _same(a, b) -> None:
    assert a.error is None and b.error is None, (a.error, b.error)
    assert torch.equal(a.cat("codes"), b.cat("codes"))
    assert torch.equal(a.cat("audio"), b.cat("audio"))
    assert a.finish_reason == b.finish_reason


def test_batched_equals_alone(tiny_engine, requests, alone) -> None:
    for got, want in zip(tiny_engine.run_batch(requests), alone, strict=True):
        _same(got, want)


@pytest.mark.parametrize(
    "options",
    [
        {"max_num_batched_tokens": 8},  # long prompts prefill in chunks
        {"kv_budget_bytes": 20 * 1024, "block_size": 4},  # 20 blocks of 1 KiB: preemption
        {"mixed_batches": False, "piecewise_graphs": False},
    ],
    ids=["chunked-prefill", "preemption", "no-mixed-no-piecewise"],
)
def test_scheduling_changes_nothing(engines, tiny_ckpt, requests, alone, options) -> None:
    engine = engines(tiny_ckpt, **options)
    for got, want in zip(engine.run_batch(requests), alone, strict=True):
        _same(got, want)
    if "kv_budget_bytes" in options:
        assert engine.core.stats.preemptions > 0


def test_compiled_regions_give_the_same_codes_and_audio_alone_or_under_load(engines, tiny_ckpt, requests, alone) -> None:
    """``compile_regions``: the talker's frame and the codec's streamed decode compiled. The
    codes are eager's and the audio eager's up to float rounding; and a request's audio is
    byte-identical alone and under load (the codec's calls keep their fixed sizes)."""
    engine = engines(tiny_ckpt, compile_regions=True)
    nodes = engine.core.nodes
    assert nodes["talker"].submodule._compiled_frame is not None
    assert nodes["codec"].submodule._compiled_decoder is not None
    compiled_alone = [engine.run_batch([r])[0] for r in requests]
    for got, want in zip(compiled_alone, alone, strict=True):
        assert got.error is None, got.error
        assert torch.equal(got.cat("codes"), want.cat("codes"))
        torch.testing.assert_close(got.cat("audio"), want.cat("audio"), rtol=0, atol=1e-5)
    for got, want in zip(engine.run_batch(requests), compiled_alone, strict=True):
        _same(got, want)


def test_a_bad_request_fails_alone(tiny_engine, requests, alone) -> None:
    bad = {**requests[0], "inputs": {**requests[0]["inputs"], "codec_ids": requests[0]["inputs"]["codec_ids"] + 10**6}}
    results = tiny_engine.run_batch([bad, requests[1]])
    assert results[0].finish_reason == "error" and "codec_ids" in results[0].error
    _same(results[1], alone[1])


def test_eos_ends_the_utterance_and_is_withheld(tiny_engine, tiny_ckpt, tiny_cfg) -> None:
    """Greedy with a high repetition penalty until some request meets EOS: its last frame
    carries no EOS code, and the codec decodes exactly the frames emitted."""
    eos = tiny_cfg.talker.codec_eos_token_id
    for text in ("Stop.", "Stop here please.", "And now stop.", "Stopping is a thing."):
        result = tiny_engine.run_batch([{"inputs": speech_inputs(tiny_ckpt, text), "sampling": greedy(48, repetition_penalty=2.0)}])[0]
        if result.finish_reason == "stop":
            break
    assert result.finish_reason == "stop", "no text met EOS; pick another"
    codes = frames(result, tiny_cfg.talker.num_code_groups)
    assert (codes[:, 0] != eos).all() and len(codes) >= 2  # min_tokens keeps two frames
    assert result.cat("audio").numel() == len(codes) * tiny_cfg.codec.samples_per_frame


def _collect(handle) -> dict[str, list[torch.Tensor]]:
    signals: dict[str, list[torch.Tensor]] = {}
    while True:
        out = handle.queue.get()
        if out.signal is not None:
            signals.setdefault(out.signal, []).append(out.data)
        if out.finished:
            assert out.error is None, out.error
            return signals


def test_arrivals_mid_decode_share_mixed_steps(engines, tiny_ckpt, requests, alone) -> None:
    """A request arriving while another decodes prefills in the same forward (mixed batch)."""
    engine = engines(tiny_ckpt, max_num_batched_tokens=4096)
    talker = engine.core.nodes["talker"].submodule
    batches: list[set[str]] = []

    def recording_preprocess(walk, engine_inputs, inputs, _orig=talker.preprocess):
        batches.append({engine_inputs.per_request_info[r].walk for r in engine_inputs.request_ids})
        return _orig(walk, engine_inputs, inputs)

    talker.preprocess = recording_preprocess
    # Holding the engine's lock keeps its thread out; the test steps the core itself, so
    # the second request arrives mid-decode whatever the machine's load.
    with engine._lock:
        first = engine.add_request(**requests[3])
        seen = []
        while len(seen) < 3:  # let it decode a few frames first
            for out in engine.core.step():
                if out.request_id == first.request_id and out.signal is not None:
                    seen.append(out)
                else:
                    first.queue.put(out)
        assert first.request_id in engine.core.running, "the first request ended before the second arrived"
        second = engine.add_request(**requests[0])
    late, rest = _collect(second), _collect(first)
    assert torch.equal(torch.cat(late["codes"]), alone[0].cat("codes"))
    assert torch.equal(torch.cat(late["audio"]), alone[0].cat("audio"))
    codes = torch.cat([o.data for o in seen if o.signal == "codes"] + rest["codes"])
    assert torch.equal(codes, alone[3].cat("codes"))
    del talker.preprocess
    assert {"prefill", "decode"} in batches, "the late prefill never shared a forward with a decode row"


@pytest.fixture(scope="module")
def eos_engine(engines, tiny_ckpt, tiny_cfg):
    """An engine of its own whose talker always prefers EOS (once min_tokens allows it)."""
    engine = engines(tiny_ckpt, max_num_seqs=8)
    eos = tiny_cfg.talker.codec_eos_token_id

    def prefer_eos(module, args, out):
        out[:, eos] = 1e4
        return out

    engine.core.nodes["talker"].submodule.codec_head.register_forward_hook(prefer_eos)
    return engine


@pytest.mark.parametrize("ignore_eos", [False, True])
def test_eos_frames_never_reach_the_codec(eos_engine, tiny_ckpt, tiny_cfg, ignore_eos: bool) -> None:
    main = {"temperature": 0.0, "max_tokens": 6, "ignore_eos": ignore_eos}
    result = eos_engine.run_batch([{"inputs": speech_inputs(tiny_ckpt, "End."), "sampling": sampling(main, {"temperature": 0.0})}])[0]
    assert result.error is None, result.error
    codes = frames(result, tiny_cfg.talker.num_code_groups)
    # min_tokens bars EOS for two frames, unless EOS is ignored (then it is no stop token).
    kept = 0 if ignore_eos else 2
    assert len(codes) == kept and (codes[:, 0] != tiny_cfg.talker.codec_eos_token_id).all()
    assert result.finish_reason == ("length" if ignore_eos else "stop")
    assert result.cat("audio").numel() == kept * tiny_cfg.codec.samples_per_frame
