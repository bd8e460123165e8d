"""V-JEPA 2 throughput on random mid-size checkpoints, in one run:

1. clips/s for encode and encode+predict at batch 1 and 8: ``mstar.Engine`` (the
   ``vjepa2`` plugin, one request per clip) vs ``transformers``' ``VJEPA2Model`` (one
   batched forward) on the same checkpoint;
2. AC rollout steps/s: the engine's rollout on the paged KV cache, and a dense cached
   rollout, each vs recomputing the whole sequence every step (upstream's way).

    .venv/bin/python benchmarks/vjepa2_throughput.py [--frames 16 --rounds 3 --horizon 12]

Interleaved rounds, best of ``--rounds`` each. Ratios > 1 mean mstar (or the cache) is faster.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from mstar import Engine
from mstar_vjepa2.ac_predictor import ACPredictor
from mstar_vjepa2.checkpoint import write_checkpoint
from mstar_vjepa2.checkpoint_ac import TINY_AC, ac_config, load_predictor
from mstar_vjepa2.checkpoint_ac import write_checkpoint as write_ac_checkpoint
from mstar_vjepa2.config import TINY_CONFIG
from mstar_vjepa2.rollout import normalize, rollout_cached, rollout_recompute

MID = {**TINY_CONFIG, "patch_size": 16, "crop_size": 128, "frames_per_clip": 64, "hidden_size": 384,
       "num_attention_heads": 6, "num_hidden_layers": 6, "mlp_ratio": 4.0, "pred_hidden_size": 192,
       "pred_num_attention_heads": 6, "pred_num_hidden_layers": 4, "pred_mlp_ratio": 4.0}
MID_AC = {**TINY_AC, "img_size": 128, "patch_size": 16, "embed_dim": 384, "encoder_depth": 2, "encoder_num_heads": 6,
          "encoder_mlp_hidden": 1536, "predictor_dim": 384, "predictor_depth": 6, "predictor_num_heads": 6,
          "predictor_mlp_hidden": 1536}


def best(fns: list, rounds: int) -> list[float]:
    """Best time of each function over ``rounds``, the functions interleaved round by round
    (a load spike on this shared machine then hits every side alike)."""
    for fn in fns:
        fn()  # warm-up
    times = [[] for _ in fns]
    for _ in range(rounds):
        for fn, ts in zip(fns, times, strict=True):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
    return [min(ts) for ts in times]


def encoder_table(ckpt: Path, frames: int, rounds: int) -> None:
    import transformers

    ref = transformers.VJEPA2Model.from_pretrained(str(ckpt)).eval()
    crop = MID["crop_size"]
    print(f"encode / encode+predict, {frames} frames of {crop}px, clips/s (best of {rounds})")
    print(f"{'walk':16}{'batch':>6}{'mstar':>10}{'transformers':>14}{'ratio':>8}")
    with Engine.from_model("vjepa2", weights=ckpt) as eng:
        for task in ("encode", "predict"):
            for batch in (1, 8):
                clips = torch.randn(batch, frames, 3, crop, crop)
                reqs = [{"inputs": {"video": c}, "kwargs": {"task": task}} for c in clips]

                def ours(reqs=reqs):
                    outs = eng.run_batch(reqs)
                    assert all(o.error is None for o in outs)

                def theirs(clips=clips, task=task):
                    with torch.no_grad():
                        ref(clips, skip_predictor=task == "encode")

                t_ours, t_ref = best([ours, theirs], rounds)
                print(f"{task:16}{batch:>6}{batch / t_ours:>10.2f}{batch / t_ref:>14.2f}{t_ref / t_ours:>8.2f}")


def rollout_table(ckpt: Path, horizon: int, rounds: int) -> None:
    model = ACPredictor(ac_config(MID_AC)).eval()
    load_predictor(model, ckpt)
    n, e = model.cfg.patches, model.cfg.embed_dim
    gen = torch.Generator().manual_seed(0)
    ctx = normalize(torch.randn(1, 1, n, e, generator=gen))
    actions, states = 0.1 * torch.randn(1, horizon, 7, generator=gen), torch.rand(1, 1, 7, generator=gen)
    print(f"\nAC rollout, horizon {horizon}, {model.cfg.tokens_per_frame} tokens/frame, steps/s (best of {rounds})")
    with Engine.from_model("vjepa2-ac", weights=ckpt) as eng:
        req = {"inputs": {"latents": ctx[0].flatten(0, 1), "actions": actions[0], "states": states[0]},
               "kwargs": {"task": "rollout_latents"}}

        def engine_run():
            (out,) = eng.run_batch([req])
            assert out.error is None and len(out.signals["prediction"]) == horizon

        t_engine, t_dense, t_full = best([
            engine_run,
            lambda: rollout_cached(model, ctx, actions, states, horizon),
            lambda: rollout_recompute(model, ctx, actions, states, horizon),
        ], rounds)
    print(f"{'engine, paged KV':24}{horizon / t_engine:>10.2f}   vs recompute {t_full / t_engine:>6.2f}x")
    print(f"{'dense KV (planner path)':24}{horizon / t_dense:>10.2f}   vs recompute {t_full / t_dense:>6.2f}x")
    print(f"{'recompute every step':24}{horizon / t_full:>10.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=16)
    ap.add_argument("--horizon", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        v, ac = Path(tmp) / "vjepa2", Path(tmp) / "ac"
        write_checkpoint(v, MID)
        write_ac_checkpoint(ac, config=MID_AC)
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
        encoder_table(v, args.frames, args.rounds)
        rollout_table(ac, args.horizon, args.rounds)


if __name__ == "__main__":
    main()
