"""Chat prompts through the checkpoint's template, tokenizer caching, and token bytes."""

from __future__ import annotations

import pytest
from mstar.api.protocol import ChatCompletionRequest
from mstar.text import TokenRenderer, chat_prompt_ids, load_tokenizer, template_messages
from mstar.text.tiny_tokenizer import write_tiny_tokenizer
from tokenizers_for_tests import ALL

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    write_tiny_tokenizer(path)
    return path


def test_tokenizer_is_loaded_once_per_directory(ckpt) -> None:
    assert load_tokenizer(ckpt) is load_tokenizer(str(ckpt) + "/")


def test_chat_prompt_is_the_checkpoint_template_with_tools(ckpt) -> None:
    tok = load_tokenizer(ckpt)
    req = ChatCompletionRequest(model="m", messages=[
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
    ])
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    ids = chat_prompt_ids(tok, template_messages(req.messages), tools=tools)
    assert tok.decode(ids) == (
        "<|im_start|>system\nBe brief.\n\n# Tools\n<tools>\n"
        '{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}'
        "\n</tools><|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    )
    no_prompt = chat_prompt_ids(tok, template_messages(req.messages), add_generation_prompt=False)
    assert tok.decode(no_prompt).endswith("Hi there<|im_end|>\n")
    with pytest.raises(ValueError, match=r"content parts of type \['image_url'\]"):
        template_messages([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])


@pytest.mark.parametrize("name", ["byte_level_bpe", "byte_fallback_bpe", "sentencepiece_bpe"])
def test_token_bytes_concatenate_to_the_text(name: str) -> None:
    tok = ALL[name]()
    render = TokenRenderer(tok)
    text = "Hello wörld 你好 🙂<|im_end|>"
    ids = tok.encode(text, add_special_tokens=False)
    joined = b"".join(render.token_bytes(i) for i in ids).decode()
    # SentencePiece encodes a leading "▁" that decode drops.
    assert joined.removeprefix(" ") == text
    assert render.token_text(tok.convert_tokens_to_ids("<|im_end|>")) == "<|im_end|>"
