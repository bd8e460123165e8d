"""The stop rule: when a sampling node's row stops, decided once per step for the whole batch.

After a forward that drew main tokens, ``StopRule.apply`` looks at every row whose step
completed, in one call, over per-slot state kept for the request's whole life (resolved once
when the request starts: its stop ids as one set, its limits), so a row costs a set lookup
and two comparisons. Plain Python lists, not numpy: for the 1-64 rows of a step, after a
forward has evicted the caches, two dozen small numpy calls took 52 us a step at one row
(measured in the engine on the 2-core AMD EPYC), where the loop takes a few:

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

from mstar.model.spec import NodeSamplers
from mstar.model.submodule_base import STOP_ALL, StopCheck
from mstar.sampling.params import SamplingParams

_END = frozenset({STOP_ALL})


class StopRule:
    """One sampling node's stop rule over ``max_slots`` request slots."""

    def __init__(self, decl: NodeSamplers, max_slots: int, max_model_len: int | None) -> None:
        self.decl = decl
        self.max_model_len = max_model_len
        # Per slot: its stop ids (its own, plus the node's end ids unless ignore_eos), None
        # for a slot whose request has no main sampling; its limits; tokens drawn so far.
        self._stop_ids: list[frozenset[int] | None] = [None] * max_slots
        self._max_tokens = [0] * max_slots
        self._min_tokens = [0] * max_slots
        self._generated = [0] * max_slots

    def add(self, slot: int, params: SamplingParams | None, generated: int = 0) -> None:
        self._generated[slot] = generated
        if params is None:
            self._stop_ids[slot] = None
            return
        ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            ids.update(self.decl.stop_token_ids)
        self._stop_ids[slot] = frozenset(ids)
        self._max_tokens[slot] = params.max_tokens
        self._min_tokens[slot] = params.min_tokens

    def remove(self, slot: int) -> None:
        self._stop_ids[slot] = None

    def generated(self, slot: int) -> int:
        return self._generated[slot]

    def apply(
        self,
        slots: Sequence[int],
        tokens: Sequence[int],
        cache_lens: Sequence[int],
        step_outputs: Sequence[tuple[str, ...]],
    ) -> list[StopCheck | None]:
        """The stop of each completed row (None: it goes on), and one more token counted
        for each. ``tokens[i]`` is the main token row i drew (-1: none), ``cache_lens[i]``
        its cache length after the step, ``step_outputs[i]`` the outputs of its step."""
        out: list[StopCheck | None] = [None] * len(slots)
        withhold = self.decl.withhold_on_stop
        max_len = self.max_model_len
        generated = self._generated
        for i, (slot, token, cache_len) in enumerate(zip(slots, tokens, cache_lens, strict=True)):
            drawn = generated[slot]
            generated[slot] = drawn + 1
            stop_ids = self._stop_ids[slot]
            if stop_ids is None or token < 0:
                continue
            if token in stop_ids and drawn >= self._min_tokens[slot]:
                out[i] = StopCheck(_END, step_outputs[i] if withhold is None else withhold, "stop")
            elif drawn + 1 >= self._max_tokens[slot] or (max_len is not None and cache_len + 1 > max_len):
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
