"""Cutting text that arrives piece by piece (e.g. from an LLM) into sentences to speak.

The rule, in full:

- A sentence ends after a run of terminators (``.``, ``!``, ``?``, ``…`` and the full-width
  / CJK ``。``, ``！``, ``？``, ``．``) and any closing quotes or brackets right after them,
  once the next character has arrived: for an ASCII terminator (``.``, ``!``, ``?``, ``…``)
  that character must be whitespace (so ``3.14`` and ``example.com`` stay whole); after a
  CJK terminator any character will do (CJK text has no spaces).
- A newline always ends a sentence.
- A sentence that reaches ``max_chars`` without an end is cut at its last whitespace
  within the limit (at the limit itself when it has none).
- ``flush()`` ends whatever is left.

Sentences are stripped of surrounding whitespace; one with no letter or digit (e.g. a lone
``...``) is dropped, as there is nothing to speak.
"""

from __future__ import annotations

_ASCII_TERMINATORS = ".!?…"
_CJK_TERMINATORS = "。！？．"
_CLOSERS = "\"')]}’”»」』）】"


class SentenceSplitter:
    def __init__(self, max_chars: int = 300) -> None:
        if max_chars < 1:
            raise ValueError("max_chars must be at least 1")
        self.max_chars = max_chars
        self._buf = ""

    def feed(self, text: str) -> list[str]:
        """The sentences ``text`` completes (possibly none)."""
        self._buf += text
        out: list[str] = []
        while True:
            end = self._sentence_end()
            if end is None:
                break
            out.append(self._buf[:end])
            self._buf = self._buf[end:]
        return [s for s in map(str.strip, out) if _speakable(s)]

    @property
    def pending(self) -> bool:
        """Whether text waits for its sentence's end (flush would speak it)."""
        return _speakable(self._buf.strip())

    def flush(self) -> list[str]:
        """The rest of the text as a last sentence (if it has anything to speak)."""
        rest, self._buf = self._buf.strip(), ""
        return [rest] if _speakable(rest) else []

    def _sentence_end(self) -> int | None:
        buf = self._buf
        limit = min(len(buf), self.max_chars)
        i = 0
        while i < limit:
            ch = buf[i]
            if ch == "\n":
                return i + 1
            if ch in _ASCII_TERMINATORS or ch in _CJK_TERMINATORS:
                j = i
                while j < len(buf) and (buf[j] in _ASCII_TERMINATORS or buf[j] in _CJK_TERMINATORS):
                    j += 1
                while j < len(buf) and buf[j] in _CLOSERS:
                    j += 1
                if j == len(buf):
                    return None  # the next character decides; wait for it
                if buf[j].isspace() or any(c in _CJK_TERMINATORS for c in buf[i:j]):
                    return j
                i = j
                continue
            i += 1
        if len(buf) >= self.max_chars:
            cut = buf.rfind(" ", 1, self.max_chars)
            return cut if cut > 0 else self.max_chars
        return None


def _speakable(sentence: str) -> bool:
    return any(ch.isalnum() for ch in sentence)
