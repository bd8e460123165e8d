"""The engine on a CUDA device: same answers as on the CPU and as transformers, seeds that
hold whatever else runs, preemption that changes nothing. Skipped without CUDA."""

from __future__ import annotations

import random

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

GREEDY = {"main": {"temperature": 0, "max_tokens": 16, "ignore_eos": True}, "aux": {"residual": {"temperature": 0}}}
SEEDED = {"main": {"temperature": 1.0, "top_p": 0.9, "max_tokens": 16, "seed": 11, "ignore_eos": True},
          "aux": {"residual": {"temperature": 1.0}}}


def _prompts(n: int, seed: int = 0) -> list[torch.Tensor]:
    from mstar_toy.config import encode_text

    rng = random.Random(seed)
    return [torch.tensor(encode_text("".join(chr(97 + rng.randrange(26)) for _ in range(rng.randint(3, 90))), 256))
            for _ in range(n)]


def _tokens(engine, prompts, sampling) -> list[list[int]]:
    results = engine.run_batch([{"inputs": {"prompt_ids": p}, "sampling": sampling} for p in prompts])
    assert all(r.error is None for r in results), [r.error for r in results]
    return [r.cat("token").tolist() for r in results]


@pytest.fixture(scope="module")
def toy_ckpt(tmp_path_factory):
    from mstar_toy.checkpoint import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("toy"))


def test_toy_on_cuda_equals_cpu_and_batches_equal_alone(toy_ckpt):
    from mstar import Engine

    prompts = _prompts(16)
    with Engine.from_model("toy", weights=toy_ckpt, device="cuda") as gpu, Engine.from_model("toy", weights=toy_ckpt) as cpu:
        assert gpu.core.nodes["lm"].device.type == "cuda"
        batched = _tokens(gpu, prompts, GREEDY)
        assert batched == [_tokens(gpu, [p], GREEDY)[0] for p in prompts]
        assert batched == _tokens(cpu, prompts, GREEDY)


def test_seeded_request_on_cuda_is_identical_alone_and_in_a_batch(toy_ckpt):
    from mstar import Engine

    target = _prompts(1, seed=9)[0]
    with Engine.from_model("toy", weights=toy_ckpt, device="cuda") as gpu:
        alone = _tokens(gpu, [target], SEEDED)[0]
        for position in (0, 3, 7):
            others = _prompts(7, seed=position)
            batch = others[:position] + [target] + others[position:]
            sampling = [SEEDED if i == position else {**SEEDED, "main": {**SEEDED["main"], "seed": 100 + i}} for i in range(8)]
            results = gpu.run_batch([{"inputs": {"prompt_ids": p}, "sampling": s} for p, s in zip(batch, sampling, strict=True)])
            assert results[position].cat("token").tolist() == alone


def test_preemption_on_cuda_changes_nothing(toy_ckpt):
    from mstar import Engine

    prompts = _prompts(8, seed=3)
    with Engine.from_model("toy", weights=toy_ckpt, device="cuda") as calm:
        expected = _tokens(calm, prompts, GREEDY)
    with Engine.from_model("toy", weights=toy_ckpt, device="cuda", kv_budget_bytes=512 * 4 * 40, block_size=4,
                           max_num_batched_tokens=16) as tight:
        assert _tokens(tight, prompts, GREEDY) == expected
        assert tight.core.stats.preemptions > 0


def test_orpheus_on_cuda_matches_transformers(tmp_path):
    import json

    from mstar import Engine
    from mstar_orpheus.checkpoint import write_checkpoint
    from transformers import LlamaForCausalLM

    ckpt = write_checkpoint(tmp_path / "orpheus", seed=1, snac={"noise": False})
    config = json.loads((ckpt / "config.json").read_text())
    config.pop("dtype", None)
    config["torch_dtype"] = "float32"  # like for like with the float32 reference
    (ckpt / "config.json").write_text(json.dumps(config))
    hf = LlamaForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32).cuda().eval()
    prompts = [[128259, 128000, *range(70, 70 + n), 128009, 128260, 128261, 128257] for n in (3, 17, 40)]
    greedy = {"temperature": 0, "repetition_penalty": 1.0, "top_p": 1.0, "max_tokens": 24, "ignore_eos": True}
    with Engine.from_model("orpheus", weights=ckpt, device="cuda") as engine:
        results = engine.run_batch([{"inputs": {"prompt_ids": torch.tensor(p)}, "sampling": greedy,
                                     "kwargs": {"return_logits": True}} for p in prompts])
    worst = 0.0
    for prompt, result in zip(prompts, results, strict=True):
        assert result.error is None, result.error
        tokens = result.cat("token").tolist()
        ids = torch.tensor([prompt + tokens], device="cuda")
        with torch.inference_mode():
            ref = hf(ids).logits[0, len(prompt) - 1 : -1].float().cpu()
        ours = torch.stack(result.signals["logits"]).float().cpu()
        worst = max(worst, float((ours - ref).abs().max()))
        assert ref.argmax(-1).tolist() == tokens
    print(f"orpheus on cuda: max |logits - transformers| = {worst:.2e}")
    assert worst < 1e-3
