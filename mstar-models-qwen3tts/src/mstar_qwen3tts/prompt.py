"""The official prompts (CustomVoice, VoiceDesign, Base voice clone) as token ids (no weights
needed: runs in the API process).

The talker reads, per prefill position, a projected text embedding plus a codec embedding.
We describe the prompt by two id streams of one length, ``text_ids`` and ``codec_ids``
(``-1`` = no codec part, ``-2`` = the cloned speaker's x-vector, ``-3`` = the next
reference frame's summed code embeddings), and ``trailing_ids``: the text fed one token per decode step
after the prefill (then the text pad). qwen-tts has two layouts, both official:

* ``non_streaming_mode=True`` (its default): the whole text sits in the prefill; every
  decode step adds the text pad.
* ``non_streaming_mode=False``: the prefill ends with the first text token; the rest of
  the text, then the text EOS, is fed one token per decode step.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from mstar_qwen3tts.config import Qwen3TTSConfig

NO_CODEC = -1  # a position with text only (role, instruction)
SPEAKER_SLOT = -2  # the cloned speaker's x-vector (request input ``speaker_embed``)
REF_FRAME = -3  # the next frame of the reference codes (request input ``ref_codes``), in order
ROLE_TOKENS = 3  # "<|im_start|>", "assistant", "\n"
TAIL_TOKENS = 5  # "<|im_end|>", "\n", "<|im_start|>", "assistant", "\n"


class PromptError(ValueError):
    """A request names something the model does not have; ``param`` is the field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def assistant_text(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"


def instruct_text(instruct: str) -> str:
    """An instruction (VoiceDesign's voice description, CustomVoice's style) as qwen-tts
    tokenizes it; its ids open the prompt, with no codec part."""
    return f"<|im_start|>user\n{instruct}<|im_end|>\n"


@dataclass(frozen=True)
class SpeechPrompt:
    text_ids: list[int]
    codec_ids: list[int]
    trailing_ids: list[int]
    # Base checkpoints only (their graph takes both inputs): the x-vector [D] and the
    # reference codes [T, G] ([0, G] in x_vector_only_mode).
    speaker_embed: torch.Tensor | None = None
    ref_codes: torch.Tensor | None = None

    def inputs(self) -> dict[str, torch.Tensor]:
        """The engine's request inputs."""
        out = {
            "text_ids": torch.tensor(self.text_ids, dtype=torch.long),
            "codec_ids": torch.tensor(self.codec_ids, dtype=torch.long),
            "trailing_ids": torch.tensor(self.trailing_ids, dtype=torch.long),
        }
        if self.speaker_embed is not None:
            assert self.ref_codes is not None
            out["speaker_embed"] = self.speaker_embed.to(torch.float32).reshape(-1)
            out["ref_codes"] = self.ref_codes.to(torch.long)
        return out


def resolve_language(cfg: Qwen3TTSConfig, language: str, speaker: str | None = None) -> int | None:
    """The language's codec id (None for auto), with the dialect rule: a named dialect
    speaker speaking Chinese (or auto) uses its dialect's language id."""
    talker = cfg.talker
    assert talker.codec_language_id is not None
    lang = language.lower()
    if lang not in cfg.languages:
        raise PromptError(f"unknown language {language!r}; this model speaks {sorted(cfg.languages)}", "language")
    lang_id = None if lang == "auto" else talker.codec_language_id[lang]
    dialect = (talker.spk_is_dialect or {}).get(speaker.lower()) if speaker else None
    if dialect and lang in ("chinese", "auto"):
        lang_id = talker.codec_language_id[str(dialect).lower()]
    return lang_id


def resolve_voice(cfg: Qwen3TTSConfig, speaker: str, language: str) -> tuple[int, int | None]:
    """(speaker codec id, language codec id or None for auto) of a named speaker."""
    talker = cfg.talker
    assert talker.spk_id is not None
    spk = speaker.lower()
    if spk not in talker.spk_id:
        raise PromptError(f"unknown speaker {speaker!r}; this model has {sorted(talker.spk_id)}", "voice")
    return talker.spk_id[spk], resolve_language(cfg, language, spk)


def _split(token_ids: list[int]) -> tuple[list[int], list[int]]:
    if len(token_ids) <= ROLE_TOKENS + TAIL_TOKENS:
        raise PromptError("the input text is empty", "input")
    return token_ids[:ROLE_TOKENS], token_ids[ROLE_TOKENS:-TAIL_TOKENS]


def _head(cfg: Qwen3TTSConfig, role: list[int], lang_id: int | None, speaker: int | None,
          instruct_ids: list[int] | None) -> tuple[list[int], list[int]]:
    """Instruction (text only), role (text only), then the codec prefix (think tags, the
    speaker if any, pad) beside text pads ending in the text BOS. The prefix's final codec
    BOS is left to the caller: it pairs with the first text position of each layout."""
    t = cfg.talker
    think = [t.codec_nothink_id, t.codec_think_bos_id, t.codec_think_eos_id] if lang_id is None else [
        t.codec_think_id, t.codec_think_bos_id, lang_id, t.codec_think_eos_id
    ]
    codec_prefix = [*think, *([] if speaker is None else [speaker]), t.codec_pad_id]
    instruct = list(instruct_ids or [])
    text_ids = [*instruct, *role, *[cfg.tts_pad_token_id] * (len(codec_prefix) - 1), cfg.tts_bos_token_id]
    codec_ids = [*[NO_CODEC] * (len(instruct) + ROLE_TOKENS), *codec_prefix]
    return text_ids, codec_ids


def _plain_body(cfg: Qwen3TTSConfig, text: list[int], non_streaming_mode: bool) -> tuple[list[int], list[int], list[int]]:
    t = cfg.talker
    if non_streaming_mode:
        return ([*text, cfg.tts_eos_token_id, cfg.tts_pad_token_id], [*[t.codec_pad_id] * (len(text) + 1), t.codec_bos_id],
                [cfg.tts_pad_token_id])
    return [text[0]], [t.codec_bos_id], [*text[1:], cfg.tts_eos_token_id]


def build_prompt(
    cfg: Qwen3TTSConfig, token_ids: list[int], speaker: str | None, language: str = "auto", non_streaming_mode: bool = True,
    instruct_ids: list[int] | None = None,
) -> SpeechPrompt:
    """CustomVoice (``speaker``) or VoiceDesign (``speaker=None``) prompt. ``token_ids``: the
    tokenized ``assistant_text(text)``; ``instruct_ids``: the tokenized ``instruct_text(...)``."""
    role, text = _split(token_ids)
    if speaker is None:
        spk_id, lang_id = None, resolve_language(cfg, language)
    else:
        spk_id, lang_id = resolve_voice(cfg, speaker, language)
    text_ids, codec_ids = _head(cfg, role, lang_id, spk_id, instruct_ids)
    body_text, body_codec, trailing = _plain_body(cfg, text, non_streaming_mode)
    return SpeechPrompt([*text_ids, *body_text], [*codec_ids, *body_codec], trailing)


def build_clone_prompt(
    cfg: Qwen3TTSConfig, token_ids: list[int], speaker_embed: torch.Tensor, ref_codes: torch.Tensor,
    ref_text_ids: list[int], language: str = "auto", non_streaming_mode: bool = True,
) -> SpeechPrompt:
    """Base (voice clone) prompt of a computed clone prompt (``speaker_embed``, ``ref_codes``;
    layout in ``clone_prompt_layout``)."""
    t = cfg.talker
    if speaker_embed.numel() != t.hidden_size:
        raise PromptError(f"speaker_embed has {speaker_embed.numel()} values; this model's talker takes {t.hidden_size}", "voice")
    if ref_codes.dim() != 2 or ref_codes.shape[1] != t.num_code_groups:
        raise PromptError(f"ref_codes must be [frames, {t.num_code_groups}], got {tuple(ref_codes.shape)}", "voice")
    layout = clone_prompt_layout(cfg, token_ids, int(ref_codes.shape[0]), ref_text_ids, language, non_streaming_mode)
    return replace(layout, speaker_embed=speaker_embed, ref_codes=ref_codes)


def clone_prompt_layout(
    cfg: Qwen3TTSConfig, token_ids: list[int], ref_frames: int, ref_text_ids: list[int], language: str = "auto",
    non_streaming_mode: bool = True,
) -> SpeechPrompt:
    """The Base prompt's id streams, without its tensors (the engine's encoder nodes may
    compute them): the x-vector sits where a named speaker's codec id would.
    With reference codes (``ref_frames`` > 0, in-context mode) the text stream is the reference transcript, the
    text and the text EOS, and the codec stream the codec BOS then one position per
    reference frame: ``non_streaming_mode`` puts the whole text (beside codec pads) before
    the codec stream (beside text pads); otherwise the two run side by side and the text
    that outlasts the codes trails, one token per decode step."""
    role, text = _split(token_ids)
    t = cfg.talker
    text_ids, codec_ids = _head(cfg, role, resolve_language(cfg, language), SPEAKER_SLOT, None)
    if ref_frames == 0:  # x_vector_only_mode
        body_text, body_codec, trailing = _plain_body(cfg, text, non_streaming_mode)
    else:
        if not ref_text_ids:
            raise PromptError("in-context cloning needs the reference transcript", "ref_text")
        stream = [*ref_text_ids, *text, cfg.tts_eos_token_id]
        codes = [t.codec_bos_id, *[REF_FRAME] * ref_frames]
        if non_streaming_mode:
            body_text = [*stream, *[cfg.tts_pad_token_id] * len(codes)]
            body_codec = [*[t.codec_pad_id] * len(stream), *codes]
            trailing = [cfg.tts_pad_token_id]
        elif len(stream) > len(codes):
            body_text, body_codec, trailing = stream[: len(codes)], codes, stream[len(codes):]
        else:
            body_text = [*stream, *[cfg.tts_pad_token_id] * (len(codes) - len(stream))]
            body_codec, trailing = codes, [cfg.tts_pad_token_id]
    return SpeechPrompt([*text_ids, *body_text], [*codec_ids, *body_codec], trailing)
