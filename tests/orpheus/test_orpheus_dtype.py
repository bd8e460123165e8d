"""``--dtype bfloat16`` on the CPU: the LM in bfloat16, SNAC in float32, within the
tolerance the plugin's README states against float32."""

from __future__ import annotations

import torch
from mstar.testing.precision import first_draw_logits, parameter_dtypes, relative_error
from orpheus_reference import official_prompt

# mstar-models-orpheus/README.md, "Precision".
FIRST_LOGITS_TOLERANCE = 2e-2


def test_bfloat16_serves_speech_within_the_stated_tolerance(quiet_ckpt, engines):
    f32, bf16 = engines(quiet_ckpt), engines(quiet_ckpt, dtype="bfloat16")
    assert parameter_dtypes(bf16) == {"lm": {torch.bfloat16}, "snac": {torch.float32}}
    assert bf16.core.nodes["lm"].kv.dtype == torch.bfloat16
    prompt = torch.as_tensor(official_prompt(quiet_ckpt, "Hello there, how are you?", "tara"))
    request = [{"inputs": {"prompt_ids": prompt}, "sampling": {"temperature": 0, "max_tokens": 48, "ignore_eos": True}}]
    (want, _), (got, results) = first_draw_logits(f32, request), first_draw_logits(bf16, request)
    assert relative_error(got["lm"], want["lm"]) < FIRST_LOGITS_TOLERANCE
    audio = results[0].cat("audio")
    assert audio.dtype == torch.float32 and audio.numel() >= 2048 and bool(torch.isfinite(audio).all())
