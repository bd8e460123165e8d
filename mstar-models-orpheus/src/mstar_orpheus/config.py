"""Reading an Orpheus checkpoint directory: LLM config, tokenizer ids and the SNAC config.

Layout (``--weights DIR``)::

    DIR/config.json                      Llama config (canopylabs/orpheus-3b-0.1-ft)
    DIR/model.safetensors                or model-*.safetensors + model.safetensors.index.json
    DIR/tokenizer.json                   the Orpheus tokenizer (Llama-3 + <custom_token_N>)
    DIR/generation_config.json           optional: end ids (else config.json's eos_token_id)
    DIR/snac/config.json                 hubertsiuzdak/snac_24khz
    DIR/snac/pytorch_model.bin
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mstar.text.lm import END_IDS, GENERATION_CONFIG, end_token_ids

from mstar_orpheus.tokens import OrpheusTokens

ARCHITECTURE = "LlamaForCausalLM"
SNAC_DIR = "snac"
TOKENIZER_FILE = "tokenizer.json"


def _read_json(path: Path, what: str) -> dict[str, Any]:
    if not path.is_file():
        raise FileNotFoundError(f"Orpheus checkpoint lacks {what}: {path} does not exist")
    return json.loads(path.read_text())


def load_config(checkpoint_dir: Path) -> dict[str, Any]:
    """The LLM's config.json plus ``orpheus`` (special ids) and ``snac`` (codec config)."""
    checkpoint_dir = Path(checkpoint_dir)
    config = _read_json(checkpoint_dir / "config.json", "the LLM config")
    if ARCHITECTURE not in config.get("architectures", []):
        raise ValueError(
            f"{checkpoint_dir}/config.json is not an Orpheus (Llama) checkpoint "
            f"(architectures: {config.get('architectures')})"
        )
    snac = _read_json(checkpoint_dir / SNAC_DIR / "config.json", "the SNAC decoder config")
    tokens = OrpheusTokens.from_tokenizer(checkpoint_dir / TOKENIZER_FILE, int(snac.get("codebook_size", 4096)))
    if tokens.custom_token_base + 10 >= config["vocab_size"]:
        raise ValueError(f"vocab_size {config['vocab_size']} holds no audio tokens (base id {tokens.custom_token_base})")
    return {**config, "orpheus": tokens.as_dict(), "snac": snac, END_IDS: list(_end_ids(checkpoint_dir, config))}


def _end_ids(checkpoint_dir: Path, config: dict[str, Any]) -> tuple[int, ...]:
    """The checkpoint's end ids (generation_config.json's, else config.json's, else the
    tokenizer's eos_token): the official pipeline runs on vLLM, which stops on them besides
    its own stop ids."""
    generation = checkpoint_dir / "generation_config.json"
    gen = json.loads(generation.read_text()) if generation.is_file() else {}
    return end_token_ids({**config, GENERATION_CONFIG: gen}, checkpoint_dir)
