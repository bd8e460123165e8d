"""The code predictor loaded from a real-layout tiny checkpoint: per-group logits and greedy
residual codes equal transformers' Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration
driven as the Talker drives it (generate over [talker state, code-0 embedding]), with every
residual code drawn through the auxiliary sampler label."""

from __future__ import annotations

import pytest
import torch
from mstar.model.spec import NodeSamplers
from mstar.sampling import MAIN_LABEL, MultiSampler, SamplingParams
from mstar.sampling.resolve import resolve_node
from mstar_qwen3omni.code_predictor import AUX_LABEL, AUX_SAMPLING_DEFAULTS
from mstar_qwen3omni.talker import SAMPLING_DEFAULTS
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


def _sampler(node, given: list[dict]) -> tuple[MultiSampler, torch.Tensor]:
    """Core's MultiSampler with the Talker's labels, one slot per request config."""
    main = SamplingParams(**{k: v for k, v in SAMPLING_DEFAULTS.items() if k != "max_tokens"})
    decl = NodeSamplers(
        vocab_size=node.cfg.vocab_size, main=main, aux={AUX_LABEL: SamplingParams(**AUX_SAMPLING_DEFAULTS)},
        aux_vocab_sizes={AUX_LABEL: node.cfg.predictor.vocab_size},
    )
    sampler = MultiSampler(
        {MAIN_LABEL: decl.main, **decl.aux}, {MAIN_LABEL: decl.vocab_size, **decl.aux_vocab_sizes}, max_slots=len(given)
    )
    for slot, g in enumerate(given):
        sampler.add_request(slot, resolve_node(decl, g)[0])
    return sampler, torch.arange(len(given))


@torch.no_grad()
def test_frames_through_core_samplers_follow_each_label(models):
    """Code 0 through the main label, residual codes through ``code_predictor``: a request
    greedy on one label and sampled on the other gets exactly that, and a seeded request's
    frame does not depend on the batch it is drawn in."""
    _, node = models
    gen = torch.Generator().manual_seed(7)
    hidden = torch.randn(2, node.cfg.hidden_size, generator=gen)
    region = {"hidden": hidden, "logits": node.lm.codec_logits(hidden)}
    greedy_main = {"main": {"temperature": 0}, "aux": {AUX_LABEL: {"temperature": 1.0, "seed": 3}}}
    greedy_aux = {"main": {"temperature": 1.0, "seed": 5}, "aux": {AUX_LABEL: {"temperature": 0}}}
    sampler, slots = _sampler(node, [greedy_main, greedy_aux])
    frames = node.lm.sample_frame(region, sampler.bind(slots))["codes"]
    assert int(frames[0, 0]) == int(region["logits"][0].argmax())
    first_embed = node.lm.model.codec_embedding(frames[1, :1])
    forced = node.lm.code_predictor.teacher_forced_logits(hidden[1:], first_embed, frames[1:, 1:])
    assert torch.equal(frames[1, 1:], forced[0].argmax(-1))
    # The seeded greedy-aux request alone gives the same frame.
    alone, slot = _sampler(node, [greedy_aux])
    single = {"hidden": hidden[1:], "logits": region["logits"][1:]}
    assert torch.equal(node.lm.sample_frame(single, alone.bind(slot))["codes"][0], frames[1])
