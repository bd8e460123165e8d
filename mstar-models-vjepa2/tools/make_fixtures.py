"""Writes tests/vjepa2/fixtures/ by running reference code in a throw-away environment.

- V-JEPA 2-AC: upstream ``facebookresearch/vjepa2`` (``src/models/ac_predictor.py``, its
  ViT encoder, ``notebooks/utils/mpc_utils.compute_new_pose``) from a checkout given by
  ``--upstream``: a tiny random encoder + AC predictor saved in the upstream checkpoint
  layout, a one-shot frame-causal forward, and a rollout recomputing the whole sequence
  each step as upstream's world-model wrapper does.
- Preprocessing: ``transformers``' ``VJEPA2VideoProcessor`` on the frames of a small mp4
  written here with PyAV (the project's venv cannot import torchvision; see the README).

Run through make_fixtures.sh; nothing here is imported by the project.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

TINY_AC = {
    "img_size": 16, "patch_size": 4, "tubelet_size": 2, "num_frames": 16,
    "encoder": {"embed_dim": 48, "depth": 2, "num_heads": 4, "mlp_ratio": 2.0},
    # head_dim 12: upstream cannot rotate a frame slice of 2 channels (its squeeze drops it).
    "predictor": {"predictor_embed_dim": 48, "depth": 2, "num_heads": 4, "action_embed_dim": 7},
}


def randomize(module: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("norm1.weight") or name.endswith("norm2.weight") or name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))


def ac_fixtures(upstream: Path, out: Path) -> None:
    sys.path.insert(0, str(upstream))
    from functools import partial

    from src.models.ac_predictor import vit_ac_predictor
    from src.models.vision_transformer import VisionTransformer

    spec = importlib.util.spec_from_file_location("mpc_utils", upstream / "notebooks/utils/mpc_utils.py")
    mpc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mpc)

    c = TINY_AC
    enc = VisionTransformer(img_size=(c["img_size"], c["img_size"]), patch_size=c["patch_size"],
                            num_frames=c["num_frames"], tubelet_size=c["tubelet_size"], qkv_bias=True,
                            use_rope=True, use_sdpa=True, norm_layer=partial(torch.nn.LayerNorm, eps=1e-6),
                            **c["encoder"]).eval()
    pred = vit_ac_predictor(img_size=(c["img_size"], c["img_size"]), patch_size=c["patch_size"],
                            num_frames=c["num_frames"], tubelet_size=c["tubelet_size"],
                            embed_dim=c["encoder"]["embed_dim"], use_rope=True, **c["predictor"]).eval()
    randomize(enc, 1)
    randomize(pred, 2)
    ckpt = out / "ac_tiny"
    ckpt.mkdir(parents=True, exist_ok=True)
    # Upstream checkpoints were saved from wrapped modules: keys carry these prefixes.
    torch.save({"encoder": {f"module.backbone.{k}": v for k, v in enc.state_dict().items()},
                "predictor": {f"module.{k}": v for k, v in pred.state_dict().items()}},
               ckpt / "vjepa2-ac-vitg.pt")
    (ckpt / "config.json").write_text(json.dumps({
        "model_type": "vjepa2-ac", "img_size": c["img_size"], "patch_size": c["patch_size"],
        "tubelet_size": c["tubelet_size"], "encoder_num_heads": c["encoder"]["num_heads"],
        "predictor_num_heads": c["predictor"]["num_heads"]}, indent=2))

    gen = torch.Generator().manual_seed(3)
    n = (c["img_size"] // c["patch_size"]) ** 2
    frames = torch.randn(3, 3, c["img_size"], c["img_size"], generator=gen)  # [T, C, H, W]
    with torch.no_grad():
        # Each frame is its own 2-frame clip (upstream's world-model wrapper), then layer norm.
        clips = frames.unsqueeze(2).repeat(1, 1, c["tubelet_size"], 1, 1)
        lat = enc(clips)
        lat = F.layer_norm(lat, (lat.size(-1),)).reshape(1, -1, lat.size(-1))

        b, t = 2, 4
        x = torch.randn(b, t * n, c["encoder"]["embed_dim"], generator=gen)
        actions = 0.3 * torch.randn(b, t, 7, generator=gen)
        states = torch.rand(b, t, 7, generator=gen)
        oneshot = pred(x, actions, states)

        # Rollout: 2 context frames, horizon 3, as WorldModel.infer_next_action's step.
        tc, horizon = 2, 3
        ctx = F.layer_norm(torch.randn(b, tc, n, x.size(-1), generator=gen), (x.size(-1),))
        r_actions = 0.2 * torch.randn(b, tc - 1 + horizon, 7, generator=gen)
        r_states = torch.rand(b, tc, 7, generator=gen)
        frames_traj, poses = ctx, r_states
        preds = []
        for h in range(horizon):
            steps = tc + h
            nxt = pred(frames_traj.flatten(1, 2), r_actions[:, :steps], poses)[:, -n:]
            nxt = F.layer_norm(nxt, (nxt.size(-1),)).view(b, 1, n, -1)
            preds.append(nxt)
            frames_traj = torch.cat([frames_traj, nxt], dim=1)
            poses = torch.cat([poses, mpc.compute_new_pose(poses[:, -1:], r_actions[:, steps - 1 : steps])], dim=1)
        rollout = torch.cat(preds, dim=1)

        # CEM as upstream's planning notebook (WorldModel.infer_next_action's step, mpc_utils.cem).
        def step_predictor(reps, acts, poses):
            bb = reps.size(0)
            nxt = pred(reps.flatten(1, 2), acts, poses)[:, -n:]
            nxt = F.layer_norm(nxt, (nxt.size(-1),)).view(bb, 1, n, -1)
            return nxt, mpc.compute_new_pose(poses[:, -1:], acts[:, -1:])

        torch.manual_seed(123)
        cem_plan = mpc.cem(context_frame=ctx[:1, :1], context_pose=r_states[:1, :1], goal_frame=rollout[:1, 1:2],
                           world_model=step_predictor, rollout=2, cem_steps=3, samples=16, topk=4,
                           momentum_mean=0.15, momentum_std=0.15, maxnorm=0.05, verbose=False)

        pose_in = torch.rand(16, 1, 7, generator=gen) * 2 - 1
        pose_in[..., 6] = torch.rand(16, 1, generator=gen)
        act_in = 0.5 * torch.randn(16, 1, 7, generator=gen)
        pose_out = mpc.compute_new_pose(pose_in, act_in)

    save_file({
        "frames": frames, "encoded": lat.contiguous(),
        "oneshot_latents": x, "oneshot_actions": actions, "oneshot_states": states, "oneshot_out": oneshot,
        "rollout_context": ctx.contiguous(), "rollout_actions": r_actions, "rollout_states": r_states,
        "rollout_out": rollout.contiguous(),
        "pose_in": pose_in[:, 0].contiguous(), "pose_action": act_in[:, 0].contiguous(),
        "pose_out": pose_out[:, 0].contiguous(), "cem_plan": cem_plan[0].contiguous(),
    }, str(out / "ac_reference.safetensors"))


def released_shapes(upstream: Path, out: Path) -> None:
    """Parameter names and shapes of the released V-JEPA 2-AC widths (ViT-g encoder: 1408
    wide, 22 heads, MLP ratio 48/11; AC predictor as upstream's hub builds it), with 2 blocks
    each instead of 40 / 24 (blocks repeat; this keeps the script light)."""
    sys.path.insert(0, str(upstream))
    from functools import partial

    from src.models.ac_predictor import vit_ac_predictor
    from src.models.vision_transformer import VisionTransformer

    enc = VisionTransformer(img_size=(256, 256), patch_size=16, num_frames=64, tubelet_size=2, embed_dim=1408, depth=2,
                            num_heads=22, mlp_ratio=48 / 11, qkv_bias=True, use_rope=True, use_sdpa=True,
                            norm_layer=partial(torch.nn.LayerNorm, eps=1e-6))
    pred = vit_ac_predictor(img_size=(256, 256), patch_size=16, num_frames=64, tubelet_size=2, embed_dim=1408, depth=2)
    shapes = {part: {k: list(v.shape) for k, v in m.state_dict().items()} for part, m in (("encoder", enc), ("predictor", pred))}
    (out / "ac_released_shapes.json").write_text(json.dumps(shapes, indent=0))


def write_test_video(path: Path, frames: int = 10, width: int = 40, height: int = 30) -> np.ndarray:
    """A small mp4 (H.264, yuv420p) of moving colour gradients; returns what PyAV decodes."""
    import av

    yy, xx = np.mgrid[0:height, 0:width]
    with av.open(str(path), "w") as box:
        stream = box.add_stream("libx264", rate=8)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"qp": "0"}
        for i in range(frames):
            img = np.stack([(xx * 6 + i * 20) % 256, (yy * 8 + i * 10) % 256, (xx + yy + i * 30) % 256], -1)
            for packet in stream.encode(av.VideoFrame.from_ndarray(img.astype(np.uint8), format="rgb24")):
                box.mux(packet)
        for packet in stream.encode():
            box.mux(packet)
    with av.open(str(path)) as box:
        return np.stack([f.to_ndarray(format="rgb24") for f in box.decode(video=0)])


def preprocess_fixtures(out: Path) -> None:
    from transformers import VJEPA2VideoProcessor

    video = out / "clip.mp4"
    decoded = write_test_video(video)
    result = {"decoded": torch.from_numpy(decoded)}
    for crop in (16, 24):
        proc = VJEPA2VideoProcessor(crop_size=crop)
        pix = proc(decoded, return_tensors="pt")["pixel_values_videos"][0]
        result[f"pixel_values_videos_{crop}"] = pix.contiguous()
        sampled = proc(decoded, do_sample_frames=True, num_frames=4, return_tensors="pt")["pixel_values_videos"][0]
        result[f"pixel_values_videos_{crop}_sampled4"] = sampled.contiguous()
    save_file(result, str(out / "preprocess_reference.safetensors"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--upstream", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    ac_fixtures(args.upstream, args.out)
    released_shapes(args.upstream, args.out)
    preprocess_fixtures(args.out)


if __name__ == "__main__":
    main()
