"""``--dtype bfloat16`` on the CPU: the talker in bfloat16, the codec in float32, within the
tolerance mstar-models-qwen3tts/README.md states against float32."""

from __future__ import annotations

import torch
from mstar.testing.precision import first_draw_logits, parameter_dtypes, relative_error

FIRST_LOGITS_TOLERANCE = 2e-2  # README, "Precision"


def test_bfloat16_serves_every_walk_within_the_stated_tolerance(tiny_ckpt, engines):
    f32, bf16 = engines(tiny_ckpt), engines(tiny_ckpt, dtype="bfloat16")
    assert parameter_dtypes(bf16) == {"talker": {torch.bfloat16}, "codec": {torch.float32}}
    assert bf16.core.nodes["talker"].kv.dtype == torch.bfloat16
    requests = bf16.built.spec.example_requests(bf16.built.config)
    (want, _), (got, results) = first_draw_logits(f32, requests), first_draw_logits(bf16, requests)
    assert relative_error(got["talker"], want["talker"]) < FIRST_LOGITS_TOLERANCE
    for result in results:
        audio = result.cat("audio")
        assert audio.dtype == torch.float32 and audio.numel() > 0 and bool(torch.isfinite(audio).all())
