"""The official CustomVoice prompt, as token ids (no weights needed: runs in the API process).

The talker reads, per prefill position, a projected text embedding plus a codec embedding.
We describe the prompt by two id streams of one length, ``text_ids`` and ``codec_ids``
(``-1`` = no codec part), and ``trailing_ids``: the text fed one token per decode step
after the prefill (then the text pad). qwen-tts has two layouts, both official:

* ``non_streaming_mode=True`` (its default): the whole text sits in the prefill; every
  decode step adds the text pad.
* ``non_streaming_mode=False``: the prefill ends with the first text token; the rest of
  the text, then the text EOS, is fed one token per decode step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mstar_qwen3tts.config import Qwen3TTSConfig

NO_CODEC = -1
ROLE_TOKENS = 3  # "<|im_start|>", "assistant", "\n"
TAIL_TOKENS = 5  # "<|im_end|>", "\n", "<|im_start|>", "assistant", "\n"


class PromptError(ValueError):
    """A request names something the model does not have; ``param`` is the field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def assistant_text(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"


@dataclass(frozen=True)
class SpeechPrompt:
    text_ids: list[int]
    codec_ids: list[int]
    trailing_ids: list[int]

    def inputs(self) -> dict[str, torch.Tensor]:
        """The engine's request inputs."""
        return {
            "text_ids": torch.tensor(self.text_ids, dtype=torch.long),
            "codec_ids": torch.tensor(self.codec_ids, dtype=torch.long),
            "trailing_ids": torch.tensor(self.trailing_ids, dtype=torch.long),
        }


def resolve_voice(cfg: Qwen3TTSConfig, speaker: str, language: str) -> tuple[int, int | None]:
    """(speaker codec id, language codec id or None for auto), with the dialect rule:
    a dialect speaker speaking Chinese (or auto) uses its dialect's language id."""
    talker = cfg.talker
    assert talker.spk_id is not None and talker.codec_language_id is not None
    spk = speaker.lower()
    if spk not in talker.spk_id:
        raise PromptError(f"unknown speaker {speaker!r}; this model has {sorted(talker.spk_id)}", "voice")
    lang = language.lower()
    if lang not in cfg.languages:
        raise PromptError(f"unknown language {language!r}; this model speaks {sorted(cfg.languages)}", "language")
    lang_id = None if lang == "auto" else talker.codec_language_id[lang]
    dialect = (talker.spk_is_dialect or {}).get(spk)
    if dialect and lang in ("chinese", "auto"):
        lang_id = talker.codec_language_id[str(dialect).lower()]
    return talker.spk_id[spk], lang_id


def build_prompt(
    cfg: Qwen3TTSConfig, token_ids: list[int], speaker: str, language: str = "auto", non_streaming_mode: bool = True
) -> SpeechPrompt:
    """``token_ids``: the tokenized ``assistant_text(text)``."""
    if len(token_ids) <= ROLE_TOKENS + TAIL_TOKENS:
        raise PromptError("the input text is empty", "input")
    spk_id, lang_id = resolve_voice(cfg, speaker, language)
    t = cfg.talker
    think = [t.codec_nothink_id, t.codec_think_bos_id, t.codec_think_eos_id] if lang_id is None else [
        t.codec_think_id, t.codec_think_bos_id, lang_id, t.codec_think_eos_id
    ]
    codec_prefix = [*think, spk_id, t.codec_pad_id, t.codec_bos_id]
    role, text = token_ids[:ROLE_TOKENS], token_ids[ROLE_TOKENS:-TAIL_TOKENS]
    # Role tokens carry no codec; the codec prefix (but its final BOS) runs beside text pads
    # ending in the text BOS.
    text_ids = [*role, *[cfg.tts_pad_token_id] * (len(codec_prefix) - 2), cfg.tts_bos_token_id]
    codec_ids = [*[NO_CODEC] * ROLE_TOKENS, *codec_prefix[:-1]]
    if non_streaming_mode:
        text_ids += [*text, cfg.tts_eos_token_id, cfg.tts_pad_token_id]
        codec_ids += [*[t.codec_pad_id] * (len(text) + 1), t.codec_bos_id]
        trailing = [cfg.tts_pad_token_id]
    else:
        text_ids.append(text[0])
        codec_ids.append(t.codec_bos_id)
        trailing = [*text[1:], cfg.tts_eos_token_id]
    return SpeechPrompt(text_ids, codec_ids, trailing)
