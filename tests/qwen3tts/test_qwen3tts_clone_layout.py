"""The voice-clone prompt as ids (Base): the x-vector slot where a speaker's codec id would
be, and the in-context layouts (reference transcript + text + EOS beside codec pads, then the
codec BOS and one position per reference frame; or side by side with trailing text)."""

from __future__ import annotations

import pytest
import torch
from mstar_qwen3tts.prompt import NO_CODEC, REF_FRAME, SPEAKER_SLOT, PromptError, build_clone_prompt
from qwen3tts_helpers import token_ids

TEXT = "Hello there, world!"
REF_IDS = [40, 41, 42]


def _clone(cfg, frames: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.ones(cfg.talker.hidden_size), torch.zeros(frames, cfg.talker.num_code_groups, dtype=torch.long)


def test_x_vector_only_layout_is_the_plain_one_with_a_speaker_slot(tiny_cfg, tiny_ckpt) -> None:
    ids = token_ids(tiny_ckpt, TEXT)
    spk, codes = _clone(tiny_cfg, 0)
    p = build_clone_prompt(tiny_cfg, ids, spk, codes, [], "english", True)
    t = tiny_cfg.talker
    assert p.codec_ids[:9] == [NO_CODEC] * 3 + [t.codec_think_id, t.codec_think_bos_id, t.codec_language_id["english"],
                                                t.codec_think_eos_id, SPEAKER_SLOT, t.codec_pad_id]
    assert REF_FRAME not in p.codec_ids and p.trailing_ids == [tiny_cfg.tts_pad_token_id]
    inputs = p.inputs()
    assert inputs["speaker_embed"].shape == (t.hidden_size,) and inputs["ref_codes"].shape == (0, t.num_code_groups)


@pytest.mark.parametrize("frames", [2, 40])
def test_in_context_full_text_layout(tiny_cfg, tiny_ckpt, frames: int) -> None:
    ids = token_ids(tiny_ckpt, TEXT)
    text, t = ids[3:-5], tiny_cfg.talker
    p = build_clone_prompt(tiny_cfg, ids, *_clone(tiny_cfg, frames), REF_IDS, "auto", True)
    body_text, body_codec = p.text_ids[-(len(REF_IDS) + len(text) + 1 + frames + 1):], p.codec_ids[-(len(REF_IDS) + len(text) + 1 + frames + 1):]
    stream = [*REF_IDS, *text, tiny_cfg.tts_eos_token_id]
    assert body_text == [*stream, *[tiny_cfg.tts_pad_token_id] * (frames + 1)]
    assert body_codec == [*[t.codec_pad_id] * len(stream), t.codec_bos_id, *[REF_FRAME] * frames]
    assert p.trailing_ids == [tiny_cfg.tts_pad_token_id]


@pytest.mark.parametrize("frames", [2, 40])
def test_in_context_incremental_layout(tiny_cfg, tiny_ckpt, frames: int) -> None:
    ids = token_ids(tiny_ckpt, TEXT)
    text, t = ids[3:-5], tiny_cfg.talker
    stream = [*REF_IDS, *text, tiny_cfg.tts_eos_token_id]
    p = build_clone_prompt(tiny_cfg, ids, *_clone(tiny_cfg, frames), REF_IDS, "auto", False)
    codes = [t.codec_bos_id, *[REF_FRAME] * frames]
    assert p.codec_ids[-len(codes):] == codes
    if len(stream) > len(codes):  # the text outlasts the codes: the rest trails
        assert p.text_ids[-len(codes):] == stream[: len(codes)] and p.trailing_ids == stream[len(codes):]
    else:  # text pads fill in beside the codes
        assert p.text_ids[-len(codes):] == [*stream, *[tiny_cfg.tts_pad_token_id] * (len(codes) - len(stream))]
        assert p.trailing_ids == [tiny_cfg.tts_pad_token_id]


@pytest.mark.parametrize(
    ("spk_size", "codes_shape", "ref_ids", "param"),
    [(5, (2, None), REF_IDS, "voice"), (None, (2, 3), REF_IDS, "voice"), (None, (2, None), [], "ref_text")],
)
def test_bad_clone_prompts(tiny_cfg, tiny_ckpt, spk_size, codes_shape, ref_ids, param) -> None:
    t = tiny_cfg.talker
    spk = torch.ones(spk_size or t.hidden_size)
    codes = torch.zeros(codes_shape[0], codes_shape[1] or t.num_code_groups, dtype=torch.long)
    with pytest.raises(PromptError) as err:
        build_clone_prompt(tiny_cfg, token_ids(tiny_ckpt, TEXT), spk, codes, ref_ids)
    assert err.value.param == param
