"""The sampler of every device: each request's parameters, seed and step counter live in
per-slot buffers, and a batch is drawn by its slot ids with counter-based randomness
(``mstar.sampling.counter_rng``).

Off the CPU ``sample`` only gathers from fixed-address buffers by a slot-id tensor, runs
the shared kernel and updates counters in place: no host sync, no per-row Python and no
allocation that depends on values. A CUDA graph could therefore capture it once the
host-side hints (see ``SamplingTensors``) and the lazily allocated history buffers are
settled (``preallocate_history=True``); ``tests/core/sampling/test_sampling_cuda.py``
does, but the engine captures no graph today.
"""

from __future__ import annotations

import array
from collections.abc import Sequence

import torch
from torch import Tensor

from mstar.sampling.draw import whole_row_first
from mstar.sampling.host_plan import host_plan
from mstar.sampling.kernel import penalty_terms, sample_batch
from mstar.sampling.params import SamplingParams
from mstar.sampling.seeds import MAX_SEED
from mstar.sampling.tensors import SampleOutput, SamplingTensors, SeenTokens

TokenIds = Sequence[int] | Tensor


class SlotSampler:
    """Per-slot batch sampler: parameters are registered per slot, not passed per call,
    and every draw runs ``kernel.sample_batch`` over the batch's slots.

    The slot's step counter is both the index into its random stream and the number
    of tokens generated (for min_tokens). History for penalties ([max_slots, V]
    output counts and prompt mask) and min_tokens (stop mask) is allocated only
    once a request needs it, since V can be ~150k.
    """

    def __init__(
        self,
        max_slots: int,
        vocab_size: int,
        device: torch.device | str = "cpu",
        preallocate_history: bool = False,
    ) -> None:
        if max_slots < 1 or vocab_size < 1:
            raise ValueError("max_slots and vocab_size must be >= 1")
        self.max_slots = max_slots
        self.vocab_size = vocab_size
        self.device = torch.device(device)

        def buf(dtype: torch.dtype, fill: float | int = 0) -> Tensor:
            return torch.full((max_slots,), fill, dtype=dtype, device=self.device)

        self._temperature = buf(torch.float32, 1.0)
        self._top_k = buf(torch.int64, -1)
        self._top_p = buf(torch.float64, 1.0)
        self._min_p = buf(torch.float64)
        self._repetition_penalty = buf(torch.float32, 1.0)
        self._presence_penalty = buf(torch.float32)
        self._frequency_penalty = buf(torch.float32)
        self._seed = buf(torch.int64)
        self._step = buf(torch.int64)
        self._min_tokens = buf(torch.int64)
        self._logprobs = buf(torch.bool)
        self._top_logprobs = buf(torch.int64)

        self._counts: Tensor | None = None  # int32 [S, V]
        self._prompt_mask: Tensor | None = None  # bool [S, V]
        self._stop_mask: Tensor | None = None  # bool [S, V]
        if preallocate_history:
            self._ensure_penalty_buffers()
            self._ensure_stop_buffer()

        # Host mirror of registered params: answers "does anyone need X" without a sync.
        self._active: dict[int, SamplingParams] = {}
        # On the CPU (host reads are free) the prompt and output tokens of each slot with
        # penalties, so a step penalises just those instead of scanning [B, V] history.
        self._seen: dict[int, set[int]] | None = {} if self.device.type == "cpu" else None
        self._needs_sort = False
        self._max_top_logprobs = 0
        self._any_sampled = False
        self._any_logprobs = False
        # The last stage()'s slot ids and their gathered parameters: a model that draws
        # several times a step for one batch (a code predictor's depth loop) gathers them
        # once; only the step counters are gathered again. Cleared when a slot changes.
        self._staged: tuple[Tensor, SamplingTensors] | None = None

    # ---- registration (host side, once per request) ----

    def add_request(
        self,
        slot: int,
        params: SamplingParams,
        seed: int,
        prompt_ids: TokenIds = (),
        stop_ids: TokenIds = (),
    ) -> None:
        """Register a request in ``slot`` and reset its step counter and history.

        ``stop_ids`` are suppressed (with ``params.stop_token_ids``) until
        ``params.min_tokens`` tokens were drawn; pass EOS ids here unless the
        request ignores EOS (``SamplingParams.min_tokens_stop_ids`` does this).
        """
        self._check_slot(slot)
        if slot in self._active:
            raise ValueError(f"slot {slot} is already in use; remove_request it first")
        if not 0 <= seed <= MAX_SEED:
            raise ValueError(f"seed must be in [0, {MAX_SEED}], got {seed}")
        # Validate everything before touching any buffer.
        prompt = self._ids_tensor(prompt_ids)
        stop = torch.cat([self._ids_tensor(stop_ids), self._ids_tensor(params.stop_token_ids)])

        self._temperature[slot] = params.temperature
        self._top_k[slot] = params.top_k
        self._top_p[slot] = params.top_p
        self._min_p[slot] = params.min_p
        self._repetition_penalty[slot] = params.repetition_penalty
        self._presence_penalty[slot] = params.presence_penalty
        self._frequency_penalty[slot] = params.frequency_penalty
        self._seed[slot] = seed
        self._step[slot] = 0
        self._min_tokens[slot] = params.min_tokens
        self._logprobs[slot] = params.logprobs
        self._top_logprobs[slot] = params.top_logprobs

        if params.uses_penalties:
            self._ensure_penalty_buffers()
        if self._counts is not None and self._prompt_mask is not None:
            # The slot may hold a previous request's history.
            self._counts[slot].zero_()
            self._prompt_mask[slot].zero_()
            if params.uses_penalties:
                self._prompt_mask[slot, prompt] = True

        if params.min_tokens > 0 and stop.numel() > 0:
            self._ensure_stop_buffer()
        if self._stop_mask is not None:
            self._stop_mask[slot].zero_()
            self._stop_mask[slot, stop] = True
        if self._seen is not None and params.uses_penalties:
            self._seen[slot] = set(prompt.tolist())

        self._active[slot] = params
        self._refresh_hints()

    def remove_request(self, slot: int) -> None:
        """Free ``slot``; its buffers are reset when the slot is reused."""
        self._check_slot(slot)
        if self._active.pop(slot, None) is None:
            raise KeyError(f"slot {slot} has no request")
        if self._seen is not None:
            self._seen.pop(slot, None)
        self._refresh_hints()

    @property
    def active_slots(self) -> frozenset[int]:
        return frozenset(self._active)

    @property
    def step_counters(self) -> Tensor:
        """int64 [max_slots]: draws taken so far per slot (read-only view for callers)."""
        return self._step.clone()

    @property
    def output_counts(self) -> Tensor | None:
        """int32 [max_slots, V] output token counts, None until penalties were needed."""
        return None if self._counts is None else self._counts.clone()

    # ---- per step (device side, no host sync) ----

    def stage(self, slot_ids: Tensor) -> SamplingTensors:
        """Gather the batch rows' parameters from the slot buffers (only their step
        counters, when the same ``slot_ids`` object was staged last and no slot changed)."""
        def g(buf: Tensor) -> Tensor:
            return buf.index_select(0, slot_ids)

        step = g(self._step)
        if self._staged is not None and self._staged[0] is slot_ids:
            return self._staged[1].with_step(step)
        staged = SamplingTensors(
            temperature=g(self._temperature),
            top_k=g(self._top_k),
            top_p=g(self._top_p),
            min_p=g(self._min_p),
            repetition_penalty=g(self._repetition_penalty),
            presence_penalty=g(self._presence_penalty),
            frequency_penalty=g(self._frequency_penalty),
            seed=g(self._seed),
            step=step,
            min_tokens=g(self._min_tokens),
            num_generated=step,
            logprobs=g(self._logprobs),
            top_logprobs=g(self._top_logprobs),
            needs_sort=self._needs_sort,
            max_top_logprobs=self._max_top_logprobs,
            any_sampled=self._any_sampled,
            any_logprobs=self._any_logprobs,
        )
        self._staged = (slot_ids, staged)
        return staged

    def sample(
        self, logits: Tensor, slot_ids: Tensor, advance: Tensor | None = None
    ) -> SampleOutput:
        """Draw one token per row; row i uses slot ``slot_ids[i]``.

        Rows with ``advance`` True (default: all) then move to their next step
        and have the token counted in their history. ``slot_ids`` must name
        registered, distinct slots; that is not checked, as it would need a sync. A
        ``slot_ids`` tensor must not be changed in place between calls: the rows'
        parameters are gathered once per ``slot_ids`` object (see ``stage``).
        """
        if logits.dim() != 2 or logits.shape[1] != self.vocab_size:
            raise ValueError(
                f"logits must be [B, {self.vocab_size}], got {tuple(logits.shape)}"
            )
        slot_ids = slot_ids.to(device=self.device, dtype=torch.int64)
        st = self.stage(slot_ids)
        counts = prompt = stop = seen = None
        if self._counts is not None and self._prompt_mask is not None:
            if self._seen is not None:
                seen = self._seen_tokens(slot_ids)
            else:
                counts = self._counts.index_select(0, slot_ids)
                prompt = self._prompt_mask.index_select(0, slot_ids)
        if self._stop_mask is not None:
            stop = self._stop_mask.index_select(0, slot_ids)
        out = sample_batch(logits, st, counts, prompt, stop, seen)
        self.commit(slot_ids, out.tokens, advance)
        return out

    def native_top_k_rows(self, slot_ids: Tensor, advance: Tensor | None = None) -> tuple | None:
        """What ``mstar_native::draw_aux`` needs to draw this batch itself
        (``mstar.sampling.native_draw``): a tuple where every row samples with top_k alone
        over a vocabulary small enough that ``draw_cpu`` takes its one-``topk`` path and the
        label keeps no penalty or stop history (a draw would have to count into it), else
        None. The op advances this sampler's step counters in place, as ``commit`` does."""
        if self._counts is not None or self._stop_mask is not None:
            return None
        return self._top_k_rows(slot_ids, advance)

    def native_main_rows(self, slot_ids: Tensor, advance: Tensor | None = None) -> tuple | None:
        """What ``mstar_native::draw_main`` needs to draw this batch's next tokens itself:
        ``native_top_k_rows``'s rows, the vocabulary, this step's penalised (row, token)
        pairs with their penalty terms (``kernel.penalty_terms``), the stop-id mask of rows
        still under min_tokens, and the output counts to count into (each None where not
        needed), else None. The op counts its tokens and advances the step counters as
        ``commit`` does; call ``note_drawn`` with its tokens afterwards (the seen sets)."""
        rows = self._top_k_rows(slot_ids, advance)
        if rows is None:
            return None
        slot_ids = rows[1]
        st = self.stage(slot_ids)
        seen_rows = seen_cols = repetition = subtract = None
        if self._counts is not None and self._prompt_mask is not None:
            if self._seen is None:
                return None
            seen = self._seen_tokens(slot_ids)
            seen_rows, seen_cols = seen.rows, seen.cols
            repetition, subtract = penalty_terms(st, seen)
        suppress = None
        if self._stop_mask is not None:
            active = st.num_generated < st.min_tokens
            if bool(active.any()):  # else suppress_stop_tokens masks nothing
                suppress = self._stop_mask.index_select(0, slot_ids) & active.unsqueeze(1)
        return (rows, self.vocab_size, seen_rows, seen_cols, repetition, subtract, suppress, self._counts)

    def _top_k_rows(self, slot_ids: Tensor, advance: Tensor | None) -> tuple | None:
        if self.device.type != "cpu":
            return None
        slot_ids = slot_ids.to(dtype=torch.int64).contiguous()
        st = self.stage(slot_ids)
        plan = host_plan(st.temperature, st.top_k, st.top_p, st.min_p, st.seed, st.host, self.vocab_size,
                         whole_row_first)
        group = plan.top_k_only
        if group is None or group.sel is not None:  # no such rows, or not all of them
            return None
        adv = torch.ones_like(slot_ids) if advance is None else advance.to(torch.int64).contiguous()
        return (self._step, slot_ids, adv, plan.keys, st.temperature.unsqueeze(1), group.divide,
                st.top_k.unsqueeze(1), group.same_k or 0, group.max_k)

    def commit(self, slot_ids: Tensor, tokens: Tensor, advance: Tensor | None = None) -> None:
        """Advance step counters and count ``tokens`` for rows with ``advance`` True."""
        if advance is None:
            adv = torch.ones_like(slot_ids)
        else:
            adv = advance.to(device=self.device, dtype=torch.int64)
        self._step.index_add_(0, slot_ids, adv)
        if self._counts is not None:
            self._counts.index_put_(
                (slot_ids, tokens), adv.to(torch.int32), accumulate=True
            )
        self.note_drawn(slot_ids, tokens, adv)

    def note_drawn(self, slot_ids: Tensor, tokens: Tensor, advance: Tensor | None = None) -> None:
        """Add drawn ``tokens`` to the host-side seen sets of penalised rows that advanced
        (``commit`` does; after ``mstar_native::draw_main``, which counted them, the caller)."""
        if not self._seen:
            return
        adv = [1] * len(tokens) if advance is None else advance.tolist()
        for slot, tok, a in zip(slot_ids.tolist(), tokens.tolist(), adv, strict=True):
            if a and slot in self._seen:
                self._seen[slot].add(tok)

    def snapshot(self, slot_ids: Tensor) -> tuple[Tensor, Tensor | None, dict[int, set[int]]]:
        """The rows' step counters and output history, to undo a step that failed."""
        counts = None if self._counts is None else self._counts.index_select(0, slot_ids)
        seen = {}
        if self._seen:
            seen = {s: set(self._seen[s]) for s in slot_ids.tolist() if s in self._seen}
        return self._step.index_select(0, slot_ids), counts, seen

    def restore(self, slot_ids: Tensor, snap: tuple[Tensor, Tensor | None, dict[int, set[int]]]) -> None:
        steps, counts, seen = snap
        self._step.index_copy_(0, slot_ids, steps)
        if counts is not None and self._counts is not None:
            self._counts.index_copy_(0, slot_ids, counts)
        if self._seen is not None:
            self._seen.update(seen)

    # ---- internals ----

    def _seen_tokens(self, slot_ids: Tensor) -> SeenTokens:
        """The batch's penalised (row, token) pairs, from the host sets."""
        assert self._seen is not None and self._counts is not None
        rows: list[int] = []
        cols: list[int] = []
        for row, slot in enumerate(slot_ids.tolist()):
            ids = self._seen.get(slot, ())
            rows.extend([row] * len(ids))
            cols.extend(ids)
        r, c = _int64(rows), _int64(cols)
        return SeenTokens(r, c, self._counts[slot_ids[r], c])

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.max_slots:
            raise IndexError(f"slot {slot} out of range [0, {self.max_slots})")

    def _ids_tensor(self, ids: TokenIds) -> Tensor:
        t = torch.as_tensor(ids, dtype=torch.int64).reshape(-1)
        if t.device.type == "cpu" and t.numel() > 0:
            # Only host tensors are checked: checking device ones would sync.
            lo, hi = int(t.min()), int(t.max())
            if lo < 0 or hi >= self.vocab_size:
                raise ValueError(f"token ids must be in [0, {self.vocab_size})")
        return t.to(self.device)

    def _ensure_penalty_buffers(self) -> None:
        if self._counts is None:
            shape = (self.max_slots, self.vocab_size)
            self._counts = torch.zeros(shape, dtype=torch.int32, device=self.device)
            self._prompt_mask = torch.zeros(shape, dtype=torch.bool, device=self.device)

    def _ensure_stop_buffer(self) -> None:
        if self._stop_mask is None:
            shape = (self.max_slots, self.vocab_size)
            self._stop_mask = torch.zeros(shape, dtype=torch.bool, device=self.device)

    def _refresh_hints(self) -> None:
        self._staged = None
        params = self._active.values()
        self._needs_sort = any(p.uses_top_k_or_p for p in params)
        self._max_top_logprobs = max((p.top_logprobs for p in params), default=0)
        self._any_sampled = any(not p.is_greedy for p in params)
        self._any_logprobs = any(p.logprobs for p in params)


def _int64(values: list[int]) -> Tensor:
    """int64 [N] of ``values``, through an int64 array: ~3x faster than ``torch.tensor`` on a
    list of a few hundred ints (``frombuffer`` refuses an empty buffer)."""
    return torch.frombuffer(array.array("q", values), dtype=torch.int64) if values else torch.empty(0, dtype=torch.int64)
