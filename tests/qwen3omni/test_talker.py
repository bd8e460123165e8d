"""The Talker loaded from a real-layout tiny checkpoint (``talker.*``, experts one module per
expert) against transformers' Qwen3OmniMoeTalkerForConditionalGeneration on the same inputs:
prefill logits with text and with 3-D M-RoPE positions, and a ragged batch of two requests
generated greedily through the node contract on the paged KV cache: every step's code-0 logits
within 1e-4 and every frame's codes (code 0 + code predictor) identical to transformers'
``talker.generate`` fed the same prompt, trailing text and ``tts_pad`` embeddings."""

from __future__ import annotations

import pytest
import torch
from mstar.model.submodule_base import CurrentForwardPassInfo
from mstar.weights import CheckpointMismatchError
from mstar_qwen3omni.dense_attention import DenseKVCache
from mstar_qwen3omni.speech_loading import build_code2wav, build_talker
from mstar_qwen3omni.talker import CODES, FRAME_EMBED, POSITIONS, PROMPT_EMBEDS, TEXT_EMBED
from mstar_qwen3omni.talker_prompt import (
    ASSISTANT_ROWS,
    TTS_EOS,
    TTS_PAD,
    WAIT,
    build_talker_prompt,
    step_text,
    talker_positions,
)
from safetensors.torch import load_file, save_file
from speech_helpers import (
    TINY_SPECIAL_IDS,
    GreedyRecorder,
    PagedSteps,
    checkpoint_config,
    load_talker_node,
    speech_model,
)

TOL = 1e-4
STEPS = 6


@pytest.fixture(scope="module")
def models():
    ref, root = speech_model()
    return ref.talker, load_talker_node(root)


def _embeds(n: int, width: int, seed: int) -> torch.Tensor:
    return torch.randn(n, width, generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def test_prefill_logits_equal_transformers(models):
    ref, node = models
    embeds = _embeds(11, node.cfg.hidden_size, seed=1)
    positions = torch.arange(11.0).expand(3, -1)
    ours = node.lm.codec_head(node.lm.hidden_states(embeds, positions, DenseKVCache(1)))
    expected = ref(inputs_embeds=embeds[None]).logits[0]
    err = (ours - expected).abs().max().item()
    print(f"max |talker prefill logits - transformers| = {err:.2e}")
    assert err < TOL


@torch.no_grad()
def test_multimodal_positions_equal_transformers(models):
    """Distinct (t, h, w) positions, as an image block gets: the interleaved M-RoPE sections."""
    ref, node = models
    embeds = _embeds(10, node.cfg.hidden_size, seed=2)
    t = torch.tensor([0, 1, 2, 3, 3, 3, 3, 5, 6, 7])
    h = torch.tensor([0, 1, 2, 3, 3, 4, 4, 5, 6, 7])
    w = torch.tensor([0, 1, 2, 3, 4, 3, 4, 5, 6, 7])
    positions = torch.stack([t, h, w])
    ours = node.lm.codec_head(node.lm.hidden_states(embeds, positions.float(), DenseKVCache(1)))
    expected = ref(inputs_embeds=embeds[None], position_ids=positions[:, None, :]).logits[0]
    plain = ref(inputs_embeds=embeds[None], position_ids=t.expand(3, 1, -1)).logits[0]
    assert (expected - plain).abs().max().item() > 1e-3  # the h/w axes do change the result
    assert (ours - expected).abs().max().item() < TOL


def _reference(ref, node, prompt: torch.Tensor, texts: torch.Tensor, pad: torch.Tensor):
    """transformers' Talker generate, greedy on both levels: per step code-0 logits and frames."""
    project = ref.text_projection
    out = ref.generate(
        inputs_embeds=prompt[None], attention_mask=torch.ones(1, prompt.shape[0], dtype=torch.long),
        trailing_text_hidden=project(texts)[None], tts_pad_embed=project(pad)[None, None],
        max_new_tokens=STEPS + 1, do_sample=False,
        eos_token_id=node.cfg.vocab_size,  # never sampled: run every step, as the loop above does (no stop rule)
        suppress_tokens=node.cfg.suppressed_ids(), output_hidden_states=True, output_logits=True,
        return_dict_in_generate=True,
    )
    frames = [hid[-1][0] for hid in out.hidden_states[1:]]  # step t+1 carries frame t's codes
    return torch.stack(out.logits[: len(frames)])[:, 0], torch.stack(frames)


@torch.no_grad()
def test_ragged_batch_generation_equals_transformers(models):
    ref, node = models
    h, ht = node.cfg.hidden_size, node.cfg.thinker_hidden_size
    pad = _embeds(1, ht, seed=9)[0]
    requests = {
        "a": (_embeds(9, h, seed=3), _embeds(2, ht, seed=4)),  # text ends before the speech: pads follow
        "b": (_embeds(6, h, seed=5), _embeds(8, ht, seed=6)),
    }
    runner = PagedSteps(node)
    logits: dict[str, list[torch.Tensor]] = {rid: [] for rid in requests}
    frames: dict[str, list[torch.Tensor]] = {rid: [] for rid in requests}
    out = None
    for step in range(STEPS):
        if step == 0:
            walk, rows = "prefill", {rid: {PROMPT_EMBEDS: p} for rid, (p, _) in requests.items()}
        else:
            walk, rows = "decode", {}
            for i, (rid, (_, texts)) in enumerate(requests.items()):
                k = step - 1  # decode step k feeds trailing text k
                rows[rid] = {FRAME_EMBED: out.row_outputs[FRAME_EMBED][i], TEXT_EMBED: texts[k] if k < len(texts) else pad}
        sampler = GreedyRecorder()
        out = runner.step(walk, rows, sampler)
        main = [logit for label, logit in sampler.calls if label == "main"]
        assert len(main) == 1
        for i, rid in enumerate(requests):
            logits[rid].append(main[0][i])
            frames[rid].append(out.row_outputs[CODES][i, 0])
    for rid, (prompt, texts) in requests.items():
        ref_logits, ref_frames = _reference(ref, node, prompt, texts, pad)
        n = ref_frames.shape[0]
        assert n == STEPS
        ours = torch.stack(logits[rid][:n])
        keep = torch.isfinite(ours)
        assert torch.equal(~keep, node.lm.suppress_mask.expand_as(keep))  # only the codec specials but EOS
        err = (ours[keep] - ref_logits[keep]).abs().max().item()
        print(f"request {rid}: {n} frames, max |code-0 logits - transformers| = {err:.2e}")
        assert err < TOL
        assert torch.equal(torch.stack(frames[rid][:n]), ref_frames), rid


def test_prompt_positions_shape_is_checked(models):
    _, node = models
    info = CurrentForwardPassInfo(request_id="r", walk="prefill", request_kwargs={})
    with pytest.raises(ValueError, match="talker_positions"):
        node.prepare_inputs("prefill", info, {PROMPT_EMBEDS: torch.zeros(4, node.cfg.hidden_size), POSITIONS: torch.zeros(3, 5)})


def _chat(user: list[int]) -> torch.Tensor:
    """system turn, user turn, open assistant turn (tiny ids: see speech_helpers)."""
    s = TINY_SPECIAL_IDS
    start, end, nl = s["im_start_token_id"], s["im_end_token_id"], 10
    ids = [start, s["system_token_id"], nl, 40, 41, end, nl, start, s["user_token_id"], nl, *user, end, nl,
           start, s["assistant_token_id"], nl]
    return torch.tensor(ids)


@torch.no_grad()
def test_thinker_to_talker_to_audio_equals_generate_return_audio(models):
    """transformers' generate(return_audio=True), greedy on both levels, against our Talker and
    Code2Wav fed from the same Thinker run (its hidden states, as generate collects them):
    the prefill, every frame's codes and the waveform, streamed 2 frames at a time."""
    ref_talker, node = models
    ref, root = speech_model()
    s = TINY_SPECIAL_IDS
    ids = _chat([60, 61, 62, 63, 64, 65])
    thinker_kwargs = dict(max_new_tokens=8, eos_token_id=s["im_end_token_id"], do_sample=False)
    max_frames = 12
    seq, wav = ref.generate(
        input_ids=ids[None], return_audio=True, speaker="Chelsie", thinker_max_new_tokens=8,
        thinker_eos_token_id=s["im_end_token_id"], thinker_do_sample=False, talker_do_sample=False,
        talker_repetition_penalty=1.0, talker_max_new_tokens=max_frames,
    )
    # The Thinker's run, collected as generate collects it.
    run = ref.thinker.generate(input_ids=ids[None], output_hidden_states=True, return_dict_in_generate=True, **thinker_kwargs)
    assert torch.equal(run.sequences, seq)
    embeds = torch.cat([h[0] for h in run.hidden_states], dim=1)[0]
    hidden = torch.cat([h[node.cfg.accept_hidden_layer] for h in run.hidden_states], dim=1)[0]
    tts = ref.thinker.get_input_embeddings()(torch.tensor([s["tts_bos_token_id"], s["tts_eos_token_id"], s["tts_pad_token_id"]]))
    prompt = build_talker_prompt(node.lm, ids, embeds, hidden[: ids.numel()], tts, "chelsie", (151675, 151655, 151656))
    assert prompt.embeds.shape[0] == 3 + 6 + 2 + ASSISTANT_ROWS  # the user turn (no system turn), assistant rows
    runner, frames, out = PagedSteps(node), [], None
    for k in range(max_frames):
        if k == 0:
            rows = {"r": {PROMPT_EMBEDS: prompt.embeds}}
        else:
            text = prompt.trailing[k - 1] if k - 1 < len(prompt.trailing) else tts[2]
            rows = {"r": {FRAME_EMBED: out.row_outputs[FRAME_EMBED][0], TEXT_EMBED: text}}
        out = runner.step("prefill" if k == 0 else "decode", rows, GreedyRecorder())
        codes = out.row_outputs[CODES][0, 0]
        if int(codes[0]) == node.cfg.codec_eos_id:
            break
        frames.append(codes)
    else:
        frames = frames[:-1]  # at max_new_tokens transformers never completes the last frame
    assert len(frames) >= 3, "the Talker spoke almost nothing: pick another prompt"
    code2wav = build_code2wav(checkpoint_config(root), root, "cpu")
    codes = torch.stack(frames, dim=1)  # [Q, T]
    audio, states = [], [None]
    for chunk in torch.split(codes, 2, dim=-1):
        wavs, states = code2wav.stream_chunks([chunk], states)
        audio.append(wavs[0])
    ours = torch.cat(audio)
    print(f"{len(frames)} frames; max |audio - transformers| = {(ours - wav[0, 0]).abs().max().item():.2e}")
    assert ours.shape == wav[0, 0].shape
    assert (ours - wav[0, 0]).abs().max().item() < 1e-5


@torch.no_grad()
def test_prefill_with_media_and_two_user_turns_equals_transformers_parts(models):
    """Media placeholders in user turns take the projected accept-layer hidden state; a
    closed assistant turn and the system turn are left out; the assistant rows and the
    trailing text equal transformers' own ``_get_talker_user_parts`` /
    ``_get_talker_assistant_parts`` on the same tensors."""
    _, node = models
    ref, _ = speech_model()
    s = TINY_SPECIAL_IDS
    start, end, nl, image, audio = s["im_start_token_id"], s["im_end_token_id"], 10, 151655, 151675
    system = [start, s["system_token_id"], nl, 40, end, nl]  # rows 0-5
    user1 = [start, s["user_token_id"], nl, 60, image, image, image, 61, end, nl]  # rows 6-15
    answer = [start, s["assistant_token_id"], nl, 80, 81, end, nl]  # rows 16-22
    user2 = [start, s["user_token_id"], nl, audio, audio, 62, end, nl]  # rows 23-30
    ids = torch.tensor(system + user1 + answer + user2 + [start, s["assistant_token_id"], nl])
    n0, generated = ids.numel(), torch.tensor([70, 71, 72, 73, end])
    seq = torch.cat([ids, generated])
    ht = node.cfg.thinker_hidden_size
    embeds, hidden = _embeds(seq.numel() - 1, ht, seed=20), _embeds(seq.numel() - 1, ht, seed=21)
    tts = _embeds(3, ht, seed=22)
    ours = build_talker_prompt(node.lm, ids, embeds, hidden[:n0], tts, "Aiden", (audio, image, 151656))
    media = ((seq == audio) | (seq == image))[None]
    user_part = ref._get_talker_user_parts(0, n0, media, hidden[None], embeds[None])[0]
    user_rows = list(range(6, 16)) + list(range(23, 31))
    bos, eos, pad = ref.talker.text_projection(tts[None]).chunk(3, dim=1)
    speaker = node.cfg.speaker_id("aiden")
    assistant, assistant_ids, trailing = ref._get_talker_assistant_parts(n0 - 3, seq.numel(), speaker, embeds[None], pad, bos, eos)
    expected = torch.cat([user_part[user_rows], assistant[0]])
    assert ours.embeds.shape == expected.shape
    assert (ours.embeds - expected).abs().max().item() < 1e-6
    assert torch.equal(ours.position_ids, torch.cat([ids[user_rows], assistant_ids[0]]))
    assert (node.lm.text_projection(ours.trailing) - trailing[0]).abs().max().item() < 1e-6
    with pytest.raises(ValueError, match="unknown voice 'Nobody'.*aiden"):
        build_talker_prompt(node.lm, ids, embeds, hidden[:n0], tts, "Nobody", (audio, image))


@torch.no_grad()
def test_image_prompt_positions_equal_transformers_talker(models):
    """An image block in the user turn: the Talker's prefill positions (over user ids + pads)
    equal transformers' Talker get_rope_index; a text-only request keeps 0..n-1."""
    _, node = models
    ref, root = speech_model()
    s = TINY_SPECIAL_IDS
    start, end, nl = s["im_start_token_id"], s["im_end_token_id"], 10
    vs, ve, image = 151652, 151653, 151655
    grid = torch.tensor([[1, 4, 6]])  # 1 x 2 x 3 merged patches -> 6 placeholders
    ids = torch.tensor([start, s["user_token_id"], nl, 60, vs, *[image] * 6, ve, 61, end, nl, start, s["assistant_token_id"], nl])
    ht = node.cfg.thinker_hidden_size
    embeds = _embeds(ids.numel() + 1, ht, seed=30)
    prompt = build_talker_prompt(node.lm, ids, embeds, embeds[: ids.numel()], _embeds(3, ht, seed=31), "ethan", (image,))
    positions, delta = talker_positions(prompt, checkpoint_config(root), image_grid_thw=grid)
    ids2d = prompt.position_ids[None]
    expected, expected_delta = ref.talker.get_rope_index(ids2d, grid, None, torch.ones_like(ids2d), False, None, None)
    assert not torch.equal(positions[1], positions[2])  # the image block spreads h and w
    assert torch.equal(positions, expected[:, 0].float()) and delta == float(expected_delta)
    assert talker_positions(prompt, checkpoint_config(root)) is None


@torch.no_grad()
def test_chunked_prefill_with_positions_equals_one_prefill(models):
    """A prefill with 3-D positions split in chunks (as the engine's token budget does) gives
    the frames of one whole prefill, and decode continues at the same rope delta."""
    _, node = models
    h, ht = node.cfg.hidden_size, node.cfg.thinker_hidden_size
    embeds = _embeds(9, h, seed=40)
    positions = torch.tensor([[0, 1, 2, 2, 2, 2, 4, 5, 6], [0, 1, 2, 2, 3, 3, 4, 5, 6], [0, 1, 2, 3, 2, 3, 4, 5, 6]])
    signals = {PROMPT_EMBEDS: embeds, POSITIONS: positions}
    text = _embeds(1, ht, seed=41)[0]

    def frames(cuts: list[int]) -> list[torch.Tensor]:
        runner = PagedSteps(node)
        whole = node.prepare_inputs("prefill", runner.infos("prefill", ["r"])["r"], signals)
        out = None
        for a, b in zip([0, *cuts], [*cuts, 9], strict=True):
            part = node.split_inputs("prefill", runner.infos("prefill", ["r"])["r"], whole, a, b)
            out = runner.run("prefill", {"r": part}, GreedyRecorder())
        got = [out.row_outputs[CODES][0, 0]]
        out = runner.step("decode", {"r": {FRAME_EMBED: out.row_outputs[FRAME_EMBED][0], TEXT_EMBED: text}}, GreedyRecorder())
        return [*got, out.row_outputs[CODES][0, 0]]

    whole = frames([])
    for cuts in ([4], [2, 7]):
        assert all(torch.equal(x, y) for x, y in zip(frames(cuts), whole, strict=True)), cuts


def test_loading_is_strict_and_random_weights_build(models, tmp_path):
    """A checkpoint missing one talker tensor fails naming it; --random-weights builds without files."""
    _, root = speech_model()
    tensors = load_file(str(root / "model.safetensors"))
    dropped = "talker.model.layers.1.mlp.shared_expert_gate.weight"
    del tensors[dropped]
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "config.json").write_text((root / "config.json").read_text())
    with pytest.raises(CheckpointMismatchError, match="shared_expert_gate"):
        build_talker(checkpoint_config(root), tmp_path, "cpu")
    node = build_talker(checkpoint_config(root), None, "cpu")
    out = PagedSteps(node).step("prefill", {"r": {PROMPT_EMBEDS: _embeds(3, node.cfg.hidden_size, seed=50)}}, GreedyRecorder())
    assert out.row_outputs[CODES].shape == (1, 1, node.cfg.num_code_groups)


def test_step_text_streams_the_trailing_text_of_a_whole_run(models):
    """Streaming rule vs the whole-run trailing text (itself equal to transformers'): for a
    Thinker of n tokens, the text each step gets once known equals trailing[k] (then pad),
    and a step waits until the Thinker is two tokens ahead or has finished."""
    _, node = models
    ids = _chat([60, 61])
    ht = node.cfg.thinker_hidden_size
    tts = _embeds(3, ht, seed=60)
    for n in range(2, 7):
        embeds = _embeds(ids.numel() + n - 1, ht, seed=61)  # rows transformers has: all but the last token
        prompt = build_talker_prompt(node.lm, ids, embeds, embeds[: ids.numel()], tts, "ethan", ())
        for k in range(n + 2):
            got = step_text(k, n, finished=True)
            want = prompt.trailing[k] if k < len(prompt.trailing) else tts[2]
            row = {TTS_EOS: tts[1], TTS_PAD: tts[2]}.get(got) if isinstance(got, str) else embeds[ids.numel() + got]
            assert torch.equal(row, want), (n, k)
            for seen in range(1, n + 1):  # while the Thinker still runs, the answer is WAIT or final
                early = step_text(k, seen, finished=False)
                assert early in (WAIT, got), (n, k, seen)
