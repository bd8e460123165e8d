"""A tiny random Qwen3-Omni checkpoint *with* speech output, written by transformers' own
``Qwen3OmniMoeForConditionalGeneration.save_pretrained`` (keys ``thinker.*``, ``talker.*``,
``code2wav.*``; MoE experts one module per expert, as released), plus the reference model.

Sizes are tiny but keep every structural feature: GQA everywhere, MoE with a shared expert,
interleaved M-RoPE sections, 4 codebook groups, a sliding window shorter than the test
sequences, two upsampling stages and two decoder blocks. The talker vocabulary is the
codebook plus 1024 ids, like the released 2048 + 1024, so transformers' suppression of the
top 1024 ids leaves exactly the codes and the codec EOS."""

from __future__ import annotations

import json
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import torch
from mstar.attention.metadata import AttentionBatch
from mstar.attention.torch_backend import TorchAttentionBackend
from mstar.kv.cache_manager import KVCacheManager
from mstar.model.submodule_base import (
    CurrentForwardPassInfo,
    ModelInputsFromEngine,
    PerRequestState,
)
from mstar_qwen3omni.speech_loading import build_talker
from mstar_qwen3omni.tiny_checkpoint import (
    THINKER_IDS,
    TINY_AUDIO,
    TINY_CODE2WAV,
    TINY_VISION,
)
from mstar_qwen3omni.tiny_checkpoint import TINY_TALKER as PLUGIN_TALKER
from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration

TINY_THINKER_TEXT: dict[str, Any] = dict(
    vocab_size=512, hidden_size=48, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, moe_intermediate_size=24, num_experts=4, num_experts_per_tok=2,
    rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [4, 2, 2], "mrope_interleaved": True},
)
# The plugin's tiny Talker, fed by this module's wider Thinker.
TINY_TALKER: dict[str, Any] = {**PLUGIN_TALKER, "thinker_hidden_size": TINY_THINKER_TEXT["hidden_size"]}
# Chat-role and TTS ids inside the tiny Thinker vocabulary (the released ones are ~151k).
TINY_SPECIAL_IDS: dict[str, int] = dict(
    im_start_token_id=500, im_end_token_id=501, user_token_id=502, assistant_token_id=503,
    system_token_id=504, tts_pad_token_id=505, tts_bos_token_id=506, tts_eos_token_id=507,
)


def _randomise(module: torch.nn.Module, seed: int, scale: float = 0.25) -> None:
    """Weights far from init (norm scales, layer scales, snake parameters included) so a wrong
    formula cannot hide behind a zero or a one."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith("norm.weight") or name.endswith(".scale") or name.endswith("gamma"):
                p.copy_(1.0 + 0.2 * noise)
            elif name.endswith(".alpha") or name.endswith(".beta"):
                p.copy_(0.3 * noise)
            else:
                p.copy_(noise * (scale if p.ndim > 1 else 0.1))


@cache
def speech_model(seed: int = 0) -> tuple[Any, Path]:
    """(transformers reference model in float32 eval mode, checkpoint dir) — written once per session."""
    hidden = TINY_THINKER_TEXT["hidden_size"]
    towers = dict(  # tiny towers: the default ones are the released sizes
        audio_config={**TINY_AUDIO, "output_dim": hidden}, vision_config={**TINY_VISION, "out_hidden_size": hidden}
    )
    config = Qwen3OmniMoeConfig(
        thinker_config=dict(text_config=TINY_THINKER_TEXT, **towers, **THINKER_IDS), talker_config=TINY_TALKER,
        code2wav_config=TINY_CODE2WAV, enable_audio_output=True, **TINY_SPECIAL_IDS,
    )
    torch.manual_seed(seed)
    model = Qwen3OmniMoeForConditionalGeneration(config).eval()
    _randomise(model.talker, seed + 1)
    _randomise(model.code2wav, seed + 2, scale=0.05)  # audio mostly inside the clamp
    root = Path(tempfile.mkdtemp(prefix="qwen3omni-speech-"))
    model.save_pretrained(root)
    return model, root


def checkpoint_config(root: Path) -> dict[str, Any]:
    return json.loads((root / "config.json").read_text())


class GreedySample:
    def __init__(self, tokens: torch.Tensor) -> None:
        self.tokens = tokens


class GreedyRecorder:
    """A sampler handle for tests: argmax for every label, recording (label, logits) per call
    ("main" for the main sampler)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, torch.Tensor]] = []

    def sample(self, logits: torch.Tensor) -> GreedySample:
        self.calls.append(("main", logits.clone()))
        return GreedySample(logits.argmax(-1))

    def sample_aux(self, label: str, logits: torch.Tensor) -> GreedySample:
        self.calls.append((label, logits.clone()))
        return GreedySample(logits.argmax(-1))


def load_talker_node(root: Path) -> Any:
    return build_talker(checkpoint_config(root), root, "cpu").eval()


class PagedSteps:
    """Drives a KV node's contract the way the engine does (prepare_inputs, KV append, a
    planned torch attention backend, preprocess, forward_batched) for a fixed set of rows."""

    def __init__(self, node: Any, block_size: int = 4, num_blocks: int = 256) -> None:
        layout = node.kv_cache_layout()
        self.node = node
        self.kv = KVCacheManager(layout.num_layers, layout.num_kv_heads, layout.head_dim, block_size, num_blocks, layout.dtype)
        self.backend = TorchAttentionBackend(self.kv)
        self.states: dict[str, Any] = {}

    def step(self, walk: str, rows: dict[str, dict[str, torch.Tensor]], sampler: Any) -> Any:
        infos = self.infos(walk, rows)
        return self.run(walk, {rid: self.node.prepare_inputs(walk, infos[rid], sig) for rid, sig in rows.items()}, sampler)

    def infos(self, walk: str, rows: Any) -> dict[str, CurrentForwardPassInfo]:
        return {rid: CurrentForwardPassInfo(request_id=rid, walk=walk, request_kwargs={}) for rid in rows}

    def run(self, walk: str, rows: dict[str, Any], sampler: Any) -> Any:
        """One step over already prepared (or split) inputs."""
        infos = self.infos(walk, rows)
        for rid, inp in rows.items():
            self.states.setdefault(rid, PerRequestState())
            assert self.kv.append(rid, "main", inp.input_seq_len)
        batch = AttentionBatch.build([(rid, "main", inp.input_seq_len) for rid, inp in rows.items()], self.kv)
        self.backend.plan(batch)
        engine_inputs = ModelInputsFromEngine(
            request_ids=list(rows), per_request_info=infos, per_request_states=self.states, attention=self.backend,
            positions=batch.positions, qo_indptr=batch.qo_indptr, sampler=sampler,
        )
        kwargs = self.node.preprocess(walk, engine_inputs, list(rows.values()))
        return self.node.forward_batched(walk, engine_inputs, **kwargs)
