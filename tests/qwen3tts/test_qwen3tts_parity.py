"""Parity with qwen-tts 0.1.1 on tiny random checkpoints in the real layout.

The fixtures (tests/qwen3tts/fixtures/, made by mstar-models-qwen3tts/tools/make_fixtures.sh
in a venv of their own) hold, per case and for both prompt layouts, the reference's token
ids, prefill embeddings, talker logits of every step, code-predictor logits per residual
group, greedy codes and decoded audio. Variant ``proj`` has a narrower code predictor
(projection, like 1.7B), ``same`` equal widths (like 0.6B).
"""

from __future__ import annotations

import pytest
import torch
from qwen3tts_helpers import LogitRecorder, frames, greedy, speech_inputs, token_ids
from qwen3tts_reference import Reference, load_reference

VARIANTS = ("proj", "same")
CASES = ("english_full_text", "english_incremental", "dialect_auto_full_text", "dialect_chinese_incremental")
LOGITS_ATOL = 1e-4
AUDIO_ATOL = 1e-5


@pytest.fixture(scope="module", params=VARIANTS)
def ref(request: pytest.FixtureRequest, reference_root) -> Reference:
    return load_reference(request.param, reference_root)


def _case(ref: Reference, name: str) -> dict:
    return next(c for c in ref.meta["cases"] if c["name"] == name)


def _inputs(ref: Reference, case: dict) -> dict[str, torch.Tensor]:
    return speech_inputs(ref.ckpt, case["text"], case["speaker"], case["language"], case["non_streaming_mode"])


def test_fixture_cases_cover_both_layouts_and_a_dialect(ref: Reference) -> None:
    cases = ref.meta["cases"]
    assert [c["name"] for c in cases] == list(CASES)
    assert {c["non_streaming_mode"] for c in cases} == {True, False}
    assert {c["speaker"].lower() for c in cases} >= {"dylan", "eric"}  # dialect speakers


@pytest.mark.parametrize("case_name", CASES)
def test_token_ids_and_prefill_embeddings(ref: Reference, engines, case_name: str) -> None:
    case = _case(ref, case_name)
    assert token_ids(ref.ckpt, case["text"]) == ref.get(case_name, "input_ids").tolist()
    talker = engines(ref.ckpt).core.nodes["talker"].submodule
    inputs = _inputs(ref, case)
    embeds = talker.prompt_embeds(inputs["text_ids"], inputs["codec_ids"], inputs["trailing_ids"])
    torch.testing.assert_close(embeds, ref.get(case_name, "prefill_embeds"), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case_name", CASES)
def test_logits_and_greedy_codes(ref: Reference, engines, case_name: str) -> None:
    case = _case(ref, case_name)
    engine = engines(ref.ckpt)
    groups = ref.get(case_name, "codes").shape[1]
    with LogitRecorder(engine) as rec:
        result = engine.run_batch([{"inputs": _inputs(ref, case), "sampling": greedy(case["max_new_tokens"])}])[0]
    assert result.error is None, result.error
    want_talker = ref.get(case_name, "talker_logits")
    want_predictor = ref.get(case_name, "predictor_logits")
    want_codes = ref.get(case_name, "codes")
    # qwen-tts runs the predictor for a frame on the next step, so its last token (at
    # max_new_tokens) gets no residual codes; we complete every frame we sample.
    torch.testing.assert_close(rec.talker_logits()[: len(want_talker)], want_talker, atol=LOGITS_ATOL, rtol=0)
    torch.testing.assert_close(rec.predictor_logits()[: len(want_predictor)], want_predictor, atol=LOGITS_ATOL, rtol=0)
    codes = frames(result, groups)
    assert torch.equal(codes[: len(want_codes)], want_codes)
    if len(want_codes) < case["max_new_tokens"] - 1:  # the reference met EOS: so must we, there
        assert result.finish_reason == "stop" and len(codes) == len(want_codes)
    else:
        assert result.finish_reason == "length"


@pytest.mark.parametrize("case_name", CASES)
def test_streamed_audio_equals_reference(ref: Reference, engines, case_name: str) -> None:
    case = _case(ref, case_name)
    want = ref.get(case_name, "audio")
    n = len(ref.get(case_name, "codes"))
    result = engines(ref.ckpt).run_batch([{"inputs": _inputs(ref, case), "sampling": greedy(n)}])[0]
    assert result.error is None, result.error
    assert len(result.signals["audio"]) >= 1
    torch.testing.assert_close(result.cat("audio"), want, atol=AUDIO_ATOL, rtol=0)


def test_codec_decodes_like_the_reference(ref: Reference, engines) -> None:
    codec = engines(ref.ckpt).core.nodes["codec"].submodule
    want = ref.tensors["codec/audio"]
    assert want.abs().max() > 0.05 and (want.abs() >= 1).float().mean() < 0.05  # not silent, not clipped
    with torch.inference_mode():
        got = codec.decode(ref.tensors["codec/codes"])
    torch.testing.assert_close(got, want, atol=AUDIO_ATOL, rtol=0)
