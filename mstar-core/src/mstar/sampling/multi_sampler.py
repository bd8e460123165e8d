"""One ``SlotSampler`` per declared label, and the per-batch handle models use."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from mstar.sampling.multi import (
    MAIN_LABEL,
    MultiSamplingConfig,
    UnknownSamplerLabelError,
    reject_default_seeds,
)
from mstar.sampling.params import SamplingParams
from mstar.sampling.slot_sampler import SlotSampler, TokenIds
from mstar.sampling.tensors import SampleOutput

PerLabelIds = TokenIds | Mapping[str, TokenIds]


class MultiSampler:
    """Holds a ``SlotSampler`` for ``MAIN_LABEL`` and each declared aux label.

    ``labels_defaults`` declares the label set (it must include ``MAIN_LABEL``) and the
    plugin's default params per label; aux vocabularies may differ from main's.
    """

    def __init__(
        self,
        labels_defaults: Mapping[str, SamplingParams],
        vocab_sizes: Mapping[str, int],
        max_slots: int,
        device: torch.device | str = "cpu",
        preallocate_history: bool = False,
    ) -> None:
        if MAIN_LABEL not in labels_defaults:
            raise ValueError(f"labels_defaults must include the main label {MAIN_LABEL!r}")
        if set(vocab_sizes) != set(labels_defaults):
            raise ValueError(
                f"vocab_sizes labels {sorted(vocab_sizes)} != declared {sorted(labels_defaults)}"
            )
        reject_default_seeds(labels_defaults)
        self.defaults = dict(labels_defaults)
        self.aux_labels = frozenset(labels_defaults) - {MAIN_LABEL}
        self.samplers = {
            label: SlotSampler(max_slots, vocab_sizes[label], device, preallocate_history)
            for label in labels_defaults
        }

    @property
    def labels(self) -> frozenset[str]:
        return frozenset(self.samplers)

    def add_request(
        self,
        slot: int,
        config: MultiSamplingConfig,
        prompt_ids: PerLabelIds = (),
        eos_ids: PerLabelIds = (),
    ) -> None:
        """Register ``config`` in ``slot`` for every declared label, as it is: a config
        resolved by ``mstar.sampling.resolve`` (defaults merged, every label present, every
        seed set); this class merges nothing. ``prompt_ids``/``eos_ids`` apply to main, or
        are given per label as a mapping (aux vocabularies differ).
        """
        config.validate_labels(self.aux_labels)
        missing = sorted(self.aux_labels - set(config.aux))
        if missing or config.main.seed is None or any(p.seed is None for p in config.aux.values()):
            raise ValueError(
                f"sampling config is not resolved (aux labels missing: {missing}, or seeds unset); "
                "build it with mstar.sampling.resolve.resolve_node"
            )
        added: list[str] = []
        try:
            for label, sampler in self.samplers.items():
                params = config.main if label == MAIN_LABEL else config.aux[label]
                stop_ids = params.min_tokens_stop_ids(_for_label(eos_ids, label))
                sampler.add_request(
                    slot, params, params.seed, _for_label(prompt_ids, label), stop_ids
                )
                added.append(label)
        except Exception:
            # Leave no half-registered request behind.
            for label in added:
                self.samplers[label].remove_request(slot)
            raise

    def remove_request(self, slot: int) -> None:
        for sampler in self.samplers.values():
            sampler.remove_request(slot)

    def sample(
        self, logits: Tensor, slot_ids: Tensor, advance: Tensor | None = None
    ) -> SampleOutput:
        return self.samplers[MAIN_LABEL].sample(logits, slot_ids, advance)

    def sample_aux(
        self, label: str, logits: Tensor, slot_ids: Tensor, advance: Tensor | None = None
    ) -> SampleOutput:
        if label not in self.aux_labels:
            raise UnknownSamplerLabelError([label], self.aux_labels)
        return self.samplers[label].sample(logits, slot_ids, advance)

    def snapshot(self, slot_ids: Tensor) -> dict[str, Any]:
        """Every label's per-row sampling state, so a failed step can be undone."""
        return {label: s.snapshot(slot_ids) for label, s in self.samplers.items()}

    def restore(self, slot_ids: Tensor, snap: dict[str, Any]) -> None:
        for label, s in self.samplers.items():
            s.restore(slot_ids, snap[label])

    def bind(self, slot_ids: Tensor, advance: Tensor | None = None) -> BatchSampler:
        """The batch's sampler handle, to pass into model forwards."""
        return BatchSampler(self, slot_ids, advance)


def _for_label(ids: PerLabelIds, label: str) -> TokenIds:
    if isinstance(ids, Mapping):
        return ids.get(label, ())
    # Plain ids belong to the main vocabulary only.
    return ids if label == MAIN_LABEL else ()


@dataclass(eq=False)
class BatchSampler:
    """A ``MultiSampler`` bound to one batch's slot ids and advance mask.

    ``last_main_tokens`` (int64 [B], None until the first ``sample``) holds the
    main-label tokens drawn by the latest ``sample`` call of this step, so the
    engine can apply stop rules without the model returning them. A handle from
    ``subset`` writes its draws into its parent's rows too; rows no handle drew for
    hold -1.
    """

    sampler: MultiSampler
    slot_ids: Tensor
    advance: Tensor | None = None
    keep_logits: bool = False  # set when a row of the batch asked for its logits
    last_main_tokens: Tensor | None = field(default=None, init=False)
    # The main logits of the latest ``sample`` (only with ``keep_logits``): what the engine
    # returns to requests with kwarg ``return_logits``.
    last_main_logits: Tensor | None = field(default=None, init=False)
    _parent: BatchSampler | None = field(default=None, init=False, repr=False)
    _rows: Tensor | None = field(default=None, init=False, repr=False)

    @property
    def labels(self) -> frozenset[str]:
        return self.sampler.labels

    @property
    def aux_labels(self) -> frozenset[str]:
        return self.sampler.aux_labels

    def sample(self, logits: Tensor) -> SampleOutput:
        out = self.sampler.sample(logits, self.slot_ids, self.advance)
        self._record(out.tokens)
        if self.keep_logits and self._parent is None:
            self.last_main_logits = logits
        return out

    def sample_aux(self, label: str, logits: Tensor) -> SampleOutput:
        return self.sampler.sample_aux(label, logits, self.slot_ids, self.advance)

    def native_top_k_rows(self, label: str) -> tuple | None:
        """``SlotSampler.native_top_k_rows`` of aux ``label`` for this batch (None
        for another label): for ``mstar.sampling.native_draw``."""
        if label not in self.sampler.aux_labels:
            return None
        return self.sampler.samplers[label].native_top_k_rows(self.slot_ids, self.advance)

    def native_main_rows(self) -> tuple | None:
        """``SlotSampler.native_main_rows`` of the main label for this batch (None
        when the engine keeps the batch's logits): for ``mstar.sampling.native_draw``."""
        if self.keep_logits:
            return None
        return self.sampler.samplers[MAIN_LABEL].native_main_rows(self.slot_ids, self.advance)

    def native_main_drawn(self, tokens: Tensor) -> None:
        """After ``mstar_native::draw_main`` drew ``tokens`` from ``native_main_rows``: what
        ``sample`` does besides drawing (the seen sets, ``last_main_tokens``)."""
        self.sampler.samplers[MAIN_LABEL].note_drawn(self.slot_ids, tokens, self.advance)
        self._record(tokens)

    def subset(self, rows: Tensor) -> BatchSampler:
        """Handle for a subset of the batch (index or bool tensor over its rows).

        Prefer an index tensor inside captured regions: bool-mask indexing syncs.
        """
        advance = None if self.advance is None else self.advance[rows]
        sub = BatchSampler(self.sampler, self.slot_ids[rows], advance)
        sub._parent, sub._rows = self, rows
        return sub

    def _record(self, tokens: Tensor) -> None:
        self.last_main_tokens = tokens
        parent, rows = self._parent, self._rows
        if parent is None or rows is None:
            return
        if parent.last_main_tokens is None:
            parent.last_main_tokens = torch.full(
                parent.slot_ids.shape, -1, dtype=torch.int64, device=tokens.device
            )
        else:
            # Never write into a tensor handed out as a sample() result.
            parent.last_main_tokens = parent.last_main_tokens.clone()
        parent.last_main_tokens[rows] = tokens
        parent._record(parent.last_main_tokens)
