"""Parity with qwen-tts 0.1.1 (the ``base`` fixtures) through the engine's encoder nodes: the
reference clip goes in as its features (``ref_mel``, ``ref_wave``; kwarg ``clone_encode``),
nodes ``speaker_encoder`` and ``codec_encoder`` compute the clone prompt, and the talker's
logits, the greedy codes and the audio match the reference as they do for a prompt computed
beforehand (``test_qwen3tts_variants_parity``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mstar_qwen3tts.clone_loading import codec_encoder_rates, reference_frames
from mstar_qwen3tts.clone_prompt import reference_features, transcript_ids
from mstar_qwen3tts.config import Qwen3TTSConfig, load_config
from mstar_qwen3tts.prompt import clone_prompt_layout
from qwen3tts_helpers import LogitRecorder, frames, greedy, token_ids
from qwen3tts_reference import Reference, load_reference
from test_qwen3tts_variants_parity import (
    AUDIO_ATOL,
    LOGITS_ATOL,
    VARIANT_CASES,
    _case,
    _clone_encoder,
    clip,
)


def node_request(ref: Reference, case: dict) -> dict:
    config = load_config(ref.ckpt)
    cfg = Qwen3TTSConfig.from_dict(config)
    icl = bool(case.get("ref_text"))
    feats = reference_features(clip(ref, case).numpy(), case["ref_sr"], cfg.speaker_encoder.sample_rate,
                               codec_encoder_rates(config)[0], case.get("ref_text"), not icl)
    ref_ids = transcript_ids(_clone_encoder(str(ref.ckpt)).tokenize, case["ref_text"]) if icl else []
    frames_ = reference_frames(config, feats.wave.numel()) if feats.wave is not None else 0
    layout = clone_prompt_layout(cfg, token_ids(ref.ckpt, case["text"]), frames_, ref_ids, case["language"],
                                 case["non_streaming_mode"])
    inputs = {**layout.inputs(), "ref_mel": feats.mel}
    if feats.wave is None:
        inputs["ref_codes"] = torch.zeros(0, cfg.talker.num_code_groups, dtype=torch.long)
    else:
        inputs["ref_wave"] = feats.wave
    return {"inputs": inputs, "kwargs": {"clone_encode": "in_context" if icl else "x_vector_only"},
            "sampling": greedy(case["max_new_tokens"])}


@pytest.fixture(scope="module")
def ref(reference_root: Path) -> Reference:
    return load_reference("base", reference_root)


@pytest.mark.parametrize("case_name", VARIANT_CASES["base"])
def test_clone_through_the_encoder_nodes_matches_reference(ref: Reference, engines, case_name: str) -> None:
    case = _case(ref, case_name)
    engine = engines(ref.ckpt)
    forwards = engine.core.stats.forwards_by_group
    before = forwards["codec_encoder:encode_reference"]
    with LogitRecorder(engine) as rec:
        result = engine.run_batch([node_request(ref, case)])[0]
    assert result.error is None, result.error
    assert forwards["codec_encoder:encode_reference"] - before == (1 if case.get("ref_text") else 0)
    want_talker, want_predictor = ref.get(case_name, "talker_logits"), ref.get(case_name, "predictor_logits")
    torch.testing.assert_close(rec.talker_logits()[: len(want_talker)], want_talker, atol=LOGITS_ATOL, rtol=0)
    torch.testing.assert_close(rec.predictor_logits()[: len(want_predictor)], want_predictor, atol=LOGITS_ATOL, rtol=0)
    want_codes = ref.get(case_name, "codes")
    assert torch.equal(frames(result, want_codes.shape[1])[: len(want_codes)], want_codes)
    want_audio = ref.get(case_name, "audio")
    torch.testing.assert_close(result.cat("audio")[: len(want_audio)], want_audio, atol=AUDIO_ATOL, rtol=0)
