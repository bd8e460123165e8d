"""Tiny random Qwen3-Omni checkpoints in the released layout, written with transformers' own
``Qwen3OmniMoeForConditionalGeneration``: config.json, model.safetensors (``thinker.*`` keys,
and with ``speech`` the ``talker.*`` and ``code2wav.*`` ones as the -Instruct release has
them; ``speech=False`` is a Thinker-only checkpoint like -Thinking and -Captioner; MoE experts
one module per expert), generation_config.json, preprocessor_config.json, and a small
tokenizer with the real special ids."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

TINY_TEXT: dict[str, Any] = dict(
    vocab_size=152064,  # the released size: the special tokens sit at their real ids
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    moe_intermediate_size=32,
    num_experts=8,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[2],  # one dense layer among MoE blocks
    rms_norm_eps=1e-6,
    max_position_embeddings=4096,
    rope_parameters={
        "rope_type": "default",
        "rope_theta": 1_000_000.0,
        "mrope_section": [6, 5, 5],  # 16 frequency pairs, interleaved like the released [24, 20, 20]
        "interleaved": True,
        "mrope_interleaved": True,
    },
    initializer_range=0.08,  # away from near-ties between tokens in a 150k vocabulary
)
TINY_AUDIO: dict[str, Any] = dict(
    num_mel_bins=32, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=64, d_model=32,
    downsample_hidden_size=8, max_source_positions=100, n_window=50, n_window_infer=200, conv_chunksize=3,
)
TINY_VISION: dict[str, Any] = dict(
    depth=3, hidden_size=32, intermediate_size=64, num_heads=4, in_channels=3, patch_size=4,
    spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=36, deepstack_visual_indexes=[0, 2],
)
# The released Thinker's special ids and position rules.
THINKER_IDS: dict[str, Any] = dict(
    audio_token_id=151675, image_token_id=151655, video_token_id=151656,
    vision_start_token_id=151652, vision_end_token_id=151653,
    audio_start_token_id=151669, audio_end_token_id=151670,
    user_token_id=872, position_id_per_seconds=13, seconds_per_chunk=2,
)
EOS_TOKEN_IDS = [151645, 151643]  # <|im_end|>, <|endoftext|>
CODEBOOK = 32
# The Talker: a codec vocabulary of the codebook plus 1024 ids (as the released 2048 + 1024),
# the special codec ids inside the top 1024, three speakers; M-RoPE sections interleaved.
TINY_TALKER: dict[str, Any] = dict(
    text_config=dict(
        vocab_size=CODEBOOK + 1024, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, moe_intermediate_size=16, shared_expert_intermediate_size=24,
        num_experts=6, num_experts_per_tok=2, norm_topk_prob=False, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 1, 1], "mrope_interleaved": True},
    ),
    code_predictor_config=dict(
        vocab_size=CODEBOOK, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, num_code_groups=4, rms_norm_eps=1e-6,
    ),
    num_code_groups=4, accept_hidden_layer=2, spatial_merge_size=2,
    codec_pad_id=CODEBOOK + 100, codec_bos_id=CODEBOOK + 101, codec_eos_token_id=CODEBOOK + 102,
    codec_nothink_id=CODEBOOK + 107, codec_think_bos_id=CODEBOOK + 108, codec_think_eos_id=CODEBOOK + 109,
    speaker_id={"ethan": CODEBOOK + 200, "chelsie": CODEBOOK + 201, "aiden": CODEBOOK + 202},
    # The release's Talker position ids (transformers' config defaults differ: audio 151646, 25/s).
    audio_token_id=151675, image_token_id=151655, video_token_id=151656, vision_start_token_id=151652,
    audio_start_token_id=151669, audio_end_token_id=151670, position_id_per_seconds=13, seconds_per_chunk=2,
)
TINY_CODE2WAV: dict[str, Any] = dict(
    codebook_size=CODEBOOK, num_quantizers=4, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, sliding_window=6, rms_norm_eps=1e-5,
    upsampling_ratios=[2, 2], upsample_rates=[3, 2], decoder_dim=32,
)


def _spread(module: Any, seed: int, scale: float) -> None:
    """Weights far from their init (norms, layer scales and snake parameters too), so the
    tiny Talker speaks a few frames and the audio is not silence."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith(("norm.weight", ".scale", "gamma")):
                p.copy_(1.0 + 0.2 * noise)
            elif name.endswith((".alpha", ".beta")):
                p.copy_(0.3 * noise)
            elif "projection" in name:  # the Thinker's text must sway the Talker's codes
                p.copy_(noise * (0.6 if p.ndim > 1 else 0.1))
            else:
                p.copy_(noise * (scale if p.ndim > 1 else 0.1))


def write_checkpoint(
    path: Path,
    text: dict[str, Any] | None = None,
    audio: dict[str, Any] | None = None,
    vision: dict[str, Any] | None = None,
    seed: int = 0,
    max_image_tokens: int = 16,
    dtype: Any = None,
    processor: bool = True,
    speech: bool = True,
) -> Path:
    """Write the checkpoint into ``path`` (created); ``text``/``audio``/``vision`` override
    entries of the tiny configs; the image processor resizes images to at most
    ``max_image_tokens`` LLM tokens; ``dtype`` (a torch dtype) casts the weights, float32
    by default; ``processor=False`` leaves out preprocessor_config.json; ``speech=False``
    leaves out the Talker and Code2Wav. Returns ``path``."""
    import torch
    from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration

    from mstar_qwen3omni.tiny_tokenizer import write_tokenizer

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    text_cfg = {**copy.deepcopy(TINY_TEXT), **(text or {})}
    hidden = text_cfg["hidden_size"]
    audio_cfg = {**TINY_AUDIO, "output_dim": hidden, **(audio or {})}
    vision_cfg = {**TINY_VISION, "out_hidden_size": hidden, **(vision or {})}
    talker = {**copy.deepcopy(TINY_TALKER), "thinker_hidden_size": hidden} if speech else None
    config = Qwen3OmniMoeConfig(
        thinker_config=dict(
            text_config=text_cfg, audio_config=audio_cfg, vision_config=vision_cfg,
            initializer_range=text_cfg["initializer_range"], **THINKER_IDS,
        ),
        **({"talker_config": talker, "code2wav_config": TINY_CODE2WAV} if speech else {}),
        enable_audio_output=speech,
    )
    torch.manual_seed(seed)
    model = Qwen3OmniMoeForConditionalGeneration(config).eval()
    if speech:
        _spread(model.talker, seed + 1, 0.25)
        _spread(model.code2wav, seed + 2, 0.05)  # audio mostly inside the clamp
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(path)
    write_tokenizer(path, role_tokens=True)  # "<|im_start|>assistant" as the Talker reads it
    if processor:
        _write_processor_config(path, audio_cfg, vision_cfg, max_image_tokens)
    (path / "generation_config.json").write_text(
        json.dumps({"eos_token_id": EOS_TOKEN_IDS, "pad_token_id": 151643}, indent=2)
    )
    return path


def _write_processor_config(path: Path, audio_cfg: dict[str, Any], vision_cfg: dict[str, Any], max_image_tokens: int) -> None:
    from mstar_qwen3omni.processing import write_preprocessor_config

    factor = vision_cfg["patch_size"] * vision_cfg["spatial_merge_size"]
    write_preprocessor_config(
        path, patch_size=vision_cfg["patch_size"], temporal_patch_size=vision_cfg["temporal_patch_size"],
        merge_size=vision_cfg["spatial_merge_size"], num_mel_bins=audio_cfg["num_mel_bins"],
        min_pixels=factor**2, max_pixels=max_image_tokens * factor**2,
    )
