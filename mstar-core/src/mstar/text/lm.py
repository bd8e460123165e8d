"""What a text LLM plugin declares, in one place: its graph (prefill, then a decode loop),
its output signals, its sampling declaration and a KV node base that runs the step.

Signals (all to the client): ``tokens`` (the sampled id, [1] per step, persisted so the
decode step reads it), the logprob signals of ``mstar.api.adapter``'s convention
(``logprob``, ``top_logprob_ids``, ``top_logprob_values``, only while a row of the batch
asked for logprobs). Per-step logits (request kwarg ``return_logits``) come from core for
every sampling node (``mstar.engine.executors.RETURN_LOGITS``), not from this module.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mstar.graph import EngineKind, GraphSpec, LinearWalks, Loop, NodeSpec, Signal, Step, Walk
from mstar.graph.shapes import DECODE, PREFILL, prefill_decode_mixing
from mstar.layers.attention import (
    PagedSelfAttention,
    full_attention_limit,
    head_dim_of,
    sliding_window_of,
)
from mstar.layers.decoder import DecoderModel
from mstar.layers.vocab_head import vocab_logits
from mstar.model.spec import MixedBatchConfig, NodeSamplers
from mstar.model.submodule_base import (
    ARNodeInputs,
    ARNodeSubmodule,
    BatchedModelOutput,
    CurrentForwardPassInfo,
    KVCacheLayout,
    ModelInputsFromEngine,
)

PROMPT, TOKENS = "prompt_ids", "tokens"
LOGPROB, TOP_IDS, TOP_VALUES = "logprob", "top_logprob_ids", "top_logprob_values"
STEP_OUTPUTS = (TOKENS, LOGPROB, TOP_IDS, TOP_VALUES)


def text_lm_graph(node: str = "lm") -> GraphSpec:
    """One KV node: walk ``prefill`` reads ``prompt_ids``, walk ``decode`` loops until a
    stop (core's stop rules: max_tokens, stop ids, EOS)."""
    step = Step(node, inputs=(TOKENS,), outputs=STEP_OUTPUTS)
    return GraphSpec(
        nodes={node: NodeSpec(node, EngineKind.KV_CACHE)},
        walks={
            PREFILL: Walk(PREFILL, node, Step(node, inputs=(PROMPT,), outputs=STEP_OUTPUTS)),
            DECODE: Walk(DECODE, node, Loop("decode_loop", step, stop_on=(node,))),
        },
        signals={
            TOKENS: Signal(TOKENS, to_client=True, persist=True),
            **{name: Signal(name, to_client=True) for name in STEP_OUTPUTS if name != TOKENS},
        },
        state_machine=LinearWalks({node: (PREFILL, DECODE)}),
        request_inputs=(PROMPT,),
    )


def text_lm_mixed_batches(node: str = "lm") -> list[MixedBatchConfig]:
    """Prefill and decode rows in one forward (continuous batching), prefills uncapped:
    ``mstar.graph.shapes.prefill_decode_mixing`` without its row cap."""
    return prefill_decode_mixing(node, max_prefill_rows=None)


GENERATION_CONFIG = "generation_config"  # config key: generation_config.json, when the checkpoint has one
END_IDS = "mstar_end_token_ids"  # config key: the end ids decided at load (``end_token_ids``)


def load_text_config(checkpoint_dir: str | Path, reference_end_ids: int | Sequence[int] | None = None) -> dict[str, Any]:
    """``config.json``, with ``generation_config.json`` (if present) under key
    ``generation_config`` (HF generate's defaults and end ids live there) and the end ids
    (``end_token_ids``, ``reference_end_ids`` as the model's reference generate default)
    under ``mstar_end_token_ids``."""
    config = json.loads((Path(checkpoint_dir) / "config.json").read_text())
    generation = Path(checkpoint_dir) / "generation_config.json"
    if generation.is_file():
        config[GENERATION_CONFIG] = json.loads(generation.read_text())
    config[END_IDS] = list(end_token_ids(config, checkpoint_dir, reference_end_ids))
    return config


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(value)] if isinstance(value, int) else [int(i) for i in value]


def end_token_ids(
    config: Mapping[str, Any],
    checkpoint_dir: str | Path | None = None,
    reference_end_ids: int | Sequence[int] | None = None,
    reference_passes_them: bool = False,
) -> tuple[int, ...]:
    """The ids generation ends on, from the first source that names any:

    1. ``generation_config.json``'s ``eos_token_id`` (``config["generation_config"]``): what
       HF generate reads when the file exists;
    2. ``reference_end_ids``: the end ids the model's reference ``generate`` passes itself
       when the file names none (the plugin states them, e.g. a keyword default);
    3. ``config.json``'s ``eos_token_id``: HF's generation config made from the model config;
    4. the tokenizer's ``eos_token`` (what vLLM adds to every request's stop ids).

    ``reference_passes_them``: the reference's ``generate`` passes ``reference_end_ids`` to the
    underlying generate as an argument, which wins over ``generation_config.json``; they come
    first then. Ids outside ``config["vocab_size"]`` are dropped: they can never be sampled."""
    sources = (
        lambda: _ids(reference_end_ids) if reference_passes_them else [],
        lambda: _ids((config.get(GENERATION_CONFIG) or {}).get("eos_token_id")),
        lambda: _ids(reference_end_ids),
        lambda: _ids(config.get("eos_token_id")),
        lambda: _tokenizer_eos(checkpoint_dir),
    )
    for source in sources:
        ids = source()
        if ids:
            vocab = config.get("vocab_size")
            return tuple(dict.fromkeys(i for i in ids if vocab is None or 0 <= i < int(vocab)))
    return ()


def _tokenizer_eos(checkpoint_dir: str | Path | None) -> list[int]:
    if checkpoint_dir is None:
        return []
    from mstar.text.tokenizer import load_tokenizer

    try:
        return _ids(load_tokenizer(checkpoint_dir).eos_token_id)
    except FileNotFoundError:  # a checkpoint without a tokenizer
        return []


GENERATION_DEFAULTS = ("temperature", "top_p", "top_k", "repetition_penalty")


def generation_defaults(config: Mapping[str, Any]) -> dict[str, Any]:
    """Sampling defaults the checkpoint's ``generation_config`` sets (greedy when it says
    ``do_sample: false``)."""
    gen = config.get(GENERATION_CONFIG) or {}
    out = {k: gen[k] for k in GENERATION_DEFAULTS if gen.get(k) is not None}
    if gen.get("do_sample") is False:
        out["temperature"] = 0.0
    return out


def text_lm_samplers(config: Mapping[str, Any], node: str = "lm", **defaults: Any) -> dict[str, NodeSamplers]:
    """The node's sampling declaration: vocabulary, end ids (decided at load, see
    ``end_token_ids``), penalties over the prompt; main defaults from the checkpoint's
    generation config, then ``defaults`` (e.g. ``max_tokens``)."""
    from mstar.sampling import SamplingParams

    return {
        node: NodeSamplers(
            vocab_size=int(config["vocab_size"]),
            main=SamplingParams(**{**generation_defaults(config), **defaults}),
            stop_token_ids=tuple(config[END_IDS]) if END_IDS in config else end_token_ids(config),
            prompt_signal=PROMPT,
        )
    }


def sample_step(logits: torch.Tensor, engine_inputs: ModelInputsFromEngine) -> BatchedModelOutput:
    """Sample each row's next token from ``logits`` [B, V] and build the step's outputs."""
    assert engine_inputs.sampler is not None, "a text LM node must declare its sampler"
    out = engine_inputs.sampler.sample(logits)
    rows: dict[str, torch.Tensor] = {TOKENS: out.tokens[:, None]}
    infos = [engine_inputs.per_request_info[rid] for rid in engine_inputs.request_ids]
    # Only while a row asked: an output per row and step costs every request.
    if any(i.sampling is not None and i.sampling.logprobs for i in infos):
        rows[LOGPROB] = out.logprobs[:, None]
        if out.top_logprob_ids is not None:
            rows[TOP_IDS], rows[TOP_VALUES] = out.top_logprob_ids, out.top_logprob_values
    return BatchedModelOutput(row_outputs=rows)


class CausalLMNode(ARNodeSubmodule):
    """The KV node of a decoder-only text LLM on the paged cache. A subclass builds its
    layers from ``config`` (HF keys) and implements ``hidden_states`` and ``logits``.
    ``token_signal``: the signal a decode step reads its token from (``tokens``)."""

    token_signal = TOKENS

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        self.config = dict(config)
        self.vocab_size = int(config["vocab_size"])

    @abstractmethod
    def hidden_states(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: Any) -> torch.Tensor:
        """Flat ids [T] of every row → hidden states [T, H] (before the final norm if
        ``logits`` applies it)."""

    @abstractmethod
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[B, H] hidden states of each row's last token → [B, V] logits."""

    def kv_cache_layout(self) -> KVCacheLayout:
        c = self.config
        dtype = next(self.parameters()).dtype
        return KVCacheLayout(c["num_hidden_layers"], c.get("num_key_value_heads") or c["num_attention_heads"], head_dim_of(c), dtype)

    def max_model_len(self) -> int:
        """``max_position_embeddings``. For a config with sliding windows whose attention
        layers do not apply them (``PagedSelfAttention`` built without its ``layer`` index),
        capped at the smallest window (``mstar.layers.attention.full_attention_limit``):
        attending whole rows equals windowed attention only up to the window."""
        limit = int(self.config["max_position_embeddings"])
        window = full_attention_limit(self.config)
        return limit if window is None or self._windows_applied() else min(limit, int(window))

    def _windows_applied(self) -> bool:
        layers = [m for m in self.modules() if isinstance(m, PagedSelfAttention)]
        return len(layers) == int(self.config["num_hidden_layers"]) and all(
            a.window == sliding_window_of(self.config, i) for i, a in enumerate(layers)
        )

    def prepare_inputs(self, graph_walk: str, info: CurrentForwardPassInfo, signals: Mapping[str, torch.Tensor]) -> ARNodeInputs:
        if info.walk != PREFILL:  # the token this node's sampler drew: in range by construction
            ids = signals[self.token_signal].reshape(-1)
            return ARNodeInputs(input_ids=ids, input_seq_len=ids.numel())
        ids = signals[PROMPT].reshape(-1).to(torch.long)
        if ids.numel() == 0:
            raise ValueError("the prompt is empty")
        if int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size:
            raise ValueError(f"token ids must lie in [0, {self.vocab_size})")
        return ARNodeInputs(input_ids=ids, input_seq_len=ids.numel())

    def preprocess(self, graph_walk: str, engine_inputs: ModelInputsFromEngine, inputs: list) -> dict[str, Any]:
        device = next(self.parameters()).device
        return {"input_ids": torch.cat([i.input_ids for i in inputs]).to(device)}

    def forward_batched(self, graph_walk: str, engine_inputs: ModelInputsFromEngine, input_ids: torch.Tensor) -> BatchedModelOutput:
        assert engine_inputs.positions is not None
        hidden = self.hidden_states(input_ids, engine_inputs.positions, engine_inputs.attention)
        return sample_step(self.logits(hidden[engine_inputs.last_token_index.long()]), engine_inputs)


class DecoderLM(CausalLMNode):
    """A decoder-only LLM from HF config keys with HF's ``*ForCausalLM`` names: ``model``
    (``mstar.layers.DecoderModel``) and ``lm_head``, the same parameter as
    ``model.embed_tokens.weight`` when ``tie_word_embeddings`` (default False) is set, so a
    checkpoint with either name or both loads. ``layer_options`` go to every
    ``DecoderLayer`` (``qk_norm``, ``qkv_bias``, ``o_bias``, ``fused_qkv``, ``fused_gate_up``)."""

    def __init__(self, config: Mapping[str, Any], **layer_options: Any) -> None:
        super().__init__(config)
        self.model = DecoderModel(config, **layer_options)
        self.lm_head = nn.Linear(config["hidden_size"], self.vocab_size, bias=False)
        self.tied = bool(config.get("tie_word_embeddings", False))
        if self.tied:
            self.lm_head.weight = self.model.embed_tokens.weight

    def _apply(self, fn: Any, recurse: bool = True) -> DecoderLM:
        # ``to_empty`` (a meta-device build) makes one new tensor per name: tie them again.
        super()._apply(fn, recurse)
        if self.tied:
            self.lm_head.weight = self.model.embed_tokens.weight
        return self

    def hidden_states(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: Any) -> torch.Tensor:
        return self.model(input_ids, positions, attention)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return vocab_logits(self.model.norm(hidden), self.lm_head.weight)
