"""Qwen3-Omni Thinker, its text-out modes: text->text, image->text and speech->text.
Throughput and time to first token at concurrency 1, 8 and 32, ``mstar.Engine`` vs
transformers' ``Qwen3OmniMoeThinkerForConditionalGeneration.generate`` on the same random
checkpoint, printed as ratios in one run.

    .venv/bin/python benchmarks/qwen3omni_text.py [--size small|mid] [--device cpu|cuda] [--tokens 32]

The checkpoint is random (written by ``mstar_qwen3omni.tiny_checkpoint`` with transformers'
classes, the real 152,064-token vocabulary and special ids; bf16 on CUDA, fp32 on CPU);
``small`` suits a CPU, ``mid`` (hidden 1024, 8 layers, 32 experts top-4) a GPU. Every request
is greedy and decodes exactly ``--tokens`` tokens. The same prompts and processor-shaped
media tensors go to both sides.

mstar: the c requests of a round are submitted at once to one in-process engine (continuous
batching: encoders batched across requests, prefills mixed with decodes) and consumed by one
asyncio loop; TTFT is each request's time to its first token, throughput all generated
tokens / the round's wall time.
transformers: the c requests as one left-padded batch in one ``generate`` call (its static
batching); TTFT is the wall time of the same call with ``max_new_tokens=1``.
Rounds alternate between the two sides; the median of ``--rounds`` is reported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

SIZES = {
    "small": dict(text=dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=64, moe_intermediate_size=128, num_experts=8,
                            num_experts_per_tok=2, mlp_only_layers=[],
                            rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [12, 10, 10],
                                             "interleaved": True, "mrope_interleaved": True}),
                  audio=dict(d_model=128, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=256, num_mel_bins=128,
                             downsample_hidden_size=32, max_source_positions=1500),
                  vision=dict(depth=2, hidden_size=128, intermediate_size=256, num_heads=4, patch_size=16,
                              num_position_embeddings=256, deepstack_visual_indexes=[0, 1])),
    "mid": dict(text=dict(hidden_size=1024, intermediate_size=2048, num_hidden_layers=8, num_attention_heads=16,
                          num_key_value_heads=4, head_dim=64, moe_intermediate_size=256, num_experts=32,
                          num_experts_per_tok=4, mlp_only_layers=[],
                          rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [12, 10, 10],
                                           "interleaved": True, "mrope_interleaved": True}),
                audio=dict(d_model=512, encoder_layers=4, encoder_attention_heads=8, encoder_ffn_dim=1024, num_mel_bins=128,
                           downsample_hidden_size=128, max_source_positions=1500),
                vision=dict(depth=4, hidden_size=512, intermediate_size=1024, num_heads=8, patch_size=16,
                            num_position_embeddings=1024, deepstack_visual_indexes=[1, 3])),
}


def build_requests(config: dict, mode: str, n: int) -> list[tuple[list[int], dict[str, torch.Tensor]]]:
    """(prompt ids, processor-shaped tensors) per request: a chat prompt with distinct text
    and, for image / speech, one 224x224 image (14x14 patches of 16) or 4 s of 16 kHz speech
    (400 mel frames), laid out as the processor lays them out (values random: the cost of a
    forward does not depend on them)."""
    from mstar_qwen3omni.config import MultimodalTokens
    from mstar_qwen3omni.positions import audio_token_count

    t = MultimodalTokens.from_config(config)
    vision, audio = config["thinker_config"]["vision_config"], config["thinker_config"]["audio_config"]
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        text = torch.randint(300, 5000, (8 + i % 8,), generator=g).tolist()
        tensors: dict[str, torch.Tensor] = {}
        media: list[int] = []
        if mode == "image":
            grid = torch.tensor([[1, 14, 14]])
            width = vision["in_channels"] * vision["temporal_patch_size"] * vision["patch_size"] ** 2
            tensors = {"pixel_values": torch.randn(196, width, generator=g), "image_grid_thw": grid}
            media = [t.vision_start_token_id, *[t.image_token_id] * (196 // t.spatial_merge_size**2), t.vision_end_token_id]
        elif mode == "speech":
            frames = 400
            tensors = {"input_features": torch.randn(1, audio["num_mel_bins"], frames, generator=g),
                       "feature_attention_mask": torch.ones(1, frames, dtype=torch.long)}
            n_audio = int(audio_token_count(torch.tensor(frames), t.audio_n_window))
            media = [t.audio_start_token_id, *[t.audio_token_id] * n_audio, t.audio_end_token_id]
        ids = [151644, 872, 198, *media, *text, 151645, 198, 151644, 77091, 198]
        out.append((ids, tensors))
    return out


def run_mstar(engine, requests, tokens: int) -> tuple[float, list[float]]:
    """All requests submitted at once; one event loop consumes every stream (no thread per
    request competing with the engine thread)."""
    media = {"input_features": "audio", "pixel_values": "image"}
    sampling = {"temperature": 0, "max_tokens": tokens, "ignore_eos": True}

    async def one(ids: list[int], t: dict[str, torch.Tensor], start: float) -> float:
        first = None
        kwargs = {"media": [v for k, v in media.items() if k in t]}
        async for out in engine.generate_async({"prompt_ids": torch.tensor(ids), **t}, sampling, kwargs=kwargs):
            if first is None and out.signal == "tokens":
                first = time.perf_counter() - start
            assert out.error is None, out.error
        assert first is not None
        return first

    async def all_requests() -> list[float]:
        start = time.perf_counter()
        return await asyncio.gather(*(one(ids, t, start) for ids, t in requests))

    start = time.perf_counter()
    ttft = asyncio.run(all_requests())
    wall = time.perf_counter() - start
    return len(requests) * tokens / wall, list(ttft)


def hf_batch(requests, device: str, dtype: torch.dtype) -> dict:
    pad = 151643
    width = max(len(ids) for ids, _ in requests)
    ids = torch.full((len(requests), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, _) in enumerate(requests):  # left padding, as generate expects
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    batch = {"input_ids": ids.to(device), "attention_mask": mask.to(device)}
    for key in requests[0][1]:
        value = torch.cat([t[key] for _, t in requests])
        batch[key] = value.to(device, dtype) if value.is_floating_point() else value.to(device)
    return batch


def run_hf(model, requests, tokens: int, device: str, dtype: torch.dtype) -> tuple[float, float]:
    batch = hf_batch(requests, device, dtype)
    kw = dict(do_sample=False, eos_token_id=None, pad_token_id=151643)

    def timed(n: int) -> float:
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(**batch, max_new_tokens=n, min_new_tokens=n, **kw)
        if device == "cuda":
            torch.cuda.synchronize()
        assert out.shape[1] == batch["input_ids"].shape[1] + n
        return time.perf_counter() - t0

    ttft = timed(1)
    return len(requests) * tokens / timed(tokens), ttft


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--modes", nargs="+", default=["text", "image", "speech"])
    args = ap.parse_args()

    from mstar import Engine
    from mstar_qwen3omni.tiny_checkpoint import write_checkpoint
    from transformers import Qwen3OmniMoeForConditionalGeneration

    size = SIZES[args.size]
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    ckpt = write_checkpoint(Path(tempfile.mkdtemp(prefix="qwen3omni-bench-")), size["text"], size["audio"], size["vision"],
                            dtype=dtype, processor=False)
    config = json.loads((ckpt / "config.json").read_text())
    hf = Qwen3OmniMoeForConditionalGeneration.from_pretrained(ckpt, dtype=dtype).thinker.to(args.device).eval()
    engine = Engine.from_model("qwen3omni", weights=ckpt, device=args.device, kv_budget_bytes=2 << 30, max_num_seqs=64)
    print(f"size {args.size}, device {args.device} ({dtype}), {args.tokens} tokens per request, median of {args.rounds} rounds")
    print(f"{'mode':7} {'conc':>4} {'prompt':>6} | {'mstar tok/s':>11} {'hf tok/s':>9} {'ratio':>6} | "
          f"{'mstar TTFT p50':>14} {'hf TTFT':>8} {'ratio':>6}")
    for mode in args.modes:
        for c in args.concurrency:
            requests = build_requests(config, mode, c)
            run_mstar(engine, requests[:1], 2)  # warm-up of this shape, on both sides
            run_hf(hf, requests, 2, args.device, dtype)
            ours, theirs = [], []
            for _ in range(args.rounds):
                ours.append(run_mstar(engine, requests, args.tokens))
                theirs.append(run_hf(hf, requests, args.tokens, args.device, dtype))
            m_tput = statistics.median(o[0] for o in ours)
            m_ttft = statistics.median(statistics.median(o[1]) for o in ours)
            h_tput = statistics.median(t[0] for t in theirs)
            h_ttft = statistics.median(t[1] for t in theirs)
            prompt = int(statistics.mean(len(ids) for ids, _ in requests))
            print(f"{mode:7} {c:>4} {prompt:>6} | {m_tput:>11.1f} {h_tput:>9.1f} {m_tput / h_tput:>5.2f}x | "
                  f"{m_ttft * 1e3:>12.1f}ms {h_ttft * 1e3:>6.1f}ms {h_ttft / m_ttft:>5.2f}x", flush=True)
    engine.close()


if __name__ == "__main__":
    main()
