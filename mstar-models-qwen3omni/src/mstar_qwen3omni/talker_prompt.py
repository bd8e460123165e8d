"""How the Thinker feeds the Talker: the Talker's prefill and its per-step text, exactly as
transformers 5.24's ``Qwen3OmniMoeForConditionalGeneration.generate(..., return_audio=True)``
builds them (one request; the batched version there only pads and masks).

From the Thinker it needs, per position of the Thinker sequence (prompt + generated text):
its input embedding ``E`` (``hidden_states[0]``: token embeddings, and encoder features at
media placeholders) and, at media placeholders of the prompt, the hidden state ``A`` after
decoder layer ``accept_hidden_layer`` - 1 (``hidden_states[accept_hidden_layer]``: index 0 is
the input embeddings; a layer's output before any deepstack addition; the final *normed*
state when ``accept_hidden_layer`` equals the layer count). ``text_projection`` (TP) and
``hidden_projection`` (HP) are the Talker's.

Prefill (n_user + 9 rows, summed text + codec parts):

1. user rows: every position of every *user* turn of the prompt (a position belongs to the
   turn of the last ``<|im_start|>`` at or before it; the turn is ``user`` when the token
   after that ``<|im_start|>`` is ``user_token_id``; system turns and earlier assistant turns
   are left out), in order: HP(A) at audio/image/video placeholders, TP(E) elsewhere.
2. assistant rows, from the last ``<|im_start|> assistant`` of the prompt (index a):
   text part ``TP(E[a]), TP(E[a+1]), TP(E[a+2])`` (``<|im_start|>assistant\\n``), then
   ``TP(tts_pad)`` x4, ``TP(tts_bos)``, ``TP(E[a+3])`` (the first generated token);
   codec part ``0, 0, 0, C(nothink), C(think_bos), C(think_eos), C(speaker), C(codec_pad),
   C(codec_bos)`` with C the Talker's ``codec_embedding``. ``tts_*`` are Thinker-vocabulary
   ids (``tts_bos/eos/pad_token_id``) embedded by the Thinker's table, then TP.
3. M-RoPE positions: over the ids [user ids..., tts_pad x 9] with the *Talker* config's
   token ids and ``position_id_per_seconds`` (``talker_multimodal_tokens``) when the request
   has media; else 0..n-1 on all axes. Decode steps continue at cache position + delta.

Decode step k (k = 0 after the prefill) adds to the previous frame's summed code embeddings
the text ``TP(E[a+4+k])`` -- the (k+2)-th generated token -- while there is one, then
``TP(tts_eos)`` once, then ``TP(tts_pad)`` forever. transformers only has embeddings of the
tokens it fed back, so the Thinker's *last* generated token is never spoken: normally its end
token (``<|im_end|>``), or the final word when it stopped at ``max_new_tokens``. So the Talker
needs the Thinker two tokens ahead: its prefill waits for the first generated token, and
step k for token k+2 (or the Thinker's end); a streaming edge carries one Thinker embedding
per Thinker step. The Talker stops at ``codec_eos_token_id`` (the other ids in the top 1024
of its vocabulary are never sampled); at ``max_new_tokens`` transformers drops the last frame
(its residual codes are never predicted). It decodes the codes with
``Code2Wav.chunked_decode(300, 25)``, which equals the whole decode below 300 frames only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mstar_qwen3omni.positions import prompt_positions
from mstar_qwen3omni.talker_config import talker_multimodal_tokens
from mstar_qwen3omni.talker_lm import TalkerLM

ASSISTANT_ROWS = 9  # <|im_start|> assistant \n, 4 pads, tts_bos, first text token


@dataclass
class TalkerPrompt:
    embeds: torch.Tensor  # [n, H] the prefill inputs (Talker width)
    position_ids: torch.Tensor  # [n] the ids transformers computes the Talker's M-RoPE over
    trailing: torch.Tensor  # [m, Ht] Thinker-width text of decode steps 0..m-1 (then tts_pad)


def user_positions(ids: torch.Tensor, im_start_id: int, user_id: int) -> torch.Tensor:
    """Indices of the prompt positions inside user turns (transformers' role rule)."""
    n = ids.numel()
    idx = torch.arange(n)
    starts = torch.where(ids == im_start_id, idx, torch.full_like(idx, -1))
    previous = torch.cummax(starts, dim=0).values.clamp_min(0)
    role = ids[(previous + 1).clamp_max(n - 1)]
    return torch.nonzero(role == user_id).reshape(-1)


def assistant_start(ids: torch.Tensor, im_start_id: int, assistant_id: int) -> int:
    hits = torch.nonzero((ids[:-1] == im_start_id) & (ids[1:] == assistant_id)).reshape(-1)
    if not hits.numel():
        raise ValueError("the prompt has no '<|im_start|>assistant' turn for the Talker to speak")
    return int(hits[-1])


@torch.no_grad()
def build_talker_prompt(
    lm: TalkerLM,
    prompt_ids: torch.Tensor,
    thinker_embeds: torch.Tensor,
    thinker_hidden: torch.Tensor,
    tts_embeds: torch.Tensor,
    voice: str,
    media_ids: tuple[int, ...],
) -> TalkerPrompt:
    """``prompt_ids`` [n0] the Thinker prompt; ``thinker_embeds`` [N, Ht] the Thinker input
    embeddings of the prompt and of the text generated so far (N >= a + 4, a the assistant
    start); ``thinker_hidden`` [n0, Ht] layer ``accept_hidden_layer``'s states over the
    prompt; ``tts_embeds`` [3, Ht] the Thinker embeddings of tts_bos, tts_eos, tts_pad;
    ``media_ids`` the Thinker's audio/image/video placeholder ids. ``trailing`` holds the text
    known so far, then tts_eos (the right ending once the Thinker has finished)."""
    cfg = lm.cfg
    ids = prompt_ids.reshape(-1).to(torch.long).cpu()
    speaker = cfg.speaker_id(voice)
    a = assistant_start(ids, cfg.im_start_id, cfg.assistant_id)
    if thinker_embeds.shape[0] < a + 4:
        raise ValueError(f"the Talker's prefill needs the Thinker's first generated token (embeddings up to row {a + 3})")
    device = lm.codec_head.weight.device
    dtype = lm.codec_head.weight.dtype
    embeds = thinker_embeds.to(device, dtype)
    users = user_positions(ids, cfg.im_start_id, cfg.user_id)
    is_media = torch.isin(ids[users], torch.tensor(media_ids, dtype=torch.long)).to(device)
    user_rows = users.to(device)
    text_part = lm.text_projection(embeds[user_rows])
    if bool(is_media.any()):
        media = lm.hidden_projection(thinker_hidden.to(device, dtype)[user_rows[is_media]])
        text_part[is_media] = media
    bos, eos, pad = lm.text_projection(tts_embeds.to(device, dtype)).unbind(0)
    head = lm.text_projection(embeds[a : a + 4])
    assistant_text = torch.cat([head[:3], pad.expand(4, -1), bos[None], head[3:4]])
    codec_ids = torch.tensor(
        [cfg.codec_nothink_id, cfg.codec_think_bos_id, cfg.codec_think_eos_id, speaker, cfg.codec_pad_id, cfg.codec_bos_id],
        device=device,
    )
    codec = torch.cat([torch.zeros(3, cfg.hidden_size, device=device, dtype=dtype), lm.model.codec_embedding(codec_ids)])
    return TalkerPrompt(
        embeds=torch.cat([text_part, assistant_text + codec]),
        position_ids=torch.cat([ids[users], torch.full((ASSISTANT_ROWS,), cfg.tts_pad_id, dtype=torch.long)]),
        trailing=torch.cat([thinker_embeds[a + 4 :], tts_embeds[1:2]]),
    )


def talker_positions(
    prompt: TalkerPrompt,
    config: dict[str, Any],
    image_grid_thw: torch.Tensor | None = None,
    video_grid_thw: torch.Tensor | None = None,
    video_second_per_grid: torch.Tensor | None = None,
    audio_feature_lengths: torch.Tensor | None = None,
) -> tuple[torch.Tensor, float] | None:
    """The prefill's M-RoPE positions [3, n] and rope delta when the request has media (over
    ``prompt.position_ids`` with the Talker config's ids and ``position_id_per_seconds``, as
    transformers' Talker computes them); None for text-only requests (positions 0..n-1)."""
    media = [image_grid_thw, video_grid_thw]
    if audio_feature_lengths is None and not any(g is not None and g.numel() for g in media):
        return None
    return prompt_positions(
        prompt.position_ids, talker_multimodal_tokens(config), image_grid_thw=image_grid_thw,
        video_grid_thw=video_grid_thw, video_second_per_grid=video_second_per_grid,
        audio_feature_lengths=audio_feature_lengths,
    )


WAIT, TTS_EOS, TTS_PAD = "wait", "tts_eos", "tts_pad"


def step_text(step: int, generated: int, finished: bool) -> int | str:
    """What Talker decode step ``step`` (0 after the prefill) adds as text, while the Thinker
    has generated ``generated`` tokens g_0.. (``finished``: it has stopped): the index j of
    g_j whose Thinker embedding to use, ``TTS_EOS``, ``TTS_PAD``, or ``WAIT`` (not known yet:
    g_{step+1} is spoken only if it is not the Thinker's last token). Mirrors ``trailing``:
    g_1 .. g_{n-2}, then tts_eos, then tts_pad for a Thinker that generated n tokens."""
    if not finished:
        return step + 1 if generated >= step + 3 else WAIT
    spoken = max(generated - 2, 0)
    if step < spoken:
        return step + 1
    return TTS_EOS if step == spoken else TTS_PAD
