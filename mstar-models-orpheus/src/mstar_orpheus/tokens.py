"""Orpheus's special tokens, looked up by name in the checkpoint's tokenizer.

Orpheus extends the Llama-3 vocabulary with ``<custom_token_N>`` tokens. The first ten are
control tokens (their roles below); from N = 10 on, seven bands of ``codebook_size``
tokens carry SNAC codes, band k for position k of each 7-token frame.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

CUSTOM_TOKEN = "<custom_token_{}>"
AUDIO_TOKEN_OFFSET = 10  # custom tokens 0..9 are control tokens, audio codes start at 10
TOKENS_PER_FRAME = 7

# Role -> token text (the ids are read from the tokenizer, never assumed).
SPECIAL_TOKENS = {
    "start_of_speech": CUSTOM_TOKEN.format(1),
    "end_of_speech": CUSTOM_TOKEN.format(2),
    "start_of_human": CUSTOM_TOKEN.format(3),
    "end_of_human": CUSTOM_TOKEN.format(4),
    "start_of_ai": CUSTOM_TOKEN.format(5),
    "end_of_text": "<|eot_id|>",
}


@dataclass(frozen=True)
class OrpheusTokens:
    start_of_speech: int
    end_of_speech: int
    start_of_human: int
    end_of_human: int
    start_of_ai: int
    end_of_text: int
    custom_token_base: int  # id of <custom_token_0> (= id of <custom_token_10> - 10)

    @classmethod
    def from_tokenizer(cls, tokenizer_file: Path, codebook_size: int) -> OrpheusTokens:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tokenizer_file))
        ids: dict[str, int] = {}
        first_audio = CUSTOM_TOKEN.format(AUDIO_TOKEN_OFFSET)
        missing = []
        for role, text in {**SPECIAL_TOKENS, "first_audio": first_audio}.items():
            tid = tok.token_to_id(text)
            if tid is None:
                missing.append(text)
            else:
                ids[role] = tid
        if missing:
            raise ValueError(f"{tokenizer_file} is not an Orpheus tokenizer: it lacks {missing}")
        base = ids.pop("first_audio") - AUDIO_TOKEN_OFFSET
        ids["custom_token_base"] = base
        last = AUDIO_TOKEN_OFFSET + TOKENS_PER_FRAME * codebook_size - 1
        for n in (*range(1, 6), last):  # the control tokens and the last audio token
            if tok.token_to_id(CUSTOM_TOKEN.format(n)) != base + n:
                raise ValueError(
                    f"{tokenizer_file}: {CUSTOM_TOKEN.format(n)} is not id {base + n}; Orpheus's custom "
                    "tokens must be contiguous"
                )
        return cls(**ids)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OrpheusTokens:
        return cls(**d)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    @property
    def prompt_suffix(self) -> tuple[int, ...]:
        """Closes the human turn and opens the AI's speech (the official prompt layout)."""
        return (self.end_of_text, self.end_of_human, self.start_of_ai, self.start_of_speech)
