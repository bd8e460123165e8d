"""Parity with qwen-tts 0.1.1 for the other checkpoint kinds, on tiny random checkpoints in
their real layouts (fixtures from mstar-models-qwen3tts/tools/make_fixtures.sh):

* ``base`` (voice clone): the clone prompt of a reference clip (16 kHz, resampled; and
  24 kHz): speaker embedding, reference codes from the speech tokenizer's encoder,
  transcript ids; x_vector_only_mode in both prompt layouts, in-context mode in both
  layouts, with text longer and shorter than the reference codes.
* ``design`` (VoiceDesign): the voice described by an instruction, both layouts.
* ``instruct`` (CustomVoice 1.7B): a speaker with a style instruction, dialect included.

Per case: prompt token ids, prefill embeddings, talker and code-predictor logits of every
step, greedy codes and the decoded audio streamed through the engine (for in-context
cloning, decoded after the reference codes with their audio dropped, as qwen-tts does).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
import torch
from mstar_qwen3tts.clone_prompt import CloneEncoder, ClonePrompt, ref_text_prompt
from mstar_qwen3tts.config import Qwen3TTSConfig, load_config
from mstar_qwen3tts.prompt import build_clone_prompt, build_prompt, instruct_text
from qwen3tts_helpers import LogitRecorder, frames, greedy, token_ids
from qwen3tts_reference import Reference, load_reference

LOGITS_ATOL = 1e-4
AUDIO_ATOL = 1e-5
SPEAKER_ATOL = 1e-4
VARIANT_CASES = {
    "base": ("xvector_full_text", "xvector_incremental_auto", "icl_full_text", "icl_incremental_long_text",
             "icl_incremental_long_ref"),
    "design": ("design_full_text", "design_incremental_auto"),
    "instruct": ("instruct_full_text", "instruct_dialect_incremental"),
}
ALL = [(v, c) for v, cases in VARIANT_CASES.items() for c in cases]


@pytest.fixture(scope="module")
def refs(reference_root: Path):
    return lambda variant: load_reference(variant, reference_root)


def _case(ref: Reference, name: str) -> dict:
    return next(c for c in ref.meta["cases"] if c["name"] == name)


@cache
def _cfg(ckpt: str) -> Qwen3TTSConfig:
    return Qwen3TTSConfig.from_dict(load_config(Path(ckpt)))


@cache
def _clone_encoder(ckpt: str) -> CloneEncoder:
    return CloneEncoder.from_checkpoint(Path(ckpt))


def clip(ref: Reference, case: dict) -> torch.Tensor:
    return ref.tensors[f"clip/{case['ref_sr']}_{case['ref_seconds']}_{case['ref_seed']}"]


def clone_prompt(ref: Reference, case: dict) -> ClonePrompt:
    """Ours, from the clip and the transcript (in-context mode when there is one)."""
    icl = bool(case.get("ref_text"))
    return _clone_encoder(str(ref.ckpt)).encode(clip(ref, case).numpy(), case["ref_sr"], case.get("ref_text"),
                                                x_vector_only_mode=not icl)


def case_inputs(ref: Reference, case: dict) -> dict[str, torch.Tensor]:
    """Our prompt for the case, built from the request's own fields (for a clone: the clip
    and its transcript, through our speaker encoder, codec encoder and tokenizer)."""
    cfg, ckpt = _cfg(str(ref.ckpt)), ref.ckpt
    ids = token_ids(ckpt, case["text"])
    mode = case.get("mode", "custom_voice")
    if mode == "clone":
        clone = clone_prompt(ref, case)
        return build_clone_prompt(cfg, ids, clone.speaker_embed, clone.ref_codes, clone.ref_text_ids.tolist(),
                                  case["language"], case["non_streaming_mode"]).inputs()
    instruct = _clone_encoder_free_tokenize(ckpt, instruct_text(case["instruct"]))
    speaker = case["speaker"] if mode == "custom_voice" else None
    return build_prompt(cfg, ids, speaker, case["language"], case["non_streaming_mode"], instruct).inputs()


def _clone_encoder_free_tokenize(ckpt: Path, text: str) -> list[int]:
    from mstar_qwen3tts.text_tokenizer import encode, load_tokenizer

    return encode(load_tokenizer(ckpt), text)


@pytest.mark.parametrize(("variant", "case_name"), ALL)
def test_token_ids_and_prefill_embeddings(refs, engines, variant: str, case_name: str) -> None:
    ref = refs(variant)
    case = _case(ref, case_name)
    assert token_ids(ref.ckpt, case["text"]) == ref.get(case_name, "input_ids").tolist()
    if case.get("instruct"):
        assert _clone_encoder_free_tokenize(ref.ckpt, instruct_text(case["instruct"])) == ref.get(case_name, "instruct_ids").tolist()
    if case.get("ref_text"):
        ours = _clone_encoder(str(ref.ckpt)).tokenize(ref_text_prompt(case["ref_text"]))
        assert ours == ref.get(case_name, "ref_ids").tolist()
    inputs = case_inputs(ref, case)
    talker = engines(ref.ckpt).core.nodes["talker"].submodule
    embeds = talker.prompt_embeds(inputs["text_ids"], inputs["codec_ids"], inputs["trailing_ids"],
                                  inputs.get("speaker_embed"), inputs.get("ref_codes"))
    torch.testing.assert_close(embeds, ref.get(case_name, "prefill_embeds"), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("case_name", VARIANT_CASES["base"])
def test_clone_prompt_matches_reference(refs, case_name: str) -> None:
    """Speaker embedding (16 kHz clip resampled, and a 24 kHz one), reference codes from the
    speech tokenizer's encoder, and the transcript's ids."""
    ref = refs("base")
    case = _case(ref, case_name)
    ours = clone_prompt(ref, case)
    want = ref.get(case_name, "speaker_embed")
    assert want.abs().max() > 0.1  # not a degenerate embedding
    torch.testing.assert_close(ours.speaker_embed, want, atol=SPEAKER_ATOL, rtol=1e-4)
    if case.get("ref_text"):
        want_codes = ref.get(case_name, "ref_codes")
        assert len(want_codes.unique()) > 3  # the encoder does not map everything to one code
        assert torch.equal(ours.ref_codes, want_codes)
        assert ours.ref_text_ids.tolist() == ref.get(case_name, "ref_ids").tolist()[3:-2]
    else:
        assert ours.x_vector_only_mode and ours.ref_codes.shape == (0, want_codes_groups(ref))


def want_codes_groups(ref: Reference) -> int:
    return _cfg(str(ref.ckpt)).talker.num_code_groups


@pytest.mark.parametrize(("variant", "case_name"), ALL)
def test_logits_greedy_codes_and_streamed_audio(refs, engines, variant: str, case_name: str) -> None:
    ref = refs(variant)
    case = _case(ref, case_name)
    engine = engines(ref.ckpt)
    want_codes = ref.get(case_name, "codes")
    with LogitRecorder(engine) as rec:
        result = engine.run_batch([{"inputs": case_inputs(ref, case), "sampling": greedy(case["max_new_tokens"])}])[0]
    assert result.error is None, result.error
    want_talker, want_predictor = ref.get(case_name, "talker_logits"), ref.get(case_name, "predictor_logits")
    # qwen-tts's last first-codebook token (at max_new_tokens) gets no residual codes; we
    # complete every frame we sample, so we have one frame more than the reference.
    torch.testing.assert_close(rec.talker_logits()[: len(want_talker)], want_talker, atol=LOGITS_ATOL, rtol=0)
    torch.testing.assert_close(rec.predictor_logits()[: len(want_predictor)], want_predictor, atol=LOGITS_ATOL, rtol=0)
    codes = frames(result, want_codes.shape[1])
    assert len(want_codes) == case["max_new_tokens"] - 1 and len(codes) == case["max_new_tokens"]
    assert torch.equal(codes[: len(want_codes)], want_codes)
    # The codec is causal: the reference's frames' audio is the start of ours.
    want_audio = ref.get(case_name, "audio")
    assert want_audio.abs().max() > 0.01
    torch.testing.assert_close(result.cat("audio")[: len(want_audio)], want_audio, atol=AUDIO_ATOL, rtol=0)
