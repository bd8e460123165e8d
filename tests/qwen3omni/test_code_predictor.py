"""The code predictor loaded from a real-layout tiny checkpoint: per-group logits and greedy
residual codes equal transformers' Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration
driven as the Talker drives it (generate over [talker state, code-0 embedding]), with every
residual code drawn through the auxiliary sampler label."""

from __future__ import annotations

import pytest
import torch
from mstar_qwen3omni.code_predictor import AUX_LABEL
from speech_helpers import GreedyRecorder, load_talker_node, speech_model

TOL = 1e-4
ROWS = 3


@pytest.fixture(scope="module")
def models():
    ref, root = speech_model()
    return ref.talker, load_talker_node(root)


def _frame_inputs(node, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(ROWS, node.cfg.hidden_size, generator=gen)
    first = torch.randint(0, 32, (ROWS,), generator=gen)
    return hidden, node.lm.model.codec_embedding(first)


@torch.no_grad()
def test_group_logits_and_greedy_codes_equal_transformers(models):
    ref, node = models
    hidden, first_embed = _frame_inputs(node, seed=1)
    groups = node.cfg.num_code_groups - 1
    expected = ref.code_predictor.generate(
        inputs_embeds=torch.stack([hidden, first_embed], dim=1), max_new_tokens=groups, do_sample=False,
        output_logits=True, return_dict_in_generate=True,
    )
    sampler = GreedyRecorder()
    codes, embed_sum = node.lm.code_predictor(hidden, first_embed, sampler)
    assert [label for label, _ in sampler.calls] == [AUX_LABEL] * groups  # never the main sampler
    got = torch.stack([logits for _, logits in sampler.calls], dim=1)
    ref_logits = torch.stack(expected.logits, dim=1)
    err = (got - ref_logits).abs().max().item()
    print(f"max |code predictor logits - transformers| over {groups} groups = {err:.2e}")
    assert err < TOL
    assert torch.equal(codes, expected.sequences[:, -groups:])
    # The frame's next Talker input part: each residual code's own embedding table.
    tables = ref.code_predictor.get_input_embeddings()
    want = sum(tables[g](codes[:, g]) for g in range(groups))
    assert (embed_sum - want).abs().max().item() < 1e-6


@torch.no_grad()
def test_teacher_forced_logits_equal_the_sampled_loop(models):
    """One forward over the frame's codes gives the per-group logits the loop produced."""
    _, node = models
    hidden, first_embed = _frame_inputs(node, seed=2)
    sampler = GreedyRecorder()
    codes, _ = node.lm.code_predictor(hidden, first_embed, sampler)
    loop = torch.stack([logits for _, logits in sampler.calls], dim=1)
    forced = node.lm.code_predictor.teacher_forced_logits(hidden, first_embed, codes)
    assert (forced - loop).abs().max().item() < 1e-5
