"""KVHistory replays exactly what a KV node was fed, chunk by chunk."""

from __future__ import annotations

import torch
from mstar.engine.kv_history import KVHistory
from mstar.model.submodule_base import ARNodeInputs, CurrentForwardPassInfo

INFO = CurrentForwardPassInfo("r", "prefill", {})


def _split(walk, info, inputs, start, end):
    out = inputs.slice(start, end)
    out.tensor_inputs = {k: v[start:end] for k, v in inputs.tensor_inputs.items()}
    return out


def _replay_all(history: KVHistory, budget: int) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    pos, ids, positions, extras = 0, [], [], []
    while pos < history.length:
        chunk = history.replay_chunk(pos, budget, _split)
        assert 0 < chunk.input_seq_len <= budget
        ids.append(chunk.input_ids)
        positions.append(chunk.custom_pos_ids)
        if chunk.tensor_inputs:
            extras.append(chunk.tensor_inputs["feat"])
        pos += chunk.input_seq_len
    return torch.cat(ids), torch.cat(positions, dim=-1), extras


def test_replay_equals_what_was_fed_across_chunk_and_segment_boundaries():
    prompt = ARNodeInputs(input_ids=torch.arange(10), custom_pos_ids=torch.arange(10).repeat(3, 1), input_seq_len=10,
                          tensor_inputs={"feat": torch.arange(10.0)[:, None]})
    history = KVHistory()
    for start, end in [(0, 3), (3, 7), (7, 10)]:  # a chunked prefill
        history.record("prefill", INFO, prompt, start, end)
    for t in range(10, 15):  # decode steps: one new token each
        step = ARNodeInputs(input_ids=torch.tensor([100 + t]), custom_pos_ids=torch.full((3, 1), t), input_seq_len=1)
        history.record("decode", INFO, step, 0, 1)
    assert history.length == 15
    for budget in (1, 2, 4, 100):
        ids, positions, extras = _replay_all(history, budget)
        assert ids.tolist() == list(range(10)) + [110, 111, 112, 113, 114]
        assert positions[0].tolist() == list(range(15))
        assert torch.cat(extras).flatten().tolist() == list(range(10))

