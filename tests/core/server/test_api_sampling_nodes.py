"""One OpenAI-shaped request sets every sampling node: OpenAI's fields drive the adapter's
``sampling_node``, ``sampling.nodes`` any node by name, and one reported seed reproduces
every node's draws."""

from __future__ import annotations

import pytest
from mstar.api.errors import ApiError
from mstar.api.protocol import ChatCompletionRequest
from mstar.api.sampling import node_seed, request_sampling, resolve_sampling
from mstar.model.spec import NodeSamplers
from mstar.sampling import SamplingParams

DECLS = {
    "thinker": NodeSamplers(vocab_size=10, main=SamplingParams(temperature=0.7, max_tokens=64)),
    "talker": NodeSamplers(
        vocab_size=10,
        main=SamplingParams(temperature=0.9, top_k=50, max_tokens=512),
        aux={"code_predictor": SamplingParams(temperature=1.0, top_k=50, top_p=0.8)},
    ),
}


def resolve(**fields):
    req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}], **fields)
    return resolve_sampling(DECLS, "thinker", request_sampling(req, max_tokens=("max_tokens", req.max_tokens)))


def test_each_node_and_label_takes_its_own_fields_over_the_defaults():
    configs, _ = resolve(
        temperature=0, max_tokens=5,
        sampling={"nodes": {"talker": {"temperature": 0.5, "max_tokens": 30, "aux": {"code_predictor": {"top_k": 7}}}}},
    )
    assert configs["thinker"]["main"]["temperature"] == 0 and configs["thinker"]["main"]["max_tokens"] == 5
    talker = configs["talker"]
    assert (talker["main"]["temperature"], talker["main"]["top_k"], talker["main"]["max_tokens"]) == (0.5, 50, 30)
    assert (talker["aux"]["code_predictor"]["top_k"], talker["aux"]["code_predictor"]["top_p"]) == (7, 0.8)


def test_openai_fields_win_over_the_same_nodes_entry():
    configs, _ = resolve(temperature=0.3, sampling={"top_k": 4, "nodes": {"thinker": {"temperature": 1.5, "top_k": 9, "top_p": 0.5}}})
    main = configs["thinker"]["main"]
    assert (main["temperature"], main["top_k"], main["top_p"]) == (0.3, 4, 0.5)


def test_one_seed_reproduces_every_node():
    a, seeds = resolve(seed=7)
    assert seeds["thinker"] == 7 and seeds["talker"] == node_seed(7, "talker") != 7
    assert a["talker"]["main"]["seed"] == node_seed(7, "talker")
    assert a["talker"]["aux"]["code_predictor"]["seed"] is not None
    assert resolve(seed=7)[0] == a and resolve(seed=8)[0]["talker"] != a["talker"]
    # Unseeded: the reported (fresh) seed, sent back, gives the same configs.
    fresh, fresh_seeds = resolve()
    assert resolve(seed=fresh_seeds["thinker"])[0] == fresh
    # A node's own seed wins.
    own, own_seeds = resolve(seed=7, sampling={"nodes": {"talker": {"seed": 3}}})
    assert own_seeds["talker"] == 3 and own["talker"]["main"]["seed"] == 3


@pytest.mark.parametrize(
    ("sampling", "param", "code"),
    [
        ({"nodes": {"vocoder": {"temperature": 1}}}, "sampling.nodes.vocoder", "unknown_sampling_node"),
        ({"nodes": {"talker": {"aux": {"residual": {}}}}}, "sampling.nodes.talker.aux", "unknown_sampler_label"),
        ({"nodes": {"talker": {"aux": {"code_predictor": {"top_p": 2}}}}}, "sampling.nodes.talker.aux.code_predictor.top_p", "invalid_value"),
        ({"nodes": {"talker": {"temperature": -1}}}, "sampling.nodes.talker.temperature", "invalid_value"),
        ({"nodes": {"talker": {"tempurature": 1}}}, "sampling.nodes.talker.tempurature", "invalid_value"),
        ({"nodes": {"thinker": {"top_p": 0}}}, "sampling.nodes.thinker.top_p", "invalid_value"),
        ({"nodes": {"talker": {"aux": {"code_predictor": 3}}}}, "sampling.nodes.talker.aux", "invalid_value"),
        ({"aux": {"code_predictor": {}}}, "sampling.aux", "unknown_sampler_label"),  # the thinker has no aux
    ],
)
def test_errors_name_the_node_label_and_field(sampling, param, code):
    with pytest.raises(ApiError) as err:
        resolve(sampling=sampling)
    assert (err.value.status, err.value.param, err.value.code) == (400, param, code)
    if code == "unknown_sampling_node":
        assert "talker" in err.value.message and "thinker" in err.value.message
