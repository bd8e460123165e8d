from __future__ import annotations

import pytest
from mstar.api.errors import ApiError
from mstar.api.protocol import ChatCompletionRequest
from mstar.api.sampling import request_sampling, resolve_sampling
from mstar.model.spec import NodeSamplers
from mstar.sampling import SamplingParams

DECLS = {
    "lm": NodeSamplers(
        vocab_size=10,
        main=SamplingParams(temperature=0.8, max_tokens=64),
        aux={"residual": SamplingParams(temperature=1.0, top_k=8)},
    )
}


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}], **fields)


def resolve(req: ChatCompletionRequest, name: str = "max_tokens"):
    return resolve_sampling(DECLS, "lm", request_sampling(req, max_tokens=(name, getattr(req, name))))


def test_openai_fields_override_defaults_and_seed_is_resolved():
    configs, seeds = resolve(chat(temperature=0, max_tokens=5, stop="END"))
    main = configs["lm"]["main"]
    assert main["temperature"] == 0 and main["max_tokens"] == 5 and main["stop"] == ["END"]
    assert main["seed"] == seeds["lm"] and isinstance(seeds["lm"], int)
    assert configs["lm"]["aux"]["residual"]["top_k"] == 8 and configs["lm"]["aux"]["residual"]["seed"] is not None


def test_explicit_seed_reproduces_aux_seed():
    a, _ = resolve(chat(seed=42))
    b, _ = resolve(chat(seed=42))
    assert a == b and a["lm"]["main"]["seed"] == 42


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
        ({"sampling": {"aux": {"residual": {"top_p": 2}}}}, "sampling.aux.residual.top_p"),
        ({"sampling": {"top_k": -5}}, "sampling.top_k"),
        ({"sampling": {"tempurature": 1}}, "sampling.tempurature"),
    ],
)
def test_invalid_values_name_the_field(fields, param):
    name = "max_completion_tokens" if "max_completion_tokens" in fields else "max_tokens"
    with pytest.raises(ApiError) as err:
        resolve(chat(**fields), name)
    assert err.value.status == 400 and err.value.param == param


def test_unknown_aux_label_is_rejected():
    with pytest.raises(ApiError) as err:
        resolve(chat(sampling={"aux": {"bogus": {}}}))
    assert err.value.param == "sampling.aux" and "bogus" in err.value.message


def test_native_sampling_forms():
    flat, _ = resolve_sampling(DECLS, None, {"temperature": 0.5, "seed": 1})
    nested, _ = resolve_sampling(DECLS, None, {"lm": {"main": {"temperature": 0.5, "seed": 1}}})
    assert flat == nested
    with pytest.raises(ApiError) as err:  # read as a main-sampler field of the one sampler
        resolve_sampling(DECLS, None, {"decoder": {"temperature": 1}})
    assert err.value.param == "sampling.decoder"
    two = {**DECLS, "talker": DECLS["lm"]}
    with pytest.raises(ApiError, match="do not sample"):
        resolve_sampling(two, None, {"decoder": {"temperature": 1}})
