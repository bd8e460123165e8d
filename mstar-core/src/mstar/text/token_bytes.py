"""One token's text and bytes, for logprobs (OpenAI's ``token`` and ``bytes`` fields).

A token alone may be part of a character (byte-level BPE, byte fallback), so its bytes
come from the vocabulary string itself, read by the tokenizer's decoder kind:
byte-level (GPT-2's byte↔character table), SentencePiece (``▁`` is a space, ``<0xNN>`` a
byte) or plain text. Added tokens are their content.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from mstar.text.detokenizer import decoder_types

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
SPIECE_SPACE = "\u2581"


@functools.cache
def byte_level_table() -> dict[str, int]:
    """Character → byte of byte-level BPE vocabularies: printable Latin-1 bytes stand for
    themselves; the other bytes, in order, for U+0100 onwards."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


class TokenRenderer:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        kinds = decoder_types(tokenizer)
        self.byte_level = "ByteLevel" in kinds
        self.added = {int(i): t.content for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()}

    def token_bytes(self, token_id: int) -> bytes:
        if token_id in self.added:
            return self.added[token_id].encode()
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        if piece is None:
            return b""
        if self.byte_level:
            table = byte_level_table()
            return bytes(table[c] for c in piece if c in table)
        m = _BYTE_FALLBACK.match(piece)
        if m:
            return bytes([int(m.group(1), 16)])
        return piece.replace(SPIECE_SPACE, " ").encode()

    def token_text(self, token_id: int) -> str:
        """The token's bytes as text; bytes that are only part of a character show as
        ``\\xNN`` escapes (their values are in ``token_bytes``)."""
        return self.token_bytes(token_id).decode("utf-8", errors="backslashreplace")
