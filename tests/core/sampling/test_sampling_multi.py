"""Main + auxiliary samplers: labels, defaults, seeds and the bound batch handle."""

import pytest
import torch
from mstar.model.spec import NodeSamplers
from mstar.sampling import (
    MAIN_LABEL,
    MAX_SEED,
    MultiSampler,
    MultiSamplingConfig,
    SamplingParams,
    SamplingTensors,
    UnknownSamplerLabelError,
    derive_seed,
)
from mstar.sampling.resolve import resolve_node
from sampling_helpers import Sampler

MAIN_DEFAULTS = SamplingParams(temperature=0.7, top_k=50, max_tokens=256)
AUX_DEFAULTS = {
    "talker": SamplingParams(temperature=0.9, top_k=3),
    "code": SamplingParams(temperature=0.0),
}
VOCABS = {MAIN_LABEL: 40, "talker": 24, "code": 11}


def make_sampler(max_slots: int = 4) -> MultiSampler:
    return MultiSampler({MAIN_LABEL: MAIN_DEFAULTS, **AUX_DEFAULTS}, VOCABS, max_slots)


DECL = NodeSamplers(vocab_size=VOCABS[MAIN_LABEL], main=MAIN_DEFAULTS, aux=AUX_DEFAULTS)


def resolved(given) -> MultiSamplingConfig:
    """A request's config as the engine hands it to the sampler (mstar.sampling.resolve)."""
    return resolve_node(DECL, given)[0]


def test_with_defaults_request_values_override_plugin_defaults():
    cfg = MultiSamplingConfig.with_defaults(
        MAIN_DEFAULTS,
        AUX_DEFAULTS,
        {"main": {"temperature": 0.2, "seed": 7}, "aux": {"talker": {"top_p": 0.5}}},
    )
    assert (cfg.main.temperature, cfg.main.top_k, cfg.main.max_tokens) == (0.2, 50, 256)
    assert cfg.main.seed == 7
    assert set(cfg.aux) == {"talker", "code"}
    assert (cfg.aux["talker"].temperature, cfg.aux["talker"].top_k) == (0.9, 3)
    assert cfg.aux["talker"].top_p == 0.5
    assert cfg.aux["code"] == AUX_DEFAULTS["code"]
    assert MultiSamplingConfig.with_defaults(MAIN_DEFAULTS, AUX_DEFAULTS).main == MAIN_DEFAULTS


def test_unknown_label_is_rejected_with_its_name():
    bad = MultiSamplingConfig(aux={"talkr": SamplingParams()})
    with pytest.raises(UnknownSamplerLabelError) as info:
        bad.validate_labels(frozenset(AUX_DEFAULTS))
    msg = str(info.value)
    assert "'talkr'" in msg and "'talker'" in msg and "'code'" in msg
    assert isinstance(info.value, ValueError)
    with pytest.raises(UnknownSamplerLabelError, match="talkr"):
        MultiSamplingConfig.with_defaults(MAIN_DEFAULTS, AUX_DEFAULTS, bad)
    with pytest.raises(UnknownSamplerLabelError, match="talkr"):
        make_sampler().add_request(0, bad.resolve_seeds()[0])
    with pytest.raises(UnknownSamplerLabelError, match="nope"):
        make_sampler().sample_aux("nope", torch.zeros(1, 5), torch.tensor([0]))
    # The main label is reserved and never an aux label.
    with pytest.raises(UnknownSamplerLabelError, match="'main'"):
        MultiSamplingConfig(aux={MAIN_LABEL: SamplingParams()}).validate_labels(
            frozenset({MAIN_LABEL, "talker"})
        )


def test_bad_nested_values_name_the_field():
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as info:
        MultiSamplingConfig.model_validate({"aux": {"talker": {"top_p": 0}}})
    assert info.value.errors()[0]["loc"] == ("aux", "talker", "top_p")


def test_plugin_defaults_may_not_fix_a_seed():
    with pytest.raises(ValueError, match="seed"):
        MultiSamplingConfig.with_defaults(MAIN_DEFAULTS, {"talker": SamplingParams(seed=42)})
    with pytest.raises(ValueError, match="seed"):
        MultiSampler({MAIN_LABEL: SamplingParams(seed=42)}, {MAIN_LABEL: 8}, 2)


def test_seedless_configs_get_distinct_fresh_seeds():
    cfg = MultiSamplingConfig.with_defaults(MAIN_DEFAULTS, AUX_DEFAULTS)
    seeds = set()
    for _ in range(20):
        resolved, seed = cfg.resolve_seeds()
        assert resolved.main.seed == seed and 0 <= seed <= MAX_SEED
        assert resolved.aux["talker"].seed == derive_seed(seed, "talker")
        seeds.add(seed)
    assert len(seeds) == 20


def test_explicit_seeds_are_kept_and_aux_seeds_derive():
    cfg = MultiSamplingConfig.with_defaults(
        MAIN_DEFAULTS, AUX_DEFAULTS, {"main": {"seed": 1234}, "aux": {"code": {"seed": 5}}}
    )
    resolved, seed = cfg.resolve_seeds()
    assert seed == 1234 and resolved.main.seed == 1234
    assert resolved.aux["code"].seed == 5
    talker = resolved.aux["talker"].seed
    assert talker == derive_seed(1234, "talker") != derive_seed(1234, "code")
    assert derive_seed(1235, "talker") != talker
    # Golden values: the derivation is part of the reproducibility contract.
    assert derive_seed(1234, "talker") == 7126863971289818473
    assert derive_seed(0, "code_predictor") == 3127273682038665954


def test_labels_sample_with_their_own_params_seeds_and_vocab():
    ms = make_sampler()
    cfg, seed = MultiSamplingConfig.with_defaults(
        MAIN_DEFAULTS, AUX_DEFAULTS, {"main": {"seed": 99}}
    ).resolve_seeds()
    ms.add_request(2, cfg)
    gen = torch.Generator().manual_seed(0)
    slot = torch.tensor([2])
    talker_logits = torch.randn(30, 1, 24, generator=gen)
    code_logits = torch.randn(30, 1, 11, generator=gen)
    talker = [ms.sample_aux("talker", x, slot).tokens.item() for x in talker_logits]
    code = [ms.sample_aux("code", x, slot).tokens.item() for x in code_logits]

    # "code" is greedy: argmax of its own logits.
    assert code == [int(x.argmax()) for x in code_logits]
    # "talker" draws with top_k=3 at T=0.9 from the stream of its derived seed.
    st = SamplingTensors.from_rows(
        [AUX_DEFAULTS["talker"]] * 30, [derive_seed(seed, "talker")] * 30, range(30)
    )
    assert talker == Sampler().sample(talker_logits[:, 0], st).tokens.tolist()
    assert all(t in x[0].topk(3).indices.tolist() for t, x in zip(talker, talker_logits, strict=True))
    assert len(set(talker)) > 1
    steps = {label: s.step_counters[2].item() for label, s in ms.samplers.items()}
    assert steps == {MAIN_LABEL: 0, "talker": 30, "code": 30}


def test_reported_seed_reproduces_all_draws():
    def run(config):
        ms = make_sampler()
        resolved, seed = config.resolve_seeds()
        ms.add_request(0, resolved, prompt_ids=[1, 2])
        gen = torch.Generator().manual_seed(1)
        bs = ms.bind(torch.tensor([0]))
        toks = []
        for _ in range(10):
            toks.append(bs.sample(torch.randn(1, 40, generator=gen)).tokens.item())
            toks.append(bs.sample_aux("talker", torch.randn(1, 24, generator=gen)).tokens.item())
        return toks, seed

    base = MultiSamplingConfig.with_defaults(
        MAIN_DEFAULTS.override({"top_k": -1}), {**AUX_DEFAULTS, "talker": SamplingParams(temperature=1.5)}
    )
    a, seed_a = run(base)
    b, seed_b = run(base)
    assert seed_a != seed_b and a != b  # fresh randomness per request
    again, seed = run(base.model_copy(update={"main": base.main.override({"seed": seed_a})}))
    assert seed == seed_a and again == a


def test_add_request_requires_resolved_seed_and_rolls_back_on_error():
    ms = make_sampler()
    with pytest.raises(ValueError, match="not resolved"):
        ms.add_request(0, MultiSamplingConfig.with_defaults(MAIN_DEFAULTS, AUX_DEFAULTS))  # no seeds
    with pytest.raises(ValueError, match="not resolved"):
        ms.add_request(0, MultiSamplingConfig().resolve_seeds()[0])  # aux labels missing
    cfg = resolved(None)
    # Aux prompt ids outside the aux vocab: nothing may stay registered.
    with pytest.raises(ValueError, match="token ids"):
        ms.add_request(0, cfg, prompt_ids={"talker": [100]})
    assert all(not s.active_slots for s in ms.samplers.values())
    ms.add_request(0, cfg)
    assert all(s.active_slots == {0} for s in ms.samplers.values())
    ms.remove_request(0)
    assert all(not s.active_slots for s in ms.samplers.values())


def test_unmentioned_fields_fall_back_to_plugin_defaults():
    ms = make_sampler()
    raw = MultiSamplingConfig(main=SamplingParams(seed=3), aux={"code": SamplingParams(top_k=2)})
    ms.add_request(1, resolved(raw.model_dump(exclude_unset=True)))
    main = ms.samplers[MAIN_LABEL]
    assert main._temperature[1].item() == pytest.approx(0.7)  # plugin default
    assert main._top_k[1].item() == 50
    code = ms.samplers["code"]
    assert code._temperature[1].item() == 0.0 and code._top_k[1].item() == 2


def test_batch_sampler_binding_and_advance():
    ms = make_sampler()
    for slot in (0, 3):
        ms.add_request(slot, resolved({"main": {"seed": slot}}))
    bs = ms.bind(torch.tensor([3, 0]), advance=torch.tensor([True, False]))
    assert bs.labels == {MAIN_LABEL, "talker", "code"}
    assert bs.sample(torch.randn(2, 40)).tokens.shape == (2,)
    assert bs.sample_aux("code", torch.randn(2, 11)).tokens.shape == (2,)
    assert ms.samplers[MAIN_LABEL].step_counters.tolist() == [0, 0, 0, 1]
    assert ms.samplers["code"].step_counters.tolist() == [0, 0, 0, 1]
    sub = bs.subset(torch.tensor([True, False]))
    sub.sample_aux("talker", torch.randn(1, 24))
    assert ms.samplers["talker"].step_counters.tolist() == [0, 0, 0, 1]


def test_batch_sampler_records_last_main_tokens():
    ms = make_sampler()
    for slot in (0, 1, 3):
        ms.add_request(slot, resolved({"main": {"seed": slot + 10}}))
    bs = ms.bind(torch.tensor([3, 0, 1]))
    assert bs.last_main_tokens is None
    # Aux draws are not main tokens.
    bs.sample_aux("code", torch.randn(3, 11))
    assert bs.last_main_tokens is None
    logits = torch.randn(3, 40)
    logits[:, 7] = 1e4  # every row must draw 7 under top_k=50, T=0.7
    out = bs.sample(logits)
    assert bs.last_main_tokens.tolist() == out.tokens.tolist() == [7, 7, 7]
    # A subset's draws land in the parent's rows; rows nobody drew for hold -1.
    bs2 = ms.bind(torch.tensor([3, 0, 1]))
    sub = bs2.subset(torch.tensor([2, 0]))
    logits = torch.full((2, 40), -1e4)
    logits[0, 5] = logits[1, 9] = 0.0
    assert sub.sample(logits).tokens.tolist() == [5, 9]
    assert sub.last_main_tokens.tolist() == [5, 9]
    assert bs2.last_main_tokens.tolist() == [9, -1, 5]
    sub.subset(torch.tensor([0])).sample(logits[:1])
    assert bs2.last_main_tokens.tolist() == [9, -1, 5]
