"""The Orpheus speech prompt: ``{voice}: {text}`` tokenized (with BOS), wrapped as
``<start_of_human> ... <end_of_text><end_of_human><start_of_ai><start_of_speech>``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mstar_orpheus.config import TOKENIZER_FILE
from mstar_orpheus.tokens import OrpheusTokens

VOICES = ("tara", "leah", "jess", "leo", "dan", "mia", "zac", "zoe")
DEFAULT_VOICE = "tara"


class SpeechPrompt:
    """Builds prompt ids from text and voice. Picklable (the tokenizer loads lazily), so
    it can live in the API's preprocess workers."""

    def __init__(self, tokenizer_file: Path, tokens: OrpheusTokens, max_len: int) -> None:
        self.tokenizer_file = Path(tokenizer_file)
        self.tokens = tokens
        self.max_len = max_len
        self._tokenizer: Any = None

    @classmethod
    def from_config(cls, config: dict[str, Any], checkpoint_dir: Path) -> SpeechPrompt:
        return cls(Path(checkpoint_dir) / TOKENIZER_FILE, OrpheusTokens.from_dict(config["orpheus"]),
                   int(config["max_position_embeddings"]))

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_tokenizer": None}

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            self._tokenizer = Tokenizer.from_file(str(self.tokenizer_file))
        return self._tokenizer

    def encode(self, text: str, voice: str | None = None) -> torch.Tensor:
        """[n] prompt ids. ValueError for an unknown voice, empty text or a prompt that
        leaves no room for speech within the model's length."""
        voice = DEFAULT_VOICE if voice is None else voice
        if voice not in VOICES:
            raise ValueError(f"unknown voice {voice!r}; Orpheus voices: {', '.join(VOICES)}")
        if not text or not text.strip():
            raise ValueError("the input text is empty")
        body = self.tokenizer.encode(f"{voice}: {text}", add_special_tokens=True).ids
        ids = [self.tokens.start_of_human, *body, *self.tokens.prompt_suffix]
        if len(ids) >= self.max_len:
            raise ValueError(
                f"the input is {len(ids)} tokens long; the model holds at most {self.max_len} positions, "
                "prompt and speech together"
            )
        return torch.tensor(ids, dtype=torch.long)
