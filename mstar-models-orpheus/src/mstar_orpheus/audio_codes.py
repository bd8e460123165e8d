"""The official Orpheus rule from generated tokens to SNAC codes to audio windows.

* A generated ``<custom_token_N>`` at audio position p (counting accepted audio tokens)
  becomes code ``N - 10 - (p mod 7) * codebook_size``; it is accepted only if that is > 0
  (other tokens, and codes <= 0, are dropped without advancing p).
* Every 7 accepted codes from the 28th on, the last 28 (4 frames) are decoded together and
  samples 2048:4096 of that window are emitted; nothing is flushed at the end.
* Within a 7-code frame, position 0 is SNAC level 0, positions 1,4 level 1 and 2,3,5,6
  level 2.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mstar_orpheus.tokens import AUDIO_TOKEN_OFFSET, TOKENS_PER_FRAME

WINDOW_FRAMES = 4
WINDOW_CODES = WINDOW_FRAMES * TOKENS_PER_FRAME  # 28
EMIT_FRAME = 1  # the window's second frame is emitted (samples 2048:4096 at 24 kHz)
LEVEL_POSITIONS = ((0,), (1, 4), (2, 3, 5, 6))


def tokens_to_codes(
    tokens: torch.Tensor, audio_count: torch.Tensor, custom_token_base: int, codebook_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """[B] sampled ids and [B] accepted-audio counts -> ([B] codes, [B] accepted)."""
    custom = tokens - custom_token_base
    code = custom - AUDIO_TOKEN_OFFSET - (audio_count % TOKENS_PER_FRAME) * codebook_size
    accepted = (custom >= 0) & (code > 0)
    return code, accepted


@dataclass(frozen=True)
class OrpheusWindows:
    """Chunk policy of the code stream: windows of 28 codes every 7 codes, no tail flush.

    The third element (context items) tells the decoder how much of the window is
    look-back; the decoder emits a fixed frame of the window regardless.
    """

    window: int = WINDOW_CODES
    hop: int = TOKENS_PER_FRAME

    def next_chunk(self, available: int, consumed: int, closed: bool) -> tuple[int, int, int] | None:
        end = max(consumed + self.hop, self.window)
        if available >= end:
            return end - self.window, end, self.window - self.hop
        return None  # the official decoder drops a partial tail when generation ends


def window_levels(windows: torch.Tensor) -> list[torch.Tensor]:
    """[B, 28] codes -> SNAC codes per level: [B, 4], [B, 8], [B, 16] (frame order)."""
    frames = windows.reshape(windows.shape[0], -1, TOKENS_PER_FRAME)
    return [frames[:, :, list(pos)].reshape(windows.shape[0], -1) for pos in LEVEL_POSITIONS]


def valid_windows(windows: torch.Tensor, codebook_size: int) -> torch.Tensor:
    """[B] bool: every code inside the codebook (the official decoder skips other windows)."""
    return ((windows >= 0) & (windows < codebook_size)).all(dim=-1)


def emitted_samples(samples_per_frame: int) -> slice:
    return slice(EMIT_FRAME * samples_per_frame, (EMIT_FRAME + 1) * samples_per_frame)
