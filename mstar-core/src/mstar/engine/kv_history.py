"""What a request fed into one KV node, in order, so a preempted request can recompute its
cache exactly: position by position, however many chunks that takes, and again from the
start if it is preempted during the recompute.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from mstar.model.submodule_base import ARNodeInputs, CurrentForwardPassInfo

# (walk, info, full step inputs, start, end) -> the inputs of positions [start, end)
Splitter = Callable[[str, CurrentForwardPassInfo, ARNodeInputs, int, int], ARNodeInputs]


@dataclass
class _Segment:
    walk: str
    info: CurrentForwardPassInfo
    inputs: ARNodeInputs  # the step's full inputs, as prepared
    start: int
    end: int
    # Prefix caching: the identity of each position of ``inputs`` (None: it has none), so a
    # recomputed cache enters the prefix index again (``KVCacheManager.note_fed``).
    keys: Sequence[Hashable] | None = None

    @property
    def plain(self) -> bool:
        """Ids / embeddings / positions only: slices of such segments concatenate."""
        return not self.inputs.tensor_inputs

    def fields(self) -> tuple[bool, bool, bool]:
        i = self.inputs
        return i.input_ids is None, i.input_embeds is None, i.custom_pos_ids is None


class KVHistory:
    def __init__(self) -> None:
        self._segments: list[_Segment] = []
        self.length = 0  # positions fed so far
        self._runs: list[_Segment] | None = None  # recompute plan, built on first use

    def record(
        self, walk: str, info: CurrentForwardPassInfo, inputs: ARNodeInputs, start: int, end: int,
        keys: Sequence[Hashable] | None = None,
    ) -> None:
        """Positions [start, end) of ``inputs`` were fed; ``keys``: the identities of all of
        ``inputs``' positions for prefix caching (None: none)."""
        last = self._segments[-1] if self._segments else None
        if last is not None and last.inputs is inputs and last.end == start and last.keys is keys:
            last.end = end  # the next chunk of the same step
        else:
            self._segments.append(_Segment(walk, info, inputs, start, end, keys))
        self.length += end - start
        self._runs = None

    def replay_chunk(self, position: int, budget: int, split: Splitter) -> ARNodeInputs:
        """The inputs that recompute positions [position, position + n), n <= budget; a chunk
        never crosses from one run of the plan into the next."""
        offset = 0
        for run in self._plan():
            size = run.end - run.start
            if position < offset + size:
                lo = run.start + position - offset
                hi = min(run.end, lo + budget)
                if run.plain:
                    return run.inputs.slice(lo, hi)
                return split(run.walk, run.info, run.inputs, lo, hi)
            offset += size
        raise ValueError(f"position {position} is past the recorded history of {self.length}")

    def identities(self, position: int, n: int) -> list[Hashable] | None:
        """The prefix-caching identities of positions [position, position + n) of the
        history; None when any of them has none."""
        out: list[Hashable] = []
        offset = 0
        for seg in self._segments:
            if offset >= position + n:
                break
            size = seg.end - seg.start
            lo, hi = max(position, offset), min(position + n, offset + size)
            if lo < hi:
                if seg.keys is None:
                    return None
                out.extend(seg.keys[seg.start + lo - offset : seg.start + hi - offset])
            offset += size
        return out if len(out) == n else None

    def _plan(self) -> list[_Segment]:
        """Consecutive plain segments merged into one, so that recomputing a long decode
        takes a few chunks rather than one step per generated token."""
        if self._runs is not None:
            return self._runs
        runs: list[_Segment] = []
        pending: list[_Segment] = []

        def flush() -> None:
            if not pending:
                return
            if len(pending) == 1:
                runs.append(pending[0])
            else:
                merged = ARNodeInputs.concat([s.inputs.slice(s.start, s.end) for s in pending])
                runs.append(_Segment(pending[-1].walk, pending[-1].info, merged, 0, merged.input_seq_len))
            pending.clear()

        for seg in self._segments:
            if seg.plain and (not pending or pending[-1].fields() == seg.fields()):
                pending.append(seg)
            elif seg.plain:
                flush()
                pending.append(seg)
            else:
                flush()
                runs.append(seg)
        flush()
        self._runs = runs
        return runs
