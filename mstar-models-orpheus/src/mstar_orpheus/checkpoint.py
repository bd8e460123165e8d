"""Writing tiny random Orpheus checkpoints in the released file layout (tests and
``mstar serve --random-weights``): config.json, model.safetensors (or shards + index),
tokenizer.json, and snac/config.json + snac/pytorch_model.bin with weight-norm names.

By default the LM is *steered* so that a random model still speaks Orpheus's audio token
format: each embedding carries a one-hot "band" feature (audio token band k, or
start-of-speech as band 6) and the untied LM head scores band k+1 (mod 7) tokens highest
for it, so greedy or sampled decoding walks the seven code bands in order and every
28-code window decodes to (noise) audio.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from mstar_orpheus.config import SNAC_DIR, TOKENIZER_FILE
from mstar_orpheus.tokens import AUDIO_TOKEN_OFFSET, TOKENS_PER_FRAME, OrpheusTokens

TINY_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 156940,  # the real vocabulary: Llama-3 + Orpheus custom tokens
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 512,  # < max_position_embeddings, as HF expects
        "rope_type": "llama3",
    },
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "initializer_range": 0.02,
    "tie_word_embeddings": False,
    "bos_token_id": 128000,
    "eos_token_id": 128009,
    "torch_dtype": "float32",
}

TINY_SNAC: dict[str, Any] = {
    "sampling_rate": 24000,
    "encoder_dim": 4,
    "encoder_rates": [2, 4, 8, 8],
    "latent_dim": None,
    "decoder_dim": 64,
    "decoder_rates": [8, 8, 4, 2],
    "attn_window_size": None,
    "codebook_size": 4096,
    "codebook_dim": 8,
    "vq_strides": [4, 2, 1],
    "noise": True,
    "depthwise": True,
}

SNAC_24KHZ: dict[str, Any] = {**TINY_SNAC, "encoder_dim": 48, "decoder_dim": 1024}  # the released sizes


def write_checkpoint(
    path: Path,
    seed: int = 0,
    steer_audio: bool = True,
    shards: int = 1,
    snac: dict[str, Any] | None = None,
    **overrides: Any,
) -> Path:
    """A random checkpoint directory; ``overrides`` change LLM config keys, ``snac`` the
    codec config (e.g. ``{"noise": False}``)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = {**json.loads(json.dumps(TINY_CONFIG)), **overrides}
    snac_config = {**TINY_SNAC, **(snac or {})}
    if steer_audio and config["tie_word_embeddings"]:
        raise ValueError("audio steering needs an untied LM head (tie_word_embeddings=False)")
    tokens = _write_tokenizer(path, config, snac_config)
    gen = torch.Generator().manual_seed(seed)
    lm_state = _lm_state(config, tokens, snac_config["codebook_size"], steer_audio, gen)
    _save_safetensors(path, lm_state, shards)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    _write_snac(path / SNAC_DIR, snac_config, gen)
    return path


def _write_tokenizer(path: Path, config: dict[str, Any], snac_config: dict[str, Any]) -> OrpheusTokens:
    from mstar_orpheus.tiny_tokenizer import BOS, build_tokenizer

    build_tokenizer(config["vocab_size"]).save(str(path / TOKENIZER_FILE))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": "<|eot_id|>",
        "model_max_length": config["max_position_embeddings"],
        "clean_up_tokenization_spaces": True,
    }, indent=2))
    return OrpheusTokens.from_tokenizer(path / TOKENIZER_FILE, snac_config["codebook_size"])


def _lm_state(
    config: dict[str, Any], tokens: OrpheusTokens, codebook: int, steer: bool, gen: torch.Generator
) -> dict[str, torch.Tensor]:
    from mstar_orpheus.lm_node import OrpheusLM

    with torch.device("meta"):
        lm = OrpheusLM({**config, "orpheus": tokens.as_dict(), "snac": {"codebook_size": codebook}})
    std = float(config.get("initializer_range", 0.02))
    state: dict[str, torch.Tensor] = {}
    for name, p in lm.state_dict().items():
        if name.endswith("norm.weight") or "layernorm" in name:
            state[name] = torch.ones(p.shape)
        elif name.endswith(".bias"):
            state[name] = torch.zeros(p.shape)
        else:
            state[name] = torch.randn(p.shape, generator=gen) * std
    if steer:
        _steer_towards_audio(state, config, tokens, codebook, std, gen)
    return state


def _steer_towards_audio(
    state: dict[str, torch.Tensor], config: dict[str, Any], tokens: OrpheusTokens, codebook: int, std: float, gen: torch.Generator
) -> None:
    hidden = config["hidden_size"]
    if hidden < 2 * TOKENS_PER_FRAME + 2:
        raise ValueError(f"hidden_size {hidden} is too small for audio steering")
    band_dims = torch.arange(1, 1 + TOKENS_PER_FRAME)
    first = tokens.custom_token_base + AUDIO_TOKEN_OFFSET
    band_ids = [torch.arange(first + k * codebook, first + (k + 1) * codebook) for k in range(TOKENS_PER_FRAME)]
    # Quiet residual branches keep the band feature dominant in the residual stream at any width.
    for name, tensor in state.items():
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            tensor.mul_(0.1)
    embed, head = state["model.embed_tokens.weight"], state["lm_head.weight"]
    embed[:, band_dims] = 0.0
    for k, ids in enumerate(band_ids):
        embed[ids, band_dims[k]] = 1.0
    embed[tokens.start_of_speech, band_dims[-1]] = 1.0  # speech starts as if after band 6
    # Scale so that after RMSNorm the right band scores ~10 and everything else ~N(0, 1).
    rms = math.sqrt((1.0 + (hidden - 1) * std**2) / hidden)
    other = std / rms
    head.copy_(torch.randn(head.shape, generator=gen) / (other * math.sqrt(hidden - TOKENS_PER_FRAME - 1)))
    head[:, band_dims] = 0.0
    for k, ids in enumerate(band_ids):
        head[ids, band_dims[(k - 1) % TOKENS_PER_FRAME]] = 10.0 * rms


def _save_safetensors(path: Path, state: dict[str, torch.Tensor], shards: int) -> None:
    from mstar.weights import INDEX_FILE, SINGLE_FILE

    state = {k: v.contiguous() for k, v in state.items()}
    if shards <= 1:
        save_file(state, str(path / SINGLE_FILE), metadata={"format": "pt"})
        return
    keys = sorted(state)
    per = math.ceil(len(keys) / shards)
    weight_map = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: state[k] for k in keys[i * per : (i + 1) * per]}
        save_file(part, str(path / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, name))
    total = sum(v.numel() * v.element_size() for v in state.values())
    (path / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))


# ---- SNAC -------------------------------------------------------------------------------


def _write_snac(path: Path, snac_config: dict[str, Any], gen: torch.Generator) -> None:
    from mstar_orpheus.snac_model import SnacConfig, SnacDecoder

    path.mkdir(parents=True, exist_ok=True)
    cfg = SnacConfig.from_dict(snac_config)
    with torch.device("meta"):
        decoder = SnacDecoder(cfg)
    state: dict[str, torch.Tensor] = {}
    for name, module in decoder.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            key = f"{name}.{pname}"
            if pname == "alpha":
                state[key] = 1.0 + 0.1 * torch.randn(p.shape, generator=gen)
            elif pname == "bias":
                state[key] = 0.01 * torch.randn(p.shape, generator=gen)
            elif isinstance(module, torch.nn.Embedding):
                state[key] = torch.randn(p.shape, generator=gen)
            else:
                fan_in = p[0].numel()
                # Scaled below 1/sqrt(fan_in) so activations stay O(1) through the residual stacks.
                state.update(_weight_norm_pair(key[: -len(".weight")], 0.68 * torch.randn(p.shape, generator=gen) / math.sqrt(fan_in)))
    state.update(_encoder_state(snac_config, cfg, gen))
    torch.save(state, path / "pytorch_model.bin")
    (path / "config.json").write_text(json.dumps(snac_config, indent=2))


def _weight_norm_pair(base: str, weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """The (magnitude, direction) pair torch's weight_norm stores for ``weight``."""
    g = weight.norm(dim=tuple(range(1, weight.dim())), keepdim=True)
    return {f"{base}.parametrizations.weight.original0": g, f"{base}.parametrizations.weight.original1": weight.clone()}


def _conv(base: str, c_out: int, c_in_per_group: int, kernel: int, gen: torch.Generator, bias: bool = True) -> dict[str, torch.Tensor]:
    out = _weight_norm_pair(base, torch.randn(c_out, c_in_per_group, kernel, generator=gen) / math.sqrt(c_in_per_group * kernel))
    if bias:
        out[f"{base}.bias"] = torch.zeros(c_out)
    return out


def _encoder_state(raw: dict[str, Any], cfg: Any, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Random encoder and VQ input projections: unused for decoding, but part of the real
    layout (so ``snac.SNAC`` loads these files strictly)."""
    d = int(raw.get("encoder_dim", 64))
    depthwise = bool(raw.get("depthwise", True))
    state = _conv("encoder.block.0", d, 1, 7, gen)
    for i, stride in enumerate(raw.get("encoder_rates", [3, 3, 7, 7]), start=1):
        d_in, d = d, d * 2
        groups = d_in if depthwise else 1
        for j, _ in enumerate((1, 3, 9)):
            base = f"encoder.block.{i}.block.{j}.block"
            state[f"{base}.0.alpha"] = torch.ones(1, d_in, 1)
            state.update(_conv(f"{base}.1", d_in, d_in // groups, 7, gen))
            state[f"{base}.2.alpha"] = torch.ones(1, d_in, 1)
            state.update(_conv(f"{base}.3", d_in, d_in, 1, gen))
        state[f"encoder.block.{i}.block.3.alpha"] = torch.ones(1, d_in, 1)
        state.update(_conv(f"encoder.block.{i}.block.4", d, d_in, 2 * stride, gen))
    n = len(raw.get("encoder_rates", [3, 3, 7, 7])) + 1
    state.update(_conv(f"encoder.block.{n}", d, 1 if depthwise else d, 7, gen))
    for q in range(len(cfg.vq_strides)):
        state.update(_conv(f"quantizer.quantizers.{q}.in_proj", cfg.codebook_dim, cfg.latent_dim, 1, gen))
    return state
