"""TextLMAdapter: prompts from the checkpoint's tokenizer and template, early prompt checks,
exact text deltas."""

from __future__ import annotations

import pytest
import torch
from mstar.api.errors import ApiError
from mstar.api.protocol import ChatCompletionRequest, CompletionRequest
from mstar.api.text_adapter import TextLMAdapter
from mstar.text.tiny_tokenizer import write_tiny_tokenizer

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def adapter(tmp_path_factory) -> TextLMAdapter:
    path = tmp_path_factory.mktemp("ckpt")
    write_tiny_tokenizer(path)
    return TextLMAdapter(path, {"vocab_size": 384, "max_position_embeddings": 64})


def test_chat_prompt_is_the_template_with_generation_prompt(adapter) -> None:
    msgs = [{"role": "user", "content": "Hi"}]
    req = ChatCompletionRequest(model="m", messages=msgs, chat_template_kwargs={"unused": 1})
    got = adapter.chat_inputs(req)
    want = adapter.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, return_dict=True)["input_ids"]
    assert got.inputs["prompt_ids"].tolist() == want and got.prompt_tokens == len(want)
    cont = adapter.chat_inputs(ChatCompletionRequest(model="m", messages=[*msgs, {"role": "assistant", "content": "Hel"}],
                                                     continue_final_message=True))
    assert adapter.tokenizer.decode(cont.inputs["prompt_ids"]).endswith("<|im_start|>assistant\nHel")


def test_completion_prompts_and_their_checks(adapter) -> None:
    assert adapter.completion_inputs(CompletionRequest(model="m", prompt="Hello world")).inputs["prompt_ids"].tolist() == \
        adapter.tokenizer.encode("Hello world")
    assert adapter.completion_inputs(CompletionRequest(model="m", prompt=[5, 6])).inputs["prompt_ids"].tolist() == [5, 6]
    with pytest.raises(ApiError, match=r"token ids must lie in \[0, 384\)"):
        adapter.completion_inputs(CompletionRequest(model="m", prompt=[384]))
    with pytest.raises(ApiError, match="holds at most 63") as err:
        adapter.completion_inputs(CompletionRequest(model="m", prompt=list(range(64))))
    assert err.value.code == "context_length_exceeded"


def test_text_decoder_is_exact_and_skips_specials(adapter) -> None:
    tok = adapter.tokenizer
    ids = tok.encode("naïve 🙂 café") + [tok.convert_tokens_to_ids("<|im_end|>")]
    decoder = adapter.text_decoder()
    text = "".join(decoder.decode(torch.tensor([i])) for i in ids) + decoder.flush()
    assert text == tok.decode(ids, skip_special_tokens=True) == "naïve 🙂 café"


def test_a_tokenizer_larger_than_the_vocabulary_fails_at_start(tmp_path) -> None:
    write_tiny_tokenizer(tmp_path)
    with pytest.raises(ValueError, match="has 384 tokens, more than the model's vocab_size 300"):
        TextLMAdapter(tmp_path, {"vocab_size": 300, "max_position_embeddings": 64})
