"""The CustomVoice prompt: both official layouts, speakers, languages and dialects, and the
text tokenizer (vocab/merges or tokenizer.json)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from mstar_qwen3tts.prompt import NO_CODEC, PromptError, assistant_text, build_prompt
from mstar_qwen3tts.text_tokenizer import encode, load_tokenizer
from qwen3tts_helpers import token_ids

TEXT = "Hello there, world!"


def _text_tokens(tiny_ckpt: Path) -> list[int]:
    return token_ids(tiny_ckpt, TEXT)[3:-5]


def test_full_text_layout(tiny_cfg, tiny_ckpt) -> None:
    ids = token_ids(tiny_ckpt, TEXT)
    p = build_prompt(tiny_cfg, ids, "vivian", "english", non_streaming_mode=True)
    t, text = tiny_cfg.talker, _text_tokens(tiny_ckpt)
    assert len(p.text_ids) == len(p.codec_ids)
    assert p.text_ids[:3] == ids[:3] and p.codec_ids[:3] == [NO_CODEC] * 3
    lang = t.codec_language_id["english"]
    prefix = [t.codec_think_id, t.codec_think_bos_id, lang, t.codec_think_eos_id, t.spk_id["vivian"], t.codec_pad_id]
    assert p.codec_ids[3:9] == prefix
    assert p.text_ids[3:9] == [tiny_cfg.tts_pad_token_id] * 5 + [tiny_cfg.tts_bos_token_id]
    assert p.text_ids[9:] == [*text, tiny_cfg.tts_eos_token_id, tiny_cfg.tts_pad_token_id]
    assert p.codec_ids[9:] == [t.codec_pad_id] * (len(text) + 1) + [t.codec_bos_id]
    assert p.trailing_ids == [tiny_cfg.tts_pad_token_id]


def test_incremental_layout(tiny_cfg, tiny_ckpt) -> None:
    p = build_prompt(tiny_cfg, token_ids(tiny_ckpt, TEXT), "vivian", "auto", non_streaming_mode=False)
    t, text = tiny_cfg.talker, _text_tokens(tiny_ckpt)
    # auto: no language, "nothink" prefix
    assert p.codec_ids[3:8] == [t.codec_nothink_id, t.codec_think_bos_id, t.codec_think_eos_id, t.spk_id["vivian"], t.codec_pad_id]
    assert p.text_ids[-1] == text[0] and p.codec_ids[-1] == t.codec_bos_id
    assert p.trailing_ids == [*text[1:], tiny_cfg.tts_eos_token_id]


@pytest.mark.parametrize(
    ("speaker", "language", "expected"),
    [
        ("dylan", "chinese", "beijing_dialect"),
        ("Dylan", "Auto", "beijing_dialect"),
        ("eric", "auto", "sichuan_dialect"),
        ("dylan", "english", "english"),
        ("ryan", "auto", None),
    ],
)
def test_dialect_speakers(tiny_cfg, tiny_ckpt, speaker: str, language: str, expected: str | None) -> None:
    p = build_prompt(tiny_cfg, token_ids(tiny_ckpt, TEXT), speaker, language)
    t = tiny_cfg.talker
    if expected is None:
        assert p.codec_ids[3] == t.codec_nothink_id
    else:
        assert p.codec_ids[3:6] == [t.codec_think_id, t.codec_think_bos_id, t.codec_language_id[expected]]


@pytest.mark.parametrize(
    ("speaker", "language", "param"),
    [("alloy", "auto", "voice"), ("vivian", "klingon", "language"), ("vivian", "beijing_dialect", "language")],
)
def test_unknown_speaker_or_language(tiny_cfg, tiny_ckpt, speaker: str, language: str, param: str) -> None:
    with pytest.raises(PromptError) as err:
        build_prompt(tiny_cfg, token_ids(tiny_ckpt, TEXT), speaker, language)
    assert err.value.param == param
    assert "vivian" in str(err.value) or "english" in str(err.value)


def test_empty_text_is_rejected(tiny_cfg, tiny_ckpt) -> None:
    with pytest.raises(PromptError, match="empty"):
        build_prompt(tiny_cfg, token_ids(tiny_ckpt, ""), "vivian")


def test_languages_are_auto_and_non_dialects(tiny_cfg) -> None:
    assert tiny_cfg.languages[0] == "auto"
    assert not any("dialect" in lang for lang in tiny_cfg.languages)


def test_tokenizer_keeps_specials_and_role(tiny_cfg, tiny_ckpt) -> None:
    ids = token_ids(tiny_ckpt, TEXT)
    assert ids[0] == tiny_cfg.im_start_token_id and ids[-5] == tiny_cfg.im_end_token_id
    assert ids[-3] == tiny_cfg.im_start_token_id
    assert len(ids[:3]) == 3 and ids[1] == ids[-2]  # "assistant" is one token


def test_tokenizer_json_gives_the_same_ids(tiny_ckpt, tmp_path: Path) -> None:
    tok = load_tokenizer(tiny_ckpt)
    shutil.copytree(tiny_ckpt, tmp_path / "ckpt")
    (tmp_path / "ckpt" / "tokenizer.json").write_text(tok.to_str())
    for f in ("vocab.json", "merges.txt"):
        (tmp_path / "ckpt" / f).unlink()
    text = assistant_text("Grüße, 你好 and 42 'll")
    assert encode(load_tokenizer(tmp_path / "ckpt"), text) == encode(tok, text)
