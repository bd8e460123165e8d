"""Chat logprobs: a request's tokens paired with its logprob signals, rendered in OpenAI's
shape (``{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}``).

The signals follow ``mstar.api.adapter``'s convention. Values of the text signal and of
the logprob signals arrive in the same order, so the k-th token pairs with the k-th logprob
and the k-th row of top alternatives, whatever batches they arrived in.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from mstar.api.adapter import ApiAdapter

# OpenAI reports a token that cannot be drawn (logprob -inf) as this; JSON has no -inf.
MIN_LOGPROB = -9999.0


def logprob_signals(adapter: ApiAdapter, top_logprobs: int) -> list[str]:
    """The signals a request with ``logprobs`` (and ``top_logprobs`` alternatives) needs."""
    names = [adapter.logprob_signal]
    if top_logprobs > 0:
        names += [adapter.top_logprob_ids_signal, adapter.top_logprob_values_signal]
    return [n for n in names if n]


class LogprobAssembler:
    def __init__(self, adapter: ApiAdapter, top_logprobs: int) -> None:
        self.adapter = adapter
        self.top_n = top_logprobs
        self._ids: list[int] = []
        self._values: list[float] = []
        self._top_ids: list[list[int]] = []
        self._top_values: list[list[float]] = []
        self.content: list[dict[str, Any]] = []  # every entry so far
        self._rendered: dict[int, tuple[str, list[int]]] = {}

    def add_tokens(self, value: torch.Tensor) -> None:
        """Tokens the client sees (stop feeding them once a stop string matched)."""
        self._ids += [int(i) for i in value.reshape(-1).tolist()]

    def add(self, signal: str, value: torch.Tensor) -> bool:
        """Take ``value`` if ``signal`` is a logprob signal; returns whether it was."""
        a = self.adapter
        if signal == a.logprob_signal:
            self._values += value.reshape(-1).tolist()
        elif signal == a.top_logprob_ids_signal and self.top_n:
            self._top_ids += [row[: self.top_n] for row in _rows(value).tolist()]
        elif signal == a.top_logprob_values_signal and self.top_n:
            self._top_values += [row[: self.top_n] for row in _rows(value).tolist()]
        else:
            return False
        return True

    def take(self) -> list[dict[str, Any]]:
        """Entries for tokens whose values are all here and that were not taken before."""
        ready = min(len(self._ids), len(self._values))
        if self.top_n:
            ready = min(ready, len(self._top_ids), len(self._top_values))
        new = [self._entry(k) for k in range(len(self.content), ready)]
        self.content += new
        return new

    def _entry(self, k: int) -> dict[str, Any]:
        entry = self._token(self._ids[k], self._values[k])
        top = zip(self._top_ids[k], self._top_values[k], strict=True) if self.top_n else ()
        entry["top_logprobs"] = [self._token(i, v) for i, v in top]
        return entry

    def _token(self, token_id: int, logprob: float) -> dict[str, Any]:
        rendered = self._rendered.get(token_id)
        if rendered is None:
            rendered = (self.adapter.token_text(token_id), list(self.adapter.token_bytes(token_id)))
            self._rendered[token_id] = rendered
        value = logprob if math.isfinite(logprob) else MIN_LOGPROB
        return {"token": rendered[0], "logprob": max(value, MIN_LOGPROB), "bytes": rendered[1]}


def _rows(value: torch.Tensor) -> torch.Tensor:
    """Top-N values as [tokens, N] (one row per token; a step's value is [N])."""
    return value.reshape(-1, value.shape[-1]) if value.dim() else value.reshape(1, 1)
