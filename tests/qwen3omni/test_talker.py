"""The Talker loaded from a real-layout tiny checkpoint (``talker.*``, experts one module per
expert) against transformers' Qwen3OmniMoeTalkerForConditionalGeneration on the same inputs:
prefill logits with text and with 3-D M-RoPE positions, and a ragged batch of two requests
generated greedily through the node contract on the paged KV cache: every step's code-0 logits
within 1e-4 and every frame's codes (code 0 + code predictor) identical to transformers'
``talker.generate`` fed the same prompt, trailing text and ``tts_pad`` embeddings."""

from __future__ import annotations

import pytest
import torch
from mstar_qwen3omni.dense_attention import DenseKVCache
from mstar_qwen3omni.talker import CODES, FRAME_EMBED, POSITIONS, PROMPT_EMBEDS, TEXT_EMBED
from speech_helpers import GreedyRecorder, PagedSteps, load_talker_node, speech_model

TOL = 1e-4
STEPS = 6


@pytest.fixture(scope="module")
def models():
    ref, root = speech_model()
    return ref.talker, load_talker_node(root)


def _embeds(n: int, width: int, seed: int) -> torch.Tensor:
    return torch.randn(n, width, generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def test_prefill_logits_equal_transformers(models):
    ref, node = models
    embeds = _embeds(11, node.cfg.hidden_size, seed=1)
    positions = torch.arange(11.0).expand(3, -1)
    ours = node.lm.codec_head(node.lm.hidden_states(embeds, positions, DenseKVCache(1)))
    expected = ref(inputs_embeds=embeds[None]).logits[0]
    err = (ours - expected).abs().max().item()
    print(f"max |talker prefill logits - transformers| = {err:.2e}")
    assert err < TOL


@torch.no_grad()
def test_multimodal_positions_equal_transformers(models):
    """Distinct (t, h, w) positions, as an image block gets: the interleaved M-RoPE sections."""
    ref, node = models
    embeds = _embeds(10, node.cfg.hidden_size, seed=2)
    t = torch.tensor([0, 1, 2, 3, 3, 3, 3, 5, 6, 7])
    h = torch.tensor([0, 1, 2, 3, 3, 4, 4, 5, 6, 7])
    w = torch.tensor([0, 1, 2, 3, 4, 3, 4, 5, 6, 7])
    positions = torch.stack([t, h, w])
    ours = node.lm.codec_head(node.lm.hidden_states(embeds, positions.float(), DenseKVCache(1)))
    expected = ref(inputs_embeds=embeds[None], position_ids=positions[:, None, :]).logits[0]
    plain = ref(inputs_embeds=embeds[None], position_ids=t.expand(3, 1, -1)).logits[0]
    assert (expected - plain).abs().max().item() > 1e-3  # the h/w axes do change the result
    assert (ours - expected).abs().max().item() < TOL


def _reference(ref, node, prompt: torch.Tensor, texts: torch.Tensor, pad: torch.Tensor):
    """transformers' Talker generate, greedy on both levels: per step code-0 logits and frames."""
    project = ref.text_projection
    out = ref.generate(
        inputs_embeds=prompt[None], attention_mask=torch.ones(1, prompt.shape[0], dtype=torch.long),
        trailing_text_hidden=project(texts)[None], tts_pad_embed=project(pad)[None, None],
        max_new_tokens=STEPS + 1, do_sample=False,
        eos_token_id=node.cfg.vocab_size,  # never sampled: run every step, as the loop above does (no stop rule)
        suppress_tokens=node.cfg.suppressed_ids(), output_hidden_states=True, output_logits=True,
        return_dict_in_generate=True,
    )
    frames = [hid[-1][0] for hid in out.hidden_states[1:]]  # step t+1 carries frame t's codes
    return torch.stack(out.logits[: len(frames)])[:, 0], torch.stack(frames)


@torch.no_grad()
def test_ragged_batch_generation_equals_transformers(models):
    ref, node = models
    h, ht = node.cfg.hidden_size, node.cfg.thinker_hidden_size
    pad = _embeds(1, ht, seed=9)[0]
    requests = {
        "a": (_embeds(9, h, seed=3), _embeds(2, ht, seed=4)),  # text ends before the speech: pads follow
        "b": (_embeds(6, h, seed=5), _embeds(8, ht, seed=6)),
    }
    runner = PagedSteps(node)
    logits: dict[str, list[torch.Tensor]] = {rid: [] for rid in requests}
    frames: dict[str, list[torch.Tensor]] = {rid: [] for rid in requests}
    out = None
    for step in range(STEPS):
        if step == 0:
            walk, rows = "prefill", {rid: {PROMPT_EMBEDS: p} for rid, (p, _) in requests.items()}
        else:
            walk, rows = "decode", {}
            for i, (rid, (_, texts)) in enumerate(requests.items()):
                k = step - 1  # decode step k feeds trailing text k
                rows[rid] = {FRAME_EMBED: out.row_outputs[FRAME_EMBED][i], TEXT_EMBED: texts[k] if k < len(texts) else pad}
        sampler = GreedyRecorder()
        out = runner.step(walk, rows, sampler)
        main = [logit for label, logit in sampler.calls if label == "main"]
        assert len(main) == 1
        for i, rid in enumerate(requests):
            logits[rid].append(main[0][i])
            frames[rid].append(out.row_outputs[CODES][i, 0])
    for rid, (prompt, texts) in requests.items():
        ref_logits, ref_frames = _reference(ref, node, prompt, texts, pad)
        n = ref_frames.shape[0]
        assert n == STEPS
        ours = torch.stack(logits[rid][:n])
        keep = torch.isfinite(ours)
        assert torch.equal(~keep, node.lm.suppress_mask.expand_as(keep))  # only the codec specials but EOS
        err = (ours[keep] - ref_logits[keep]).abs().max().item()
        print(f"request {rid}: {n} frames, max |code-0 logits - transformers| = {err:.2e}")
        assert err < TOL
        assert torch.equal(torch.stack(frames[rid][:n]), ref_frames), rid


def test_prompt_positions_shape_is_checked(models):
    _, node = models
    from mstar.model.submodule_base import CurrentForwardPassInfo

    info = CurrentForwardPassInfo(request_id="r", walk="prefill", request_kwargs={})
    with pytest.raises(ValueError, match="talker_positions"):
        node.prepare_inputs("prefill", info, {PROMPT_EMBEDS: torch.zeros(4, node.cfg.hidden_size), POSITIONS: torch.zeros(3, 5)})
