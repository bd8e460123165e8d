"""Text of one request: decoding deltas and applying stop strings.

The engine stops on token ids; stop *strings* are matched here, on the decoded text. A
delta is held back while its tail could still be the start of a stop string, so a client
never sees text that is later cut off. The text ends before the first stop string to
complete (OpenAI: the stop string itself is not returned); finish_reason is then "stop".
"""

from __future__ import annotations

import torch

from mstar.api.adapter import TextDecoder


def stop_strings(stop: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    """A request's ``stop`` field (OpenAI allows one string or a list) as a tuple."""
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(stop)


def finish_reason(engine_reason: str | None) -> str:
    """OpenAI's ``finish_reason``: "length" when the token limit (``max_tokens`` or the
    context) ended the text, else "stop" (a stop string, a stop token or EOS)."""
    return "length" if engine_reason == "length" else "stop"


class TextAssembler:
    def __init__(self, decoder: TextDecoder, stop: tuple[str, ...] | list[str] = ()) -> None:
        self.decoder = decoder
        self.stop = tuple(s for s in stop if s)
        self._hold = max((len(s) for s in self.stop), default=1) - 1
        self._pending = ""  # decoded, not yet released
        self.text = ""  # released so far
        self.stopped = False

    def feed(self, value: torch.Tensor) -> str:
        """Decode one value; returns the text now safe to release."""
        if self.stopped:
            return ""
        return self._release(self.decoder.decode(value), final=False)

    def finish(self) -> str:
        if self.stopped:
            return ""
        return self._release(self.decoder.flush(), final=True)

    def _release(self, piece: str, final: bool) -> str:
        self._pending += piece
        if self.stop:
            window = self.text[-self._hold:] if self._hold else ""
            joined = window + self._pending
            # The stop string that completes first when reading left to right (ties: the
            # longer one), so the cut never depends on how the text arrived in pieces.
            hits = [(i + len(s), i) for s, i in ((s, joined.find(s)) for s in self.stop) if i >= 0]
            if hits:
                cut = min(hits)[1] - len(window)
                out = self._pending[: max(cut, 0)]
                self.text += out
                self._pending = ""
                self.stopped = True
                return out
        keep = 0 if final or not self.stop else min(self._hold, len(self._pending))
        out = self._pending[: len(self._pending) - keep]
        self._pending = self._pending[len(out):]
        self.text += out
        return out
