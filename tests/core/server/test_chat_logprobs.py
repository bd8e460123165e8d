"""Chat logprobs in the API process: pairing tokens with their logprob signals, rendering
OpenAI's shape, and request validation."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from mstar.api.adapter import ApiAdapter
from mstar.api.errors import ApiError
from mstar.api.protocol import ChatCompletionRequest
from mstar.server.logprobs import MIN_LOGPROB, LogprobAssembler, logprob_signals
from mstar.server.routes_chat import check_chat_request


class Adapter(ApiAdapter):
    endpoints = frozenset({"chat"})
    text_signal = "token"
    supports_logprobs = True
    logprob_signal = "lp"
    top_logprob_ids_signal = "top_ids"
    top_logprob_values_signal = "top_values"


def test_signals_requested():
    assert logprob_signals(Adapter(), 0) == ["lp"]
    assert logprob_signals(Adapter(), 2) == ["lp", "top_ids", "top_values"]


def test_pairs_in_order_across_batches_and_keeps_a_prefix_of_the_top():
    lp = LogprobAssembler(Adapter(), 2)
    lp.add_tokens(torch.tensor([72]))
    assert lp.add("lp", torch.tensor([-0.5]))
    assert lp.take() == []  # its alternatives are not here yet
    assert lp.add("top_ids", torch.tensor([72, 105, 33]))  # the sampler's width is 3
    assert lp.add("top_values", torch.tensor([-0.5, -1.0, float("-inf")]))
    assert not lp.add("audio", torch.zeros(3))
    first = lp.take()
    assert first == [{
        "token": "H", "logprob": -0.5, "bytes": [72],
        "top_logprobs": [{"token": "H", "logprob": -0.5, "bytes": [72]}, {"token": "i", "logprob": -1.0, "bytes": [105]}],
    }]
    lp.add("lp", torch.tensor([float("-inf")]))  # its token was never shown (a stop string): stays unpaired
    lp.add("top_ids", torch.tensor([1, 2]))
    lp.add("top_values", torch.tensor([-1.0, -2.0]))
    assert lp.take() == [] and lp.content == first
    lp.add_tokens(torch.tensor([7]))
    assert lp.take()[0]["logprob"] == MIN_LOGPROB


def test_no_top_logprobs_gives_empty_alternatives():
    lp = LogprobAssembler(Adapter(), 0)
    lp.add_tokens(torch.tensor([65, 66]))  # one value holding two tokens
    lp.add("lp", torch.tensor([-0.1, -0.2]))
    lp.add("top_ids", torch.tensor([[65], [66]]))  # asked by another request: ignored
    assert [(e["token"], e["top_logprobs"]) for e in lp.take()] == [("A", []), ("B", [])]


def rt(adapter: ApiAdapter) -> SimpleNamespace:
    return SimpleNamespace(adapter=adapter, model_name="m", check_model=lambda name: None)


@pytest.mark.parametrize(
    ("fields", "param"),
    [({"logprobs": True, "top_logprobs": 21}, "top_logprobs"), ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
     ({"top_logprobs": 3}, "top_logprobs"), ({"logprobs": False, "top_logprobs": 1}, "top_logprobs")],
)
def test_bad_logprob_requests(fields, param):
    req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}], **fields)
    with pytest.raises(ApiError) as err:
        check_chat_request(rt(Adapter()), req)
    assert err.value.status == 400 and err.value.param == param


def test_logprobs_need_a_model_that_provides_them():
    req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}], logprobs=True)
    check_chat_request(rt(Adapter()), req)
    for top in (0, 20):
        check_chat_request(rt(Adapter()), req.model_copy(update={"top_logprobs": top}))
    plain = Adapter()
    plain.supports_logprobs = False
    with pytest.raises(ApiError) as err:
        check_chat_request(rt(plain), req)
    assert err.value.param == "logprobs"
