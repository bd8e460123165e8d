"""The default API adapter of text-out LLMs: ``/v1/chat/completions`` through the
checkpoint's chat template and ``/v1/completions``, both on the checkpoint's tokenizer.

A plugin whose graph is ``mstar.text.lm.text_lm_graph`` returns
``TextLMAdapter(checkpoint_dir, config)`` from its ``mstar_api_adapter`` hook and gets
both endpoints, streaming, stop strings and logprobs with nothing else to write. The chat
template is wherever the checkpoint keeps it (``mstar.text.chat_template``); a model whose
reference formats chats with a processor passes ``template_from="processor"``.
Chat requests may carry ``tools``, ``chat_template_kwargs``, ``add_generation_prompt``
(default true) and ``continue_final_message`` (default false), handed to
``apply_chat_template`` as HF defines them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from mstar.api.adapter import CHAT, COMPLETIONS, ApiAdapter, EngineRequest, TextDecoder
from mstar.api.errors import ApiError
from mstar.api.protocol import ChatCompletionRequest, CompletionRequest
from mstar.text import (
    IncrementalDetokenizer,
    TokenRenderer,
    chat_prompt_ids,
    load_tokenizer,
    template_messages,
)
from mstar.text.chat_template import Preference
from mstar.text.lm import LOGPROB, PROMPT, TOKENS, TOP_IDS, TOP_VALUES


class DetokenizingTextDecoder(TextDecoder):
    """One request's token ids → text deltas, exact against ``tokenizer.decode``."""

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self.detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens)

    def decode(self, value: torch.Tensor) -> str:
        return self.detokenizer.add(value.reshape(-1).tolist())

    def flush(self) -> str:
        return self.detokenizer.flush()


class TextLMAdapter(ApiAdapter):
    endpoints = frozenset({CHAT, COMPLETIONS})
    text_signal = TOKENS
    supports_logprobs = True
    logprob_signal = LOGPROB
    top_logprob_ids_signal = TOP_IDS
    top_logprob_values_signal = TOP_VALUES
    max_n = 16  # chat choices per request

    def __init__(
        self, checkpoint_dir: str | Path, config: Mapping[str, Any], node: str = "lm", template_from: Preference = "tokenizer"
    ) -> None:
        self.checkpoint_dir = str(checkpoint_dir)
        self.template_from: Preference = template_from  # whose file order finds the chat template
        self.sampling_node = node
        self.vocab_size = int(config["vocab_size"])
        self.max_len = int(config["max_position_embeddings"])
        self._renderer: TokenRenderer | None = None
        # Load now: a missing or mismatched tokenizer fails at start-up, not on a request.
        if len(self.tokenizer) > self.vocab_size:
            raise ValueError(
                f"the tokenizer in {self.checkpoint_dir} has {len(self.tokenizer)} tokens, more than "
                f"the model's vocab_size {self.vocab_size}"
            )

    @property
    def tokenizer(self) -> Any:
        return load_tokenizer(self.checkpoint_dir, self.template_from)  # once per process

    @property
    def renderer(self) -> TokenRenderer:
        if self._renderer is None:
            self._renderer = TokenRenderer(self.tokenizer)
        return self._renderer

    def _request(self, ids: list[int], param: str) -> EngineRequest:
        if not ids:
            raise ApiError(400, "the prompt is empty", param=param)
        # Room for at least one generated token; the engine would reject it alike, later.
        if len(ids) >= self.max_len:
            raise ApiError(
                400, f"the prompt is {len(ids)} tokens; this model holds at most {self.max_len - 1}",
                param=param, code="context_length_exceeded",
            )
        return EngineRequest({PROMPT: torch.tensor(ids, dtype=torch.long)}, prompt_tokens=len(ids))

    def chat_inputs(self, request: ChatCompletionRequest) -> EngineRequest:
        extra = request.model_extra or {}
        ids = chat_prompt_ids(
            self.tokenizer,
            template_messages(request.messages),
            tools=extra.get("tools"),
            add_generation_prompt=bool(extra.get("add_generation_prompt", True)),
            continue_final_message=bool(extra.get("continue_final_message", False)),
            template_kwargs=extra.get("chat_template_kwargs"),
        )
        return self._request(ids, "messages")

    def completion_inputs(self, request: CompletionRequest) -> EngineRequest:
        prompt = request.prompt
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt, add_special_tokens=True)
        else:
            ids = [int(i) for i in prompt]  # type: ignore[union-attr]
            if any(not 0 <= i < self.vocab_size for i in ids):
                raise ApiError(400, f"prompt token ids must lie in [0, {self.vocab_size})", param="prompt")
        return self._request(ids, "prompt")

    def text_decoder(self) -> TextDecoder:
        return DetokenizingTextDecoder(self.tokenizer)

    def token_text(self, token_id: int) -> str:
        return self.renderer.token_text(token_id)

    def token_bytes(self, token_id: int) -> bytes:
        return self.renderer.token_bytes(token_id)
