"""Turning one request's output items into text, audio and logprobs, with latency metrics."""

from __future__ import annotations

import time

import numpy as np
import torch

from mstar.api.adapter import TextDecoder
from mstar.server.execution import Execution
from mstar.server.logprobs import LogprobAssembler
from mstar.server.runtime import ServerRuntime
from mstar.server.text_output import TextAssembler


class OutputTracker:
    def __init__(
        self,
        rt: ServerRuntime,
        ex: Execution,
        decoder: TextDecoder,
        stop: tuple[str, ...] = (),
        logprobs: LogprobAssembler | None = None,
    ) -> None:
        self.rt = rt
        self.ex = ex
        self.adapter = rt.adapter
        self.text = TextAssembler(decoder, stop)
        self.logprobs = logprobs
        self.tokens = 0
        self.audio: list[np.ndarray] = []
        self.audio_samples = 0
        self._last_text: float | None = None
        self._first_audio: float | None = None

    def consume(self, batch: list[tuple[str, torch.Tensor]]) -> tuple[str, list[np.ndarray]]:
        """(text released by this batch, audio chunks in it); new logprob entries wait in
        ``logprobs.take()``."""
        text: list[str] = []
        audio: list[np.ndarray] = []
        a = self.adapter
        tokens = 0
        lp = self.logprobs
        for signal, value in batch:
            if signal == a.text_signal:
                tokens += a.count_tokens(value)
                if lp is not None and not self.text.stopped:  # tokens past a stop string are not shown
                    lp.add_tokens(value)
                text.append(self.text.feed(value))
            elif signal == a.audio_signal:
                chunk = a.audio_chunk(value)
                audio.append(chunk)
                self.audio.append(chunk)
                self.audio_samples += chunk.shape[0]
            elif lp is not None:
                lp.add(signal, value)
        self.tokens += tokens
        now = time.perf_counter()
        m = self.rt.metrics
        if text:
            m.tokens.inc(tokens)
            if self._last_text is None:
                m.ttft.observe(now - self.ex.arrival)
            else:
                m.itl.observe(now - self._last_text)
            self._last_text = now
        if audio and self._first_audio is None:
            self._first_audio = now
            m.ttfa.observe(now - self.ex.arrival)
        return "".join(text), audio

    def finish(self) -> str:
        if self.audio_samples and self.adapter.sample_rate:
            seconds = self.audio_samples / self.adapter.sample_rate
            self.rt.metrics.rtf.observe((time.perf_counter() - self.ex.arrival) / seconds)
        return self.text.finish()
