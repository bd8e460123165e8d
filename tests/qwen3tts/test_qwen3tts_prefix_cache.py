"""The talker with prefix caching: prompts that open alike (a saved voice's head and
transcript, a built-in speaker's head) share those blocks and speak as an engine without
the cache (prefix_caching=False: it is on by default; codes equal, audio within 1e-5), as
do a voice description's; a position is identified by everything its
embedding row sums, so another x-vector or other reference codes part the prompts at that
row; every block is given back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from mstar import Engine
from mstar_qwen3tts.clone_prompt import CloneEncoder, ClonePrompt
from mstar_qwen3tts.config import Qwen3TTSConfig, load_config
from mstar_qwen3tts.prompt import (
    REF_FRAME,
    SPEAKER_SLOT,
    build_clone_prompt,
    build_prompt,
    instruct_text,
)
from mstar_qwen3tts.text_tokenizer import encode, load_tokenizer
from mstar_qwen3tts.tiny_checkpoint import write_checkpoint, write_voice_design_checkpoint
from qwen3tts_helpers import greedy, speech_inputs, token_ids

BLOCK = 4
FRAMES = 6
SENTENCES = ["The first sentence.", "Then a second, longer one follows it.", "Third!", "A fourth to end with."]


@pytest.fixture
def cached_engine():
    """An engine with prefix caching and an empty cache, per test (a shared one would hold
    earlier tests' voices)."""
    made: list[Engine] = []

    def get(ckpt: Path) -> Engine:
        made.append(Engine.from_model("qwen3tts", weights=ckpt, prefix_caching=True, block_size=BLOCK))
        return made[-1]

    yield get
    for e in made:
        e.close()


@pytest.fixture(scope="module")
def base_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("qwen3tts-base-prefix"), seed=3, kind="base")


def _clip(seconds: float, rate: int, seed: int) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    noise = np.random.default_rng(seed).standard_normal(t.shape)
    return (0.3 * np.sin(2 * np.pi * (150 + 40 * seed) * t) + 0.05 * noise).astype(np.float32)


@pytest.fixture(scope="module")
def voices(base_ckpt: Path) -> dict[str, ClonePrompt]:
    """Saved voices (clone prompts): two clips with one transcript, and a mix of the two
    (the first's x-vector with the second's reference codes)."""
    enc = CloneEncoder.from_checkpoint(base_ckpt)
    a = enc.encode(_clip(1.0, 16000, 1), 16000, "the river at noon")
    b = enc.encode(_clip(1.0, 16000, 2), 16000, "the river at noon")
    assert not torch.equal(a.speaker_embed, b.speaker_embed) and not torch.equal(a.ref_codes, b.ref_codes)
    return {"a": a, "b": b, "a_with_b_codes": ClonePrompt(a.speaker_embed, b.ref_codes, a.ref_text_ids)}


def _inputs(ckpt: Path, voice: ClonePrompt, text: str, non_streaming_mode: bool) -> dict[str, torch.Tensor]:
    cfg = Qwen3TTSConfig.from_dict(load_config(ckpt))
    return build_clone_prompt(cfg, token_ids(ckpt, text), voice.speaker_embed, voice.ref_codes,
                              voice.ref_text_ids.tolist(), "english", non_streaming_mode).inputs()


def _request(inputs: dict[str, torch.Tensor]) -> dict:
    return {"inputs": inputs, "sampling": greedy(FRAMES, min_tokens=FRAMES)}


def _common(x: dict[str, torch.Tensor], y: dict[str, torch.Tensor]) -> int:
    """Leading positions whose text and codec ids agree (where the prompts' sources part, or
    where one ends)."""
    n = min(x["text_ids"].numel(), y["text_ids"].numel())
    same = (x["text_ids"][:n] == y["text_ids"][:n]) & (x["codec_ids"][:n] == y["codec_ids"][:n])
    return n if bool(same.all()) else int((~same).nonzero()[0])


def _same(got, want) -> None:
    assert got.error is None and want.error is None, (got.error, want.error)
    assert torch.equal(got.cat("codes"), want.cat("codes"))
    torch.testing.assert_close(got.cat("audio"), want.cat("audio"), rtol=0, atol=1e-5)


@pytest.mark.parametrize("non_streaming_mode", [True, False])
def test_a_saved_voice_is_computed_once_and_speaks_as_without_the_cache(engines, cached_engine, base_ckpt, voices, non_streaming_mode):
    """Sentences in one saved voice, one after another: each after the first maps the
    voice's whole blocks (role, think tags, x-vector, transcript: all before the sentence's
    text), no more, and its codes and audio are those of an engine without the cache."""
    cached = cached_engine(base_ckpt)
    plain = engines(base_ckpt, prefix_caching=False)
    prompts = [_inputs(base_ckpt, voices["a"], s, non_streaming_mode) for s in SENTENCES]
    voice_len = min(_common(prompts[0], p) for p in prompts[1:])
    # The voice's rows reach past the x-vector into the transcript: several whole blocks.
    assert voice_len > int((prompts[0]["codec_ids"] == SPEAKER_SLOT).nonzero()[0]) + BLOCK
    stats = cached.core.stats
    for i, prompt in enumerate(prompts):
        hits = stats.prefix_hit_tokens
        result = cached.run_batch([_request(prompt)])[0]
        if i:  # exactly the voice's whole blocks: the sentence's own rows are never shared
            assert stats.prefix_hit_tokens - hits == _common(prompts[i - 1], prompt) // BLOCK * BLOCK
            assert stats.prefix_hit_tokens - hits >= voice_len // BLOCK * BLOCK
        _same(result, plain.run_batch([_request(prompt)])[0])
    # All at once too (prefills mapping what another request's prefill just cached).
    for got, prompt in zip(cached.run_batch([_request(p) for p in prompts]), prompts, strict=True):
        _same(got, plain.run_batch([_request(prompt)])[0])
    assert cached.core.nodes["talker"].kv.num_used_blocks == 0


@pytest.mark.parametrize("non_streaming_mode", [True, False])
@pytest.mark.parametrize(("other", "parts_at"), [("b", SPEAKER_SLOT), ("a_with_b_codes", REF_FRAME)])
def test_another_voice_shares_only_the_rows_before_it_differs(engines, cached_engine, base_ckpt, voices, non_streaming_mode, other, parts_at):
    """The same sentence in another voice: only the blocks before the first row that holds
    voice content (the x-vector; the first reference frame when only the codes differ)
    are shared, and the speech is that voice's, as without the cache."""
    cached = cached_engine(base_ckpt)
    plain = engines(base_ckpt, prefix_caching=False)
    text = "The same words in both voices."
    first = _inputs(base_ckpt, voices["a"], text, non_streaming_mode)
    second = _inputs(base_ckpt, voices[other], text, non_streaming_mode)
    assert torch.equal(first["text_ids"], second["text_ids"]) and torch.equal(first["codec_ids"], second["codec_ids"])
    cached.run_batch([_request(first)])
    row = int((second["codec_ids"] == parts_at).nonzero()[0])
    hits = cached.core.stats.prefix_hit_tokens
    result = cached.run_batch([_request(second)])[0]
    assert cached.core.stats.prefix_hit_tokens - hits == row // BLOCK * BLOCK
    _same(result, plain.run_batch([_request(second)])[0])
    # And back: the first voice is still cached whole (its sentence too, but its last row).
    hits = cached.core.stats.prefix_hit_tokens
    _same(cached.run_batch([_request(first)])[0], plain.run_batch([_request(first)])[0])
    assert cached.core.stats.prefix_hit_tokens - hits == (first["text_ids"].numel() - 1) // BLOCK * BLOCK
    assert cached.core.nodes["talker"].kv.num_used_blocks == 0


def test_a_builtin_speaker_shares_its_head_and_not_another_speakers(engines, cached_engine, tiny_ckpt):
    """CustomVoice: the head (role, think tags, the speaker's codec id) is shared by the same
    speaker's sentences and, up to the speaker's row, by other speakers'."""
    cached = cached_engine(tiny_ckpt)
    plain = engines(tiny_ckpt, prefix_caching=False)
    one = speech_inputs(tiny_ckpt, "Hello there, first.", "vivian", "english")
    two = speech_inputs(tiny_ckpt, "Another one, second.", "vivian", "english")
    other = speech_inputs(tiny_ckpt, "Another one, second.", "ryan", "english")
    stats = cached.core.stats
    results = []
    for prompt, expect in ((one, None), (two, _common(one, two)), (other, _common(two, other))):
        hits = stats.prefix_hit_tokens
        results.append(cached.run_batch([_request(prompt)])[0])
        if expect is not None:
            assert stats.prefix_hit_tokens - hits == expect // BLOCK * BLOCK
    assert _common(one, two) > _common(two, other) >= BLOCK  # the speaker's row parts them
    for got, prompt in zip(results, (one, two, other), strict=True):
        _same(got, plain.run_batch([_request(prompt)])[0])
    assert cached.core.nodes["talker"].kv.num_used_blocks == 0


def test_a_voice_description_is_shared_and_another_is_not(engines, cached_engine, tmp_path):
    """VoiceDesign: the instruction (the voice's description) opens the prompt, so sentences
    with one description share it; another description parts the prompts at its first
    differing token."""
    ckpt = write_voice_design_checkpoint(tmp_path / "design")
    cfg = Qwen3TTSConfig.from_dict(load_config(ckpt))
    cached = cached_engine(ckpt)
    plain = engines(ckpt, prefix_caching=False)

    def prompt(description: str, text: str) -> dict[str, torch.Tensor]:
        instruct = encode(load_tokenizer(ckpt), instruct_text(description))
        return build_prompt(cfg, token_ids(ckpt, text), None, "english", True, instruct).inputs()

    calm = "A calm, low voice, speaking slowly and warmly to a friend."
    prompts = [prompt(calm, "First words."), prompt(calm, "Second, other words."), prompt("A bright voice.", "Second, other words.")]
    stats = cached.core.stats
    for i, p in enumerate(prompts):
        hits = stats.prefix_hit_tokens
        result = cached.run_batch([_request(p)])[0]
        if i:
            assert stats.prefix_hit_tokens - hits == _common(prompts[i - 1], p) // BLOCK * BLOCK
        _same(result, plain.run_batch([_request(p)])[0])
    assert _common(prompts[0], prompts[1]) > len(calm) // 2 > _common(prompts[1], prompts[2])
    assert cached.core.nodes["talker"].kv.num_used_blocks == 0
