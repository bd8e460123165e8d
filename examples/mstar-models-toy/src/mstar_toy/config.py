"""The toy checkpoint's config.json: read, never hard-coded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ARCHITECTURE = "MstarToyForCausalLM"
BYTE_VOCAB = 256  # ids 0..255 are bytes; specials follow

DEFAULT_CONFIG: dict[str, Any] = {
    "architectures": [ARCHITECTURE],
    "model_type": "mstar_toy",
    "vocab_size": 259,
    "bos_token_id": 256,
    "eos_token_id": 257,
    "pad_token_id": 258,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6,
    "residual_codes": 16,
    "decoder": {"hidden_size": 32, "kernel_size": 3, "samples_per_token": 40},
    "sample_rate": 8000,
    "stream": {"policy": "left_context", "chunk": 8, "left_context": 2, "first_chunk": 2},
}


def load_config(checkpoint_dir: Path) -> dict[str, Any]:
    path = Path(checkpoint_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"toy checkpoint {checkpoint_dir} has no config.json")
    config = json.loads(path.read_text())
    if ARCHITECTURE not in config.get("architectures", []):
        raise ValueError(f"{path} is not a toy checkpoint (architectures: {config.get('architectures')})")
    return config


def encode_text(text: str, bos_token_id: int) -> list[int]:
    return [bos_token_id, *text.encode("utf-8")]
