"""The reference pipeline, built from the reference implementations only: the official
Orpheus prompt and streaming decode rule over ``transformers`` and ``snac``."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import torch

START_OF_HUMAN, END_OF_TEXT, END_OF_HUMAN, START_OF_AI, START_OF_SPEECH = 128259, 128009, 128260, 128261, 128257
END_OF_SPEECH = 128258


@cache
def hf_model(ckpt: Path):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32).eval()


@cache
def hf_tokenizer(ckpt: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(ckpt))


@cache
def snac_model(ckpt: Path):
    from snac import SNAC

    return SNAC.from_pretrained(str(ckpt / "snac")).eval()


def official_prompt(ckpt: Path, text: str, voice: str) -> list[int]:
    """As the official package: the tokenizer's ids (with BOS) of "voice: text" between
    start-of-human and end-of-text, end-of-human, start-of-AI, start-of-speech."""
    body = hf_tokenizer(ckpt)(f"{voice}: {text}").input_ids
    return [START_OF_HUMAN, *body, END_OF_TEXT, END_OF_HUMAN, START_OF_AI, START_OF_SPEECH]


def hf_greedy(ckpt: Path, prompt: list[int], max_new_tokens: int, repetition_penalty: float = 1.0, min_new_tokens: int = 0) -> list[int]:
    model = hf_model(ckpt)
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens,
            do_sample=False, repetition_penalty=repetition_penalty, eos_token_id=END_OF_SPEECH, pad_token_id=END_OF_SPEECH,
        )
    return out[0, len(prompt):].tolist()


def hf_logits(ckpt: Path, prompt: list[int], generated: list[int]) -> torch.Tensor:
    """[len(generated), V]: the logits that predicted each generated token."""
    seq = torch.tensor([prompt + generated[:-1]])
    with torch.inference_mode():
        logits = hf_model(ckpt)(input_ids=seq).logits[0]
    return logits[len(prompt) - 1 :]


def _window_to_snac_codes(window: list[int]) -> list[torch.Tensor] | None:
    """One 28-code window -> SNAC's three levels, or None when a code is out of range
    (the official decoder skips such a window)."""
    level0, level1, level2 = [], [], []
    for f in range(len(window) // 7):
        c = window[7 * f : 7 * f + 7]
        level0.append(c[0])
        level1 += [c[1], c[4]]
        level2 += [c[2], c[3], c[5], c[6]]
    if any(not 0 <= x <= 4096 for x in level0 + level1 + level2):
        return None
    return [torch.tensor([lv], dtype=torch.int32) for lv in (level0, level1, level2)]


def official_stream_audio(ckpt: Path, generated: list[int]) -> np.ndarray:
    """int16 samples of the official streaming decoder for these generated token ids."""
    tokenizer, snac = hf_tokenizer(ckpt), snac_model(ckpt)
    buffer: list[int] = []
    chunks: list[np.ndarray] = []
    for tid in generated:
        text = tokenizer.convert_ids_to_tokens(tid)
        if not (text.startswith("<custom_token_") and text.endswith(">")):
            continue
        code = int(text[len("<custom_token_") : -1]) - 10 - (len(buffer) % 7) * 4096
        if code <= 0:
            continue
        buffer.append(code)
        if len(buffer) % 7 == 0 and len(buffer) >= 28:
            codes = _window_to_snac_codes(buffer[-28:])
            if codes is None:
                continue
            with torch.inference_mode():
                audio = snac.decode(codes)[:, :, 2048:4096]
            chunks.append((audio.numpy() * 32767).astype(np.int16).reshape(-1))
    return np.concatenate(chunks) if chunks else np.zeros(0, np.int16)


def engine_int16(audio: torch.Tensor) -> np.ndarray:
    """The server's float -> 16-bit PCM conversion of engine audio."""
    from mstar.api.audio import to_pcm16

    return np.frombuffer(to_pcm16(audio.numpy()), dtype="<i2")
