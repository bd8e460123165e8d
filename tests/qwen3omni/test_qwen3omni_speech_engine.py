"""Speech out end to end through ``mstar.Engine``: Thinker -> Talker (+ code predictor) ->
Code2Wav on the plugin's tiny checkpoint with ``thinker.*``, ``talker.*`` and ``code2wav.*``
(written by transformers' own ``save_pretrained``), against transformers 5.24's
``Qwen3OmniMoeForConditionalGeneration.generate(..., return_audio=True)`` on the same files,
greedy on both levels: text ids and codec codes exactly equal, the waveform within float
tolerance, for text, image and audio inputs (our encoders run: the engine gets the
processor's tensors). Also: the engine's streamed audio equals one whole Code2Wav decode of
its codes, a seeded sampled speech request is identical alone and in a batch, a text-only
request never runs the Talker, and Thinker / Talker / Code2Wav in three engines (streams
crossing between them as the server forwards them) equal one engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from mstar import Engine
from thinker_reference import make_cases

WAVE_TOL = 1e-5
THINKER_TOKENS, TALKER_FRAMES, MIN_FRAMES = 8, 20, 8
GREEDY = {
    "thinker": {"temperature": 0, "max_tokens": THINKER_TOKENS},
    # transformers' Talker defaults keep repetition_penalty 1.05 under greedy, and so do we;
    # min frames (codec EOS suppressed before, both sides) so every case speaks past the text
    "talker": {"main": {"temperature": 0, "max_tokens": TALKER_FRAMES, "min_tokens": MIN_FRAMES},
               "aux": {"code_predictor": {"temperature": 0}}},
}
SPEECH = {"modalities": ["text", "audio"], "voice": "Chelsie"}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mstar_qwen3omni.tiny_checkpoint import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("qwen3omni-speech"))


@pytest.fixture(scope="module")
def engine(ckpt: Path):
    e = Engine.from_model("qwen3omni", weights=ckpt)
    yield e
    e.close()


@pytest.fixture(scope="module")
def reference(ckpt: Path) -> Any:
    from transformers import Qwen3OmniMoeForConditionalGeneration

    return Qwen3OmniMoeForConditionalGeneration.from_pretrained(str(ckpt), dtype=torch.float32).eval()


def hf_speech(model: Any, prompt: list[int], hf_inputs: dict[str, Any]) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """(generated text ids, codes [T, G], waveform [n]) from generate(return_audio=True)."""
    seen: list[torch.Tensor] = []
    decode = model.code2wav.chunked_decode

    def spy(codes: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        seen.append(codes.clone())
        return decode(codes, *args, **kwargs)

    model.code2wav.chunked_decode = spy
    try:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            seq, wav = model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), return_audio=True, speaker="Chelsie",
                thinker_max_new_tokens=THINKER_TOKENS, thinker_do_sample=False, talker_do_sample=False,
                talker_max_new_tokens=TALKER_FRAMES, talker_min_new_tokens=MIN_FRAMES, **hf_inputs,
            )
    finally:
        del model.code2wav.chunked_decode
    return seq[0, len(prompt):].tolist(), seen[0][0].T, wav.reshape(-1)


def engine_inputs(prompt: list[int], hf_inputs: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    media = [k for k, key in (("audio", "input_features"), ("image", "pixel_values")) if key in hf_inputs]
    return {"prompt_ids": torch.tensor(prompt), **hf_inputs}, {**SPEECH, "media": media}


@pytest.mark.parametrize("case", ["text", "image", "audio"])
def test_speech_equals_generate_return_audio(case, ckpt, engine, reference):
    c = make_cases(ckpt)[case]
    text, codes, wave = hf_speech(reference, c.prompt, c.hf_inputs)
    # past the Thinker's text (steps 0..5 read it, step 6 tts_eos, then tts_pad)
    assert codes.shape[0] > THINKER_TOKENS, "the Talker stopped with the text: the comparison would be weak"
    inputs, kwargs = engine_inputs(c.prompt, c.hf_inputs)
    out = engine.run_batch([{"inputs": inputs, "sampling": GREEDY, "kwargs": kwargs}])[0]
    assert out.error is None, out.error
    assert out.cat("tokens").tolist() == text
    ours = torch.cat(out.signals["codes"])
    assert torch.equal(ours, codes), case
    audio = out.cat("audio")
    err = (audio - wave).abs().max().item()
    print(f"{case}: {len(text)} tokens, {codes.shape[0]} frames, {audio.numel()} samples, max |audio - transformers| = {err:.2e}")
    assert audio.shape == wave.shape and err < WAVE_TOL


def test_streamed_audio_equals_one_whole_decode(ckpt, engine):
    """The engine's audio chunks (a 4-frame first chunk, then 16) joined equal one Code2Wav
    decode of all the frames, and several chunks did arrive."""
    from mstar_qwen3omni.speech_loading import build_code2wav
    from mstar_qwen3omni.tiny_checkpoint import TINY_CODE2WAV  # noqa: F401 (the config under test)

    c = make_cases(ckpt)["text"]
    sampling = {**GREEDY, "talker": {**GREEDY["talker"], "main": {"temperature": 0, "max_tokens": 30, "min_tokens": 29}}}
    out = engine.run_batch([{"inputs": {"prompt_ids": torch.tensor(c.prompt)}, "sampling": sampling, "kwargs": SPEECH}])[0]
    assert out.error is None, out.error
    codes = torch.cat(out.signals["codes"])
    assert codes.shape[0] == 29 and len(out.signals["audio"]) == 3  # 4 + 16 + 9 frames (the 30th, at max_tokens, dropped)
    import json

    code2wav = build_code2wav(json.loads((ckpt / "config.json").read_text()), ckpt, "cpu")
    with torch.no_grad():
        whole = code2wav(codes.T[None]).reshape(-1)
    err = (out.cat("audio") - whole).abs().max().item()
    print(f"streamed vs whole: {codes.shape[0]} frames, max err {err:.2e}")
    assert out.cat("audio").shape == whole.shape and err < 1e-5


SAMPLED = {"thinker": {"temperature": 0.8, "seed": 7, "max_tokens": 6},
           "talker": {"main": {"seed": 11, "max_tokens": 12}, "aux": {"code_predictor": {"seed": 13}}}}


def test_seeded_speech_is_identical_alone_and_in_a_batch(ckpt, engine):
    cases = make_cases(ckpt)
    prompt = torch.tensor(cases["text"].prompt)
    alone = engine.run_batch([{"inputs": {"prompt_ids": prompt}, "sampling": SAMPLED, "kwargs": SPEECH}])[0]
    others = [
        {"inputs": {"prompt_ids": torch.tensor(cases["two_images"].prompt[:5] + cases["text"].prompt[5:])},
         "sampling": {"thinker": {"temperature": 1.0, "max_tokens": 9}}, "kwargs": {"modalities": ["text", "audio"]}},
        {"inputs": {"prompt_ids": prompt[:-4].clone()}, "sampling": {"thinker": {"temperature": 1.0, "max_tokens": 5}}},
    ]
    batch = engine.run_batch([others[0], {"inputs": {"prompt_ids": prompt}, "sampling": SAMPLED, "kwargs": SPEECH}, others[1]])
    together = batch[1]
    assert alone.error is None and together.error is None
    assert together.cat("tokens").tolist() == alone.cat("tokens").tolist()
    assert torch.equal(torch.cat(together.signals["codes"]), torch.cat(alone.signals["codes"]))
    assert torch.equal(together.cat("audio"), alone.cat("audio"))
    # the sampled request is not the greedy one (the seeds did something)
    greedy = engine.run_batch([{"inputs": {"prompt_ids": prompt}, "sampling": GREEDY, "kwargs": SPEECH}])[0]
    assert not torch.equal(torch.cat(greedy.signals["codes"])[:4], torch.cat(alone.signals["codes"])[:4])


def test_chunked_prefill_and_preemption_change_nothing(ckpt, engine):
    """An 8-token budget (the Thinker's prompt rows for the Talker gather over prefill
    chunks) and a Thinker KV pool of about one request (requests preempted, their caches
    recomputed): three spoken requests equal each run alone on the roomy engine."""
    from mstar_qwen3omni.config import TextConfig, load_config

    cases = make_cases(ckpt)
    requests = []
    for name in ("image", "audio", "text"):
        inputs, kwargs = engine_inputs(cases[name].prompt, cases[name].hf_inputs)
        requests.append({"inputs": inputs, "sampling": GREEDY, "kwargs": kwargs})
    alone = [engine.run_batch([r])[0] for r in requests]
    text = TextConfig.from_config(load_config(ckpt))
    per_token = 2 * text.num_layers * text.num_kv_heads * text.head_dim * 4
    longest = max(len(cases[n].prompt) for n in ("image", "audio", "text")) + THINKER_TOKENS
    # the budget is split evenly between the two KV nodes (Thinker, Talker)
    tight = Engine.from_model("qwen3omni", weights=ckpt, max_num_batched_tokens=8, kv_budget_bytes=2 * (longest + 24) * per_token)
    try:
        together = tight.run_batch(requests)
        assert tight.stats()["preemptions"] > 0
    finally:
        tight.close()
    for a, b in zip(alone, together, strict=True):
        assert a.error is None and b.error is None, (a.error, b.error)
        assert b.cat("tokens").tolist() == a.cat("tokens").tolist()
        assert torch.equal(torch.cat(b.signals["codes"]), torch.cat(a.signals["codes"]))
        assert (b.cat("audio") - a.cat("audio")).abs().max().item() < WAVE_TOL


def test_text_only_requests_never_run_the_talker(ckpt, engine):
    prompt = torch.tensor(make_cases(ckpt)["text"].prompt)
    before = dict(engine.core.stats.forwards_by_group)
    out = engine.run_batch([{"inputs": {"prompt_ids": prompt}, "sampling": GREEDY}])[0]
    after = engine.core.stats.forwards_by_group
    assert out.error is None and set(out.signals) == {"tokens"}
    ran = {k for k in after if after[k] != before.get(k, 0)}
    assert ran and all(k.startswith("thinker:") for k in ran), ran
    assert engine.core.nodes["talker"].kv.num_used_blocks == 0


def test_return_logits_gives_one_per_token_of_each_node(ckpt, engine):
    """kwarg return_logits: a logits event per Thinker token and per Talker frame (the
    Thinker's withheld end token, whose fed-back embedding still goes to the Talker, has none)."""
    prompt = torch.tensor(make_cases(ckpt)["text"].prompt)
    first = engine.run_batch([{"inputs": {"prompt_ids": prompt}, "sampling": GREEDY}])[0].cat("tokens").tolist()
    end = first[5]  # made an end token: the Thinker stops there, withholding it
    sampling = {**GREEDY, "thinker": {"temperature": 0, "max_tokens": 30, "stop_token_ids": [end]}}
    out = engine.run_batch([{"inputs": {"prompt_ids": prompt}, "sampling": sampling,
                             "kwargs": {**SPEECH, "return_logits": True}}])[0]
    assert out.error is None, out.error
    assert out.cat("tokens").tolist() == first[: first.index(end)]
    vocab = engine.built.node_samplers["thinker"].vocab_size
    thinker = [x for x in out.signals["logits"] if x.shape[-1] == vocab]
    assert len(thinker) == len(out.cat("tokens")) and len(out.signals["logits"]) - len(thinker) == len(out.signals["codes"])
    assert [int(x.argmax()) for x in thinker] == out.cat("tokens").tolist()


def test_a_thinker_that_ends_at_once_speaks_nothing(ckpt, engine):
    """One Thinker token (its last is never spoken): no frame, no audio, the text intact
    (transformers' generate fails on this input)."""
    prompt = torch.tensor(make_cases(ckpt)["text"].prompt)
    sampling = {**GREEDY, "thinker": {"temperature": 0, "max_tokens": 1}}
    out = engine.run_batch([{"inputs": {"prompt_ids": prompt}, "sampling": sampling, "kwargs": SPEECH}])[0]
    assert out.error is None, out.error
    assert len(out.cat("tokens")) == 1 and "codes" not in out.signals and "audio" not in out.signals


def test_unknown_voice_and_modality_fail_naming_the_valid_ones(ckpt, engine):
    prompt = torch.tensor(make_cases(ckpt)["text"].prompt)
    bad = engine.run_batch([
        {"inputs": {"prompt_ids": prompt}, "sampling": GREEDY, "kwargs": {"modalities": ["text", "audio"], "voice": "Nobody"}},
        {"inputs": {"prompt_ids": prompt}, "sampling": GREEDY, "kwargs": {"modalities": ["smell"]}},
    ])
    assert "unknown voice 'Nobody'" in bad[0].error and "aiden" in bad[0].error
    assert "unknown output modality" in bad[1].error and "audio" in bad[1].error


def test_three_engines_equal_one(ckpt, engine):
    """Thinker (with its encoders), Talker and Code2Wav each in their own engine; stream
    items and closes are forwarded between them as the server's router does."""
    from mstar.engine.builder import EngineConfig, build_core
    from mstar.plugins.loading import load_model

    loaded = load_model("qwen3omni")
    groups = {
        "thinker": ("thinker", "audio_encoder", "vision_encoder"), "talker": ("talker",), "code2wav": ("code2wav",),
    }
    engines = {g: Engine(build_core(loaded, ckpt, EngineConfig(nodes=n)), loaded, ckpt) for g, n in groups.items()}
    consumer = {"talker_prompt": "talker", "thinker_embed": "talker", "codes": "code2wav"}
    try:
        c = make_cases(ckpt)["image"]
        inputs, kwargs = engine_inputs(c.prompt, c.hf_inputs)
        whole = engine.run_batch([{"inputs": inputs, "sampling": GREEDY, "kwargs": kwargs}])[0]
        handles = {g: e.add_request(inputs, GREEDY, kwargs=kwargs, request_id="r") for g, e in engines.items()}
        got: dict[str, list[torch.Tensor]] = {}
        open_engines = set(engines)
        while open_engines:
            for g in sorted(open_engines):
                h = handles[g]
                while not h.queue.empty():
                    o = h.queue.get()
                    if o.stream_item:
                        engines[consumer[o.signal]].push_stream("r", o.signal, o.data)
                    elif o.stream_closed:
                        engines[consumer[o.signal]].close_stream("r", o.signal)
                    elif o.signal is not None and o.data is not None:
                        got.setdefault(o.signal, []).append(o.data)
                    if o.finished:
                        assert o.error is None, (g, o.error)
                        open_engines.discard(g)
            torch.cuda.synchronize() if torch.cuda.is_available() else None
        assert torch.cat(got["tokens"]).tolist() == whole.cat("tokens").tolist()
        assert torch.equal(torch.cat(got["codes"]), torch.cat(whole.signals["codes"]))
        assert torch.equal(torch.cat(got["audio"]), whole.cat("audio"))
    finally:
        for e in engines.values():
            e.close()
