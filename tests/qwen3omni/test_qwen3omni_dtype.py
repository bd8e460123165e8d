"""``--dtype bfloat16`` on the CPU: Thinker, encoders and Talker in bfloat16, Code2Wav in
float32, every walk served, within the tolerance mstar-models-qwen3omni/README.md states."""

from __future__ import annotations

import torch
from mstar.testing.precision import first_draw_logits, parameter_dtypes, relative_error

# README, "Precision": the Thinker's first draw; the Talker's first draw also carries the
# Thinker's bfloat16 hidden states, so its bound is looser.
THINKER_TOLERANCE, TALKER_TOLERANCE = 2e-2, 5e-2


def test_bfloat16_serves_every_walk_within_the_stated_tolerance(omni_ckpt, omni_engines):
    f32, bf16 = omni_engines(omni_ckpt), omni_engines(omni_ckpt, dtype="bfloat16")
    half = {torch.bfloat16}
    assert parameter_dtypes(bf16) == {"thinker": half, "audio_encoder": half, "vision_encoder": half,
                                      "talker": half, "code2wav": {torch.float32}}
    requests = bf16.built.spec.example_requests(bf16.built.config)  # text spoken, image, video, audio
    (want, _), (got, results) = first_draw_logits(f32, requests), first_draw_logits(bf16, requests)
    assert relative_error(got["thinker"], want["thinker"]) < THINKER_TOLERANCE
    assert relative_error(got["talker"], want["talker"]) < TALKER_TOLERANCE
    audio = [r.cat("audio") for r in results if "audio" in r.signals]
    assert audio and all(a.dtype == torch.float32 and bool(torch.isfinite(a).all()) for a in audio)
