"""SamplingParams validation: bad values are rejected with the field named."""

import pytest
from mstar.sampling import MAX_SEED, SamplingParams
from pydantic import ValidationError


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -1.0),
        ("temperature", float("nan")),
        ("temperature", float("inf")),
        ("top_k", -5),
        ("top_k", -2),
        ("top_k", 2.5),
        ("top_k", True),
        ("top_p", 0.0),
        ("top_p", 1.01),
        ("min_p", -0.1),
        ("min_p", 1.5),
        ("repetition_penalty", 0.0),
        ("repetition_penalty", -1.0),
        ("presence_penalty", 2.5),
        ("presence_penalty", -2.01),
        ("frequency_penalty", 3.0),
        ("frequency_penalty", -3.0),
        ("seed", -1),
        ("seed", MAX_SEED + 1),
        ("max_tokens", 0),
        ("min_tokens", -1),
        ("stop_token_ids", [1, -2]),
        ("top_logprobs", 21),
        ("top_logprobs", -1),
        ("logprobs", "maybe"),
    ],
)
def test_out_of_range_value_names_field(field, value):
    kwargs = {field: value}
    if field == "top_logprobs":
        kwargs["logprobs"] = True
    with pytest.raises(ValidationError) as info:
        SamplingParams(**kwargs)
    errors = info.value.errors()
    assert len(errors) == 1
    assert errors[0]["loc"][0] == field


def test_misspelled_field_is_named():
    with pytest.raises(ValidationError) as info:
        SamplingParams(temprature=0.5)
    assert info.value.errors()[0]["loc"] == ("temprature",)
    assert info.value.errors()[0]["type"] == "extra_forbidden"


def test_cross_field_errors_name_fields():
    with pytest.raises(ValidationError, match="min_tokens .* max_tokens"):
        SamplingParams(min_tokens=5, max_tokens=4)
    with pytest.raises(ValidationError, match="top_logprobs requires logprobs"):
        SamplingParams(top_logprobs=3)


def test_defaults_and_boundary_values_accepted():
    p = SamplingParams()
    assert (p.temperature, p.top_k, p.top_p, p.min_p) == (1.0, -1, 1.0, 0.0)
    assert p.seed is None and p.max_tokens == 16 and not p.uses_penalties
    edge = SamplingParams(
        temperature=0.0, top_k=0, top_p=1.0, min_p=1.0, presence_penalty=-2.0,
        frequency_penalty=2.0, seed=MAX_SEED, max_tokens=1, min_tokens=1,
        logprobs=True, top_logprobs=20,
    )
    assert edge.is_greedy and edge.uses_penalties and not edge.uses_top_k_or_p
    assert SamplingParams(stop="###").stop == ("###",)


def test_frozen():
    p = SamplingParams()
    with pytest.raises(ValidationError):
        p.temperature = 0.3  # type: ignore[misc]


def test_override_keeps_defaults_and_validates():
    defaults = SamplingParams(temperature=0.7, top_k=50)
    request = SamplingParams(top_p=0.9)
    merged = defaults.override(request)
    assert (merged.temperature, merged.top_k, merged.top_p) == (0.7, 50, 0.9)
    assert merged.override(request) == merged  # idempotent
    assert defaults.override({"temperature": 0.1}).temperature == 0.1
    with pytest.raises(ValidationError) as info:
        defaults.override({"top_p": 0})
    assert info.value.errors()[0]["loc"] == ("top_p",)


def test_min_tokens_stop_ids():
    p = SamplingParams(stop_token_ids=[7, 3])
    assert p.min_tokens_stop_ids([2]) == [2, 3, 7]
    assert p.override({"ignore_eos": True}).min_tokens_stop_ids([2]) == [3, 7]
