"""The two samplers of the talker step: main (first codebook) and the code predictor's
auxiliary label (residual codebooks). Each one's parameters take effect on its own codes;
seeds reproduce audio byte for byte, alone or beside other requests; unknown labels fail."""

from __future__ import annotations

import pytest
import torch
from mstar.sampling import UnknownSamplerLabelError
from qwen3tts_helpers import AUX, LogitRecorder, frames, sampling, speech_inputs

FRAMES = 12
HOT = {"temperature": 1.5, "top_k": -1, "top_p": 1.0}


@pytest.fixture(scope="module")
def inputs(tiny_ckpt):
    return speech_inputs(tiny_ckpt, "Sampling makes every frame different.", "ryan", "english")


def _run(engine, inputs, main, aux, record=False):
    main = {"max_tokens": FRAMES, "min_tokens": FRAMES, "repetition_penalty": 1.0, **main}
    if record:
        with LogitRecorder(engine) as rec:
            result = engine.run_batch([{"inputs": inputs, "sampling": sampling(main, aux)}])[0]
    else:
        result, rec = engine.run_batch([{"inputs": inputs, "sampling": sampling(main, aux)}])[0], None
    assert result.error is None, result.error
    return result, rec


def _allowed_argmax(talker, logits: torch.Tensor) -> torch.Tensor:
    """The first-codebook argmax under the official suppression, with EOS barred (min_tokens)."""
    masked = logits.masked_fill(talker.suppress_mask, float("-inf"))
    masked[:, talker.cfg.codec_eos_token_id] = float("-inf")
    return masked.argmax(-1)


def test_greedy_main_with_sampled_aux(tiny_engine, inputs) -> None:
    talker = tiny_engine.core.nodes["talker"].submodule
    result, rec = _run(tiny_engine, inputs, {"temperature": 0.0, "seed": 1}, {**HOT}, record=True)
    codes = frames(result, talker.cfg.num_code_groups)
    assert len(codes) == FRAMES
    assert torch.equal(codes[:, 0], _allowed_argmax(talker, rec.talker_logits()))
    residual_argmax = rec.predictor_logits().argmax(-1)
    assert not torch.equal(codes[:, 1:], residual_argmax), "the aux sampler was greedy despite temperature 1.5"
    # Another seed changes the residual codes of the very first frame only through aux.
    other, _ = _run(tiny_engine, inputs, {"temperature": 0.0, "seed": 2}, {**HOT})
    other_codes = frames(other, talker.cfg.num_code_groups)
    assert other_codes[0, 0] == codes[0, 0]
    assert not torch.equal(other_codes[:, 1:], codes[:, 1:])


def test_sampled_main_with_greedy_aux(tiny_engine, inputs) -> None:
    talker = tiny_engine.core.nodes["talker"].submodule
    result, rec = _run(tiny_engine, inputs, {**HOT, "seed": 3}, {"temperature": 0.0}, record=True)
    codes = frames(result, talker.cfg.num_code_groups)
    assert torch.equal(codes[:, 1:], rec.predictor_logits().argmax(-1))
    assert not torch.equal(codes[:, 0], _allowed_argmax(talker, rec.talker_logits())), "main stayed greedy"


def test_aux_values_are_per_request(tiny_engine, inputs) -> None:
    """top_k=1 on the aux label alone makes the residual codes greedy for that request."""
    talker = tiny_engine.core.nodes["talker"].submodule
    result, rec = _run(tiny_engine, inputs, {**HOT, "seed": 4}, {**HOT, "top_k": 1}, record=True)
    codes = frames(result, talker.cfg.num_code_groups)
    assert torch.equal(codes[:, 1:], rec.predictor_logits().argmax(-1))


def _audio_bytes(result) -> bytes:
    return result.cat("audio").numpy().tobytes()


def test_seeded_request_gives_identical_audio_bytes(tiny_engine, tiny_ckpt, inputs) -> None:
    seeded = {"inputs": inputs, "sampling": sampling({"seed": 1234, "max_tokens": FRAMES}, {})}
    first = tiny_engine.run_batch([seeded])[0]
    assert first.error is None and first.seeds["talker"] == 1234
    again = tiny_engine.run_batch([seeded])[0]
    assert _audio_bytes(first) == _audio_bytes(again) and len(_audio_bytes(first)) > 0
    # Under concurrent load: the same request in the middle of seven others (other texts,
    # layouts, seeds, lengths and unseeded ones), all submitted together.
    others = [
        {"inputs": speech_inputs(tiny_ckpt, f"Other request number {i}.", "vivian" if i % 2 else "dylan", "auto", i % 3 != 0),
         "sampling": sampling({"max_tokens": 4 + 3 * i, **({"seed": i} if i % 2 else {})}, {"temperature": 1.2})}
        for i in range(7)
    ]
    loaded = tiny_engine.run_batch([*others[:3], seeded, *others[3:]])
    assert all(r.error is None for r in loaded)
    assert _audio_bytes(loaded[3]) == _audio_bytes(first)
    assert torch.equal(loaded[3].cat("codes"), first.cat("codes"))
    different = tiny_engine.run_batch([{**seeded, "sampling": sampling({"seed": 4321, "max_tokens": FRAMES}, {})}])[0]
    assert _audio_bytes(different) != _audio_bytes(first)


def test_unseeded_requests_get_fresh_reported_seeds(tiny_engine, inputs) -> None:
    request = {"inputs": inputs, "sampling": sampling({"max_tokens": 4}, {})}
    a, b = tiny_engine.run_batch([request, request])
    assert a.seeds["talker"] != b.seeds["talker"]
    replay = tiny_engine.run_batch([{"inputs": inputs, "sampling": sampling({"max_tokens": 4, "seed": a.seeds["talker"]}, {})}])[0]
    assert _audio_bytes(replay) == _audio_bytes(a)


def test_unknown_aux_label_is_rejected(tiny_engine, inputs) -> None:
    with pytest.raises(UnknownSamplerLabelError, match="residual.*code_predictor"):
        tiny_engine.add_request(inputs, {"talker": {"aux": {"residual": {"temperature": 0.5}}}})
    assert tiny_engine.built.node_samplers["talker"].aux.keys() == {AUX}
