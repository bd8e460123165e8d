"""Wall time of our audio and vision encoders against transformers' towers on the same random
mid-size weights, one batched call each (CPU by default; noisy on a shared machine).

    OMP_NUM_THREADS=2 .venv/bin/python mstar-models-qwen3omni/tools/bench_encoders.py [--device cuda]
"""

from __future__ import annotations

import argparse
import time

import torch
from mstar_qwen3omni.audio_encoder import AudioEncoder, AudioEncoderConfig
from mstar_qwen3omni.vision_encoder import VisionEncoder, VisionEncoderConfig
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
    Qwen3OmniMoeAudioEncoderConfig,
    Qwen3OmniMoeVisionEncoderConfig,
)
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeAudioEncoder,
    Qwen3OmniMoeVisionEncoder,
)

AUDIO = dict(num_mel_bins=128, encoder_layers=4, encoder_attention_heads=8, encoder_ffn_dim=1024, d_model=256,
             output_dim=512, downsample_hidden_size=64, n_window=50, n_window_infer=800)
VISION = dict(depth=4, hidden_size=256, intermediate_size=1024, num_heads=8, patch_size=16, out_hidden_size=512,
              num_position_embeddings=2304, deepstack_visual_indexes=[1, 2])


def _time(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    dev = torch.device(args.device)

    ref_a = Qwen3OmniMoeAudioEncoder(Qwen3OmniMoeAudioEncoderConfig(**AUDIO)).eval().to(dev)
    ours_a = AudioEncoder(AudioEncoderConfig(**AUDIO)).eval().to(dev)
    ours_a.load_state_dict(ref_a.state_dict())
    lens = [1000, 730, 1500, 420, 2000, 999, 60, 1234]  # mel frames (100 per second)
    feats = torch.randn(128, sum(lens), device=dev)
    lens_t = torch.tensor(lens, device=dev)
    t_ref = _time(lambda: ref_a(feats, feature_lens=lens_t), args.repeats)
    t_ours = _time(lambda: ours_a(feats, lens_t, torch.zeros_like(lens_t)), args.repeats)
    print(f"audio, 8 clips {sum(lens) / 100:.1f} s in all: transformers {t_ref * 1e3:.1f} ms, ours {t_ours * 1e3:.1f} ms, ratio {t_ref / t_ours:.2f}x")

    ref_v = Qwen3OmniMoeVisionEncoder(Qwen3OmniMoeVisionEncoderConfig(**VISION)).eval().to(dev)
    ours_v = VisionEncoder(VisionEncoderConfig.from_dict(ref_v.config.to_dict())).eval().to(dev)
    ours_v.load_state_dict(ref_v.state_dict())
    grids = [[1, 28, 28], [1, 20, 36], [1, 44, 30], [1, 16, 16], [8, 16, 24], [1, 32, 32]]  # 5 images, one 16-frame video
    grid = torch.tensor(grids, device=dev)
    pixels = torch.randn(int(grid.prod(-1).sum()), 3 * 2 * 16 * 16, device=dev)
    t_ref = _time(lambda: ref_v(pixels, grid_thw=grid), args.repeats)
    t_ours = _time(lambda: ours_v(pixels, grid), args.repeats)
    print(f"vision, {pixels.shape[0]} patches: transformers {t_ref * 1e3:.1f} ms, ours {t_ours * 1e3:.1f} ms, ratio {t_ref / t_ours:.2f}x")


if __name__ == "__main__":
    main()
