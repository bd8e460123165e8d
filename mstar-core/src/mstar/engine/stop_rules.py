"""The stop rule: when a sampling node's row stops, decided once per step for the whole batch.

After a forward that drew main tokens, ``StopRule.apply`` looks at every row whose step
completed, at once (numpy over per-slot arrays kept for the request's whole life, so a step
costs a few array operations, not a loop of Python per row):

- ``"stop"`` when the drawn token is one of the request's ``stop_token_ids`` or, unless
  ``ignore_eos``, one of the node's declared end ids (``NodeSamplers.stop_token_ids``), and
  at least ``min_tokens`` tokens were drawn before it; the step's outputs named by
  ``NodeSamplers.withhold_on_stop`` (default: all of them) are then not routed, so an
  end-of-sequence token never reaches the client;
- ``"length"`` when it is the request's ``max_tokens``-th token, or when the drawn token
  could not be fed back: the node's cache would pass its ``max_model_len``.

Either ends the row's partition (``STOP_ALL``). A plugin adds model-specific stops through
``NodeSubmodule.check_stop_batched`` on the same rows; ``merge`` combines the two answers.

What is deliberately elsewhere: the sampler never *draws* a stop id before ``min_tokens``
(``mstar.sampling.kernel.suppress_stop_tokens``: a draw constraint, not a stop); the
scheduler refuses an input that cannot fit the cache at all (a prompt longer than
``max_model_len``, or a stream-fed step on a node that draws nothing); stop *strings* are
matched on detokenized text by the server's text assembler.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mstar.model.spec import NodeSamplers
from mstar.model.submodule_base import STOP_ALL, StopCheck
from mstar.sampling.params import SamplingParams

_END = frozenset({STOP_ALL})


class StopRule:
    """One sampling node's stop rule over ``max_slots`` request slots."""

    def __init__(self, decl: NodeSamplers, max_slots: int, max_model_len: int | None) -> None:
        self.decl = decl
        self.max_model_len = max_model_len
        self._active = np.zeros(max_slots, dtype=bool)  # a slot whose request has main sampling
        self._max_tokens = np.zeros(max_slots, dtype=np.int64)
        self._min_tokens = np.zeros(max_slots, dtype=np.int64)
        self._generated = np.zeros(max_slots, dtype=np.int64)
        # Each slot's stop ids (its own, plus the node's end ids unless ignore_eos), padded
        # with -1 (never drawn); the width grows to the longest list.
        self._stop_ids = np.full((max_slots, max(1, len(decl.stop_token_ids))), -1, dtype=np.int64)

    def add(self, slot: int, params: SamplingParams | None, generated: int = 0) -> None:
        self._generated[slot] = generated
        if params is None:
            self._active[slot] = False
            return
        ids = list(dict.fromkeys(params.stop_token_ids))
        if not params.ignore_eos:
            ids += [t for t in self.decl.stop_token_ids if t not in ids]
        if len(ids) > self._stop_ids.shape[1]:
            wider = np.full((self._stop_ids.shape[0], len(ids)), -1, dtype=np.int64)
            wider[:, : self._stop_ids.shape[1]] = self._stop_ids
            self._stop_ids = wider
        self._stop_ids[slot] = -1
        self._stop_ids[slot, : len(ids)] = ids
        self._active[slot] = True
        self._max_tokens[slot] = params.max_tokens
        self._min_tokens[slot] = params.min_tokens

    def remove(self, slot: int) -> None:
        self._active[slot] = False

    def generated(self, slot: int) -> int:
        return int(self._generated[slot])

    def apply(
        self,
        slots: Sequence[int],
        tokens: np.ndarray,
        cache_lens: Sequence[int],
        step_outputs: Sequence[tuple[str, ...]],
    ) -> list[StopCheck | None]:
        """The stop of each completed row (None: it goes on), and one more token counted
        for each. ``tokens[i]`` is the main token row i drew (-1: none), ``cache_lens[i]``
        its cache length after the step, ``step_outputs[i]`` the outputs of its step."""
        idx = np.asarray(slots, dtype=np.int64)
        tokens = np.asarray(tokens, dtype=np.int64)
        generated = self._generated[idx]
        drew = self._active[idx] & (tokens >= 0)
        stop_id = (self._stop_ids[idx] == tokens[:, None]).any(axis=1) & (generated >= self._min_tokens[idx])
        length = generated + 1 >= self._max_tokens[idx]
        if self.max_model_len is not None:
            length |= np.asarray(cache_lens, dtype=np.int64) + 1 > self.max_model_len
        stop_id &= drew
        length &= drew & ~stop_id
        self._generated[idx] = generated + 1
        out: list[StopCheck | None] = [None] * len(idx)
        withhold = self.decl.withhold_on_stop
        for i in np.flatnonzero(stop_id).tolist():
            out[i] = StopCheck(_END, step_outputs[i] if withhold is None else withhold, "stop")
        for i in np.flatnonzero(length).tolist():
            out[i] = StopCheck(_END, (), "length")
        return out


def merge(core: StopCheck | None, plugin: StopCheck | None) -> StopCheck:
    """Core's rule and the plugin's own check: every stop and withheld output of both; core's
    reason wins (it is what the request's parameters said)."""
    if plugin is None:
        return core or StopCheck()
    if core is None:
        return plugin
    withheld = core.withheld + tuple(o for o in plugin.withheld if o not in core.withheld)
    return StopCheck(core.stops | plugin.stops, withheld, core.reason or plugin.reason)
