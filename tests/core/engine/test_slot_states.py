"""Per-request state as a batch-level view (``NodeSubmodule.slot_states``): one tensor per
name for the whole engine, each request its own row from admission to its end, zeroed for
the next holder of a slot; the node reads and writes rows with the step's slot index.

A tiny stateless node loops ``STEPS`` times per request, adding the request's ``value`` to
its running sum in slot state and emitting the sum: each request must see 1·v, 2·v, ... ,
whatever joins the batch beside it and whichever slot it reuses."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from mstar.engine.core import EngineCore
from mstar.engine.executors import LoadedNode
from mstar.engine.request import Request
from mstar.engine.scheduler import SchedulerConfig
from mstar.graph import EngineKind, GraphSpec, LinearWalks, Loop, NodeSpec, Signal, Step, Walk
from mstar.model.submodule_base import BatchedModelOutput, NodeInputs, NodeSubmodule, SlotState

STEPS = 4


class Accumulator(NodeSubmodule):
    def __init__(self) -> None:
        super().__init__()
        self.views: list[torch.Tensor] = []

    def slot_states(self) -> Mapping[str, SlotState]:
        return {"sum": SlotState((2,))}

    def prepare_inputs(self, graph_walk, info, signals: Mapping[str, torch.Tensor]) -> NodeInputs:
        return NodeInputs(tensor_inputs={"value": signals["value"].reshape(1).float()})

    def forward_batched(self, graph_walk, engine_inputs, inputs) -> BatchedModelOutput:
        state, index = engine_inputs.slot_states["sum"], engine_inputs.slot_index
        self.views.append(state)
        values = torch.cat([i.tensor_inputs["value"] for i in inputs])
        sums = state.index_select(0, index) + torch.stack([values, -values], dim=1)
        state.index_copy_(0, index, sums)
        return BatchedModelOutput(row_outputs={"sum": sums})


def make_core() -> tuple[EngineCore, Accumulator]:
    graph = GraphSpec(
        nodes={"acc": NodeSpec("acc", EngineKind.STATELESS)},
        walks={"run": Walk("run", "main", Loop("l", Step("acc", ("value",), ("sum",)), max_iters=STEPS))},
        signals={"sum": Signal("sum", to_client=True)},
        state_machine=LinearWalks({"main": ("run",)}),
        request_inputs=("value",),
    )
    graph.validate()
    acc = Accumulator()
    core = EngineCore(graph, {"acc": LoadedNode("acc", EngineKind.STATELESS, acc, torch.device("cpu"))},
                      SchedulerConfig(max_num_seqs=3))
    return core, acc


def test_each_request_keeps_its_own_row_across_joins_and_slot_reuse() -> None:
    core, acc = make_core()
    sums: dict[str, list[list[float]]] = {}
    arrivals = {0: [1.0, 2.0], 1: [3.0], 2: [4.0, 5.0], 6: [6.0]}  # step -> values (3 slots: some wait)
    for step in range(40):
        for v in arrivals.get(step, []):
            core.add_request(Request(id=f"r{v:g}", inputs={"value": torch.tensor(v)}, kwargs={}, sampling={}, arrival=step))
        for out in core.step():
            if out.signal == "sum":
                sums.setdefault(out.request_id, []).append(out.data.reshape(-1).tolist())
    assert set(sums) == {f"r{v:g}" for vs in arrivals.values() for v in vs}
    for rid, seen in sums.items():
        v = float(rid[1:])
        assert seen == [[k * v, -k * v] for k in range(1, STEPS + 1)], rid  # fresh row, its own sums
    assert all(view is core.nodes["acc"].slot_states["sum"] for view in acc.views)  # one tensor, never re-stacked
    assert core.nodes["acc"].slot_states["sum"].shape == (3, 2)
