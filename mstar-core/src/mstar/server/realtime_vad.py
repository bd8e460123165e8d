"""``server_vad`` turn detection for ``/v1/realtime``: Silero VAD (the ``silero-vad`` wheel,
which carries its model; runs offline) over the session's 24 kHz input, with OpenAI's
``threshold``, ``prefix_padding_ms`` and ``silence_duration_ms``.

Speech starts at the first 32 ms window whose speech probability reaches ``threshold``; it
stops once every window for ``silence_duration_ms`` stays below ``threshold - 0.15``
(Silero's own hysteresis, so a word's soft tail does not end the turn). Positions are
milliseconds of audio since the session began.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mstar.api.realtime import ServerVad

IN_RATE, VAD_RATE = 24000, 16000
WINDOW = 512  # samples at 16 kHz: the window Silero scores (32 ms)
WINDOW_MS = WINDOW * 1000 // VAD_RATE
HYSTERESIS = 0.15


def vad_available() -> bool:
    try:
        import silero_vad  # noqa: F401
        import soxr  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass
class VadEvent:
    kind: str  # "started" | "stopped"
    ms: int  # since the session's first input audio


class Vad:
    def __init__(self, config: ServerVad) -> None:
        import soxr
        from silero_vad import load_silero_vad

        self.config = config
        self.model: Any = load_silero_vad()  # one per session: the model keeps its state
        self.resampler = soxr.ResampleStream(IN_RATE, VAD_RATE, 1, dtype="float32")
        self.pending = np.zeros(0, np.float32)
        self.windows = 0  # scored so far
        self.speaking = False
        self.quiet_ms = 0  # below the lower threshold since

    def feed(self, pcm16: bytes) -> list[VadEvent]:
        """Score the new audio (runs torch: call it off the event loop)."""
        import torch

        samples = np.frombuffer(pcm16, "<i2").astype(np.float32) / 32768.0
        self.pending = np.concatenate([self.pending, self.resampler.resample_chunk(samples)])
        events: list[VadEvent] = []
        low = max(self.config.threshold - HYSTERESIS, 0.0)
        while self.pending.shape[0] >= WINDOW:
            window, self.pending = self.pending[:WINDOW], self.pending[WINDOW:]
            with torch.inference_mode():
                p = float(self.model(torch.from_numpy(window.copy()), VAD_RATE))
            start_ms = self.windows * WINDOW_MS
            self.windows += 1
            if not self.speaking and p >= self.config.threshold:
                self.speaking, self.quiet_ms = True, 0
                events.append(VadEvent("started", start_ms))
            elif self.speaking:
                self.quiet_ms = self.quiet_ms + WINDOW_MS if p < low else 0
                if self.quiet_ms >= max(self.config.silence_duration_ms, WINDOW_MS):
                    self.speaking = False
                    events.append(VadEvent("stopped", start_ms + WINDOW_MS - self.quiet_ms))
        return events
