"""Chat prompts through the checkpoint's own chat template (``apply_chat_template``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from mstar.text.chat_template import TEMPLATE_FILES


def template_messages(messages: Iterable[Any]) -> list[dict[str, Any]]:
    """OpenAI chat messages (pydantic models or dicts) as the dicts HF templates read:
    every field the client sent except ``None`` ones; text-only content lists become the
    list of ``{"type": "text", "text": ...}`` parts templates know."""
    out = []
    for m in messages:
        d = m.model_dump(exclude_none=True) if hasattr(m, "model_dump") else {k: v for k, v in dict(m).items() if v is not None}
        content = d.get("content")
        if isinstance(content, list):
            kinds = {p.get("type") for p in content}
            if kinds - {"text"}:
                raise ValueError(f"content parts of type {sorted(kinds - {'text'})} are not supported by a text model")
            d["content"] = [{"type": "text", "text": p.get("text") or ""} for p in content]
        out.append(d)
    return out


def chat_prompt_ids(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    template_kwargs: Mapping[str, Any] | None = None,
) -> list[int]:
    """Token ids of the rendered conversation, as ``tokenizer.apply_chat_template`` makes
    them (no extra special tokens beyond what the template writes)."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            f"the checkpoint has no chat template (none in {', '.join(TEMPLATE_FILES)}); use /v1/completions"
        )
    out = tokenizer.apply_chat_template(
        messages,
        tools=tools,
        add_generation_prompt=add_generation_prompt and not continue_final_message,
        continue_final_message=continue_final_message,
        tokenize=True,
        return_dict=True,
        **dict(template_kwargs or {}),
    )
    return list(out["input_ids"])
