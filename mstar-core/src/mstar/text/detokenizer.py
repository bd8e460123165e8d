"""Incremental detokenization: text deltas that concatenate to ``tokenizer.decode(ids)``.

Each step decodes a short window of recent ids twice (the part already shown and the
part with the new ids) and emits the difference. The window restarts at a token whose
text was complete, so a multi-byte character split over tokens (byte-level BPE, byte
fallback) is shown once its last byte arrives, and decoders that treat a sequence's
first token specially (SentencePiece's leading space) see the same first token in both
decodes. Added-token spacing and ``skip_special_tokens`` come from ``decode`` itself.

With byte fallback (``<0xNN>`` tokens), ``decode`` turns a whole run of byte tokens into
U+FFFDs when any of its bytes is invalid, so the window never ends inside such a run.

Exact as long as ``decode`` of a window is the matching slice of ``decode`` of the whole
sequence at a complete-character boundary: true for byte-level BPE and SentencePiece
tokenizers, not for ``clean_up_tokenization_spaces`` (which rewrites across tokens), so
that clean-up is switched off here: the deltas concatenate to
``decode(ids, clean_up_tokenization_spaces=False)`` (the same text for tokenizers that
do not set it, as Llama-, Qwen- and Mistral-family checkpoints do not).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from typing import Any

REPLACEMENT = "\ufffd"  # what decode shows for an incomplete UTF-8 sequence


def decoder_types(tokenizer: Any) -> set[str]:
    """Type names in the fast tokenizer's decoder chain (e.g. {"ByteLevel"}); empty for
    tokenizers without a ``tokenizers`` backend."""
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    if decoder is None:
        return set()
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "type" in node:
                found.add(str(node["type"]))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(json.loads(decoder.__getstate__()))
    return found
_BYTE_TOKEN = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")


@functools.lru_cache(maxsize=8)
def byte_fallback_ids(tokenizer: Any) -> frozenset[int]:
    """Ids of ``<0xNN>`` tokens when the tokenizer's decoder has byte fallback, else none."""
    if "ByteFallback" not in decoder_types(tokenizer):
        return frozenset()
    return frozenset(i for t, i in tokenizer.get_vocab().items() if _BYTE_TOKEN.match(t))


@functools.lru_cache(maxsize=8)
def special_ids(tokenizer: Any) -> frozenset[int]:
    """Ids ``decode(skip_special_tokens=True)`` drops: added tokens marked special."""
    added = getattr(tokenizer, "added_tokens_decoder", {})
    return frozenset(int(i) for i, t in added.items() if getattr(t, "special", False))


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self._prefix = 0  # window start: a token whose text was already shown
        self._read = 0  # ids before this were shown
        self._byte_ids = byte_fallback_ids(tokenizer)
        # Skipped specials vanish before the decoder runs, so byte runs join across them.
        self._skipped = special_ids(tokenizer) if skip_special_tokens else frozenset()

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(
            ids, skip_special_tokens=self.skip_special_tokens, clean_up_tokenization_spaces=False
        )

    def add(self, ids: Iterable[int]) -> str:
        """Feed new ids; returns the text they complete (may be empty)."""
        self.ids.extend(int(i) for i in ids)
        return self._emit(final=False)

    def flush(self) -> str:
        """Whatever is held back (an incomplete character shows as U+FFFD, as in decode)."""
        return self._emit(final=True)

    def _in_byte_run(self) -> bool:
        if not self._byte_ids:
            return False
        last = next((i for i in reversed(self.ids) if i not in self._skipped), None)
        return last in self._byte_ids

    def _emit(self, final: bool) -> str:
        if self._read == len(self.ids):
            return ""
        shown = self._decode(self.ids[self._prefix:self._read])
        full = self._decode(self.ids[self._prefix:])
        if not final and (
            len(full) <= len(shown) or full.endswith(REPLACEMENT) or self._in_byte_run()
        ):
            return ""  # nothing new yet, or the last character (or byte run) may still change
        self._prefix, self._read = self._read, len(self.ids)
        return full[len(shown):]
