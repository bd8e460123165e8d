"""Qwen3-Omni from its tiny checkpoint rewritten into each layout releases use
(``mstar.testing.release_layouts``):

- ``release``: as ``Qwen/Qwen3-Omni-30B-A3B-Instruct`` ships it: the template only in
  ``chat_template.json``, the tokenizer as ``vocab.json`` + ``merges.txt``, a
  ``generation_config.json`` naming no end id, ``torch_dtype``, sharded weights;
- ``transformers5``: as transformers 5 saves it: ``chat_template.jinja``, preprocessing configs
  nested in ``processor_config.json``, ``dtype``;
- ``tokenizer_template``: the template in ``tokenizer_config.json``, no ``generation_config.json``.

In each: the serve warm-up's own path (``load_adapter``, the adapter's warm-up request,
``chat_inputs``, the engine) succeeds, and a text chat equals transformers'
``Qwen3OmniMoeForConditionalGeneration.generate`` greedy, token for token, stopping where it
stops (the checkpoint's Thinker is steered to say ``<|im_end|>`` after a few tokens, and
transformers stops there by its own default end id), and an image + audio chat gives the
prompt and processor tensors of the written layout. On the ``release`` layout a spoken
answer stops there too, with the same text, codec frames and audio as
``generate(return_audio=True)``. ``test_qwen3omni_server.py`` serves the ``release`` layout
over HTTP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from mstar import Engine
from mstar.api.protocol import ChatCompletionRequest
from mstar.testing.release_layouts import variant_copy
from thinker_reference import IM_END, RELEASE, end_answer_at, reference_prompt

VARIANTS = {
    "release": RELEASE,
    "transformers5": ("template_in_chat_template_jinja", "processor_configs_nested", "dtype_key"),
    "tokenizer_template": ("template_in_tokenizer_config", "without_generation_config"),
}
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello! How are you today?"}]
MAX_TOKENS, END_STEP = 12, 4
WAVE_TOL = 1e-5
SPEECH = {"modalities": ["text", "audio"], "voice": "Chelsie"}
GREEDY_SPEECH = {
    "thinker": {"temperature": 0, "max_tokens": MAX_TOKENS},
    "talker": {"main": {"temperature": 0, "max_tokens": 20, "min_tokens": 8}, "aux": {"code_predictor": {"temperature": 0}}},
}


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The plugin's tiny checkpoint, its Thinker steered to end the chat's answer early."""
    from mstar_qwen3omni.tiny_checkpoint import write_checkpoint

    root = write_checkpoint(tmp_path_factory.mktemp("qwen3omni-written"))
    end_answer_at(root, reference_prompt(root, MESSAGES), END_STEP)
    return root


@pytest.fixture(scope="module")
def reference(written: Path) -> Any:
    from transformers import Qwen3OmniMoeForConditionalGeneration

    return Qwen3OmniMoeForConditionalGeneration.from_pretrained(str(written), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def reference_text(written: Path, reference: Any) -> list[int]:
    """transformers' greedy answer with its defaults (``thinker_eos_token_id=151645``)."""
    ids = torch.tensor([reference_prompt(written, MESSAGES)])
    with torch.no_grad():
        out = reference.generate(input_ids=ids, attention_mask=torch.ones_like(ids), return_audio=False,
                                 thinker_max_new_tokens=MAX_TOKENS, thinker_do_sample=False)
    text = out[0, ids.shape[1]:].tolist()
    assert 2 <= len(text) < MAX_TOKENS and text[-1] == IM_END, text  # it does stop early, at <|im_end|>
    return text


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant(request: pytest.FixtureRequest, written: Path, tmp_path_factory: pytest.TempPathFactory):
    root = variant_copy(written, tmp_path_factory.mktemp(f"qwen3omni-{request.param}"), *VARIANTS[request.param])
    engine = Engine.from_model("qwen3omni", weights=root)
    yield request.param, root, engine
    engine.close()


def test_warm_up_and_text_chat_equal_transformers(variant, written, reference_text) -> None:
    from mstar.server.preprocess import load_adapter

    name, root, engine = variant
    _, adapter = load_adapter("qwen3omni", root)  # as `mstar serve` builds it
    warm = adapter.chat_inputs(adapter.warmup_request())
    out = engine.run_batch([{"inputs": warm.inputs, "kwargs": warm.kwargs, "sampling": {"thinker": {"temperature": 0, "max_tokens": 2}}}])[0]
    assert out.error is None, out.error
    chat = adapter.chat_inputs(ChatCompletionRequest(model="qwen3omni", messages=MESSAGES))
    assert chat.inputs["prompt_ids"].tolist() == reference_prompt(root, MESSAGES) == reference_prompt(written, MESSAGES)
    out = engine.run_batch([{"inputs": chat.inputs, "kwargs": chat.kwargs,
                             "sampling": {"thinker": {"temperature": 0, "max_tokens": MAX_TOKENS}}}])[0]
    assert out.error is None, out.error
    assert out.cat("tokens").tolist() == reference_text[:-1], name  # the end token is withheld
    assert out.finish_reason == "stop"


def test_media_chat_is_the_written_layouts(variant, written) -> None:
    """An image + audio chat gives the prompt ids and processor tensors it gives on the written
    layout (which test_processing.py checks against transformers' processor): the image,
    video and audio configs are read wherever the layout keeps them."""
    import base64

    from mstar.server.preprocess import load_adapter

    name, root, _ = variant
    fixtures = Path(__file__).parent / "fixtures" / "processor"
    image = "data:image/png;base64," + base64.b64encode((fixtures / "a.png").read_bytes()).decode()
    audio = base64.b64encode((fixtures / "tone.wav").read_bytes()).decode()
    content = [{"type": "image_url", "image_url": {"url": image}}, {"type": "input_audio", "input_audio": {"data": audio, "format": "wav"}},
               {"type": "text", "text": "What is this?"}]
    request = ChatCompletionRequest(model="qwen3omni", messages=[{"role": "user", "content": content}])
    got = load_adapter("qwen3omni", root)[1].chat_inputs(request)
    want = load_adapter("qwen3omni", written)[1].chat_inputs(request)
    assert got.kwargs == want.kwargs and set(got.inputs) == set(want.inputs), name
    for key, value in want.inputs.items():
        assert torch.equal(got.inputs[key], value), (name, key)


@pytest.mark.parametrize("variant", ["release"], indirect=True)
def test_spoken_answer_stops_at_im_end_like_transformers(variant, written, reference, reference_text) -> None:
    _, _, engine = variant
    prompt = reference_prompt(written, MESSAGES)
    seen: list[torch.Tensor] = []
    decode = reference.code2wav.chunked_decode

    def spy(codes: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        seen.append(codes.clone())
        return decode(codes, *args, **kwargs)

    reference.code2wav.chunked_decode = spy
    try:
        ids = torch.tensor([prompt])
        with torch.no_grad():  # transformers' defaults but for greedy on both levels
            seq, wave = reference.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), return_audio=True, speaker="Chelsie",
                thinker_max_new_tokens=MAX_TOKENS, thinker_do_sample=False, talker_do_sample=False,
                talker_max_new_tokens=20, talker_min_new_tokens=8,
            )
    finally:
        del reference.code2wav.chunked_decode
    assert seq[0, len(prompt):].tolist() == reference_text  # stopped at <|im_end|>
    codes = seen[0][0].T
    out = engine.run_batch([{"inputs": {"prompt_ids": torch.tensor(prompt)}, "sampling": GREEDY_SPEECH, "kwargs": SPEECH}])[0]
    assert out.error is None, out.error
    assert out.cat("tokens").tolist() == reference_text[:-1]
    assert torch.equal(torch.cat(out.signals["codes"]), codes)
    audio, wave = out.cat("audio"), wave.reshape(-1)
    assert audio.shape == wave.shape and (audio - wave).abs().max().item() < WAVE_TOL
