"""M-RoPE position ids of a multimodal prompt (transformers' ``get_rope_index`` rules).

Text advances all three axes by one per token. An image or video placeholder block gets
(t, h, w) grid positions offset by the block's start: t steps by ``position_id_per_seconds``
per second (images: per frame), h and w by one per merged patch. Audio advances like text,
one per audio token. With the audio track of a video (``use_audio_in_video``) the video and
audio positions are merged in time order, video first on ties. After a block the next
position is one past the largest position of the last piece written. The decode steps
continue at ``cache position + delta``, where delta = max position + 1 - prompt length.
"""

from __future__ import annotations

import torch

from mstar_qwen3omni.config import MultimodalTokens


def audio_token_count(feature_lengths: torch.Tensor, n_window: int) -> torch.Tensor:
    """Audio tokens the encoder makes from mel feature lengths (its conv and chunk rule)."""
    chunk = n_window * 2
    rest = feature_lengths % chunk
    after_first = (rest - 1) // 2 + 1
    return ((after_first - 1) // 2 + 1 - 1) // 2 + 1 + (feature_lengths // chunk) * 13


def _grid_positions(grid: torch.Tensor, t_index: torch.Tensor, merge: int, start: float) -> torch.Tensor:
    """[3, t*h*w] positions of one vision grid (patch grid ``grid`` = (t, h, w) before merging)."""
    gt, gh, gw = int(grid[0]), int(grid[1]) // merge, int(grid[2]) // merge
    t = t_index.view(-1, 1).expand(gt, gh * gw).reshape(-1)
    h = torch.arange(gh, dtype=torch.float32).view(1, -1, 1).expand(gt, gh, gw).reshape(-1)
    w = torch.arange(gw, dtype=torch.float32).view(1, 1, -1).expand(gt, gh, gw).reshape(-1)
    return torch.stack([t, h, w]) + start


def _line(length: int, start: float) -> torch.Tensor:
    return (torch.arange(length, dtype=torch.float32) + start).expand(3, -1)


class _Builder:
    def __init__(self) -> None:
        self.pieces: list[torch.Tensor] = []
        self.next = 0.0  # one past the largest position of the last piece

    def add(self, piece: torch.Tensor, last: torch.Tensor | None = None) -> None:
        self.pieces.append(piece)
        tail = piece if last is None else last
        if tail.numel():
            self.next = float(tail.max()) + 1


def prompt_positions(
    ids: torch.Tensor,
    tokens: MultimodalTokens,
    image_grid_thw: torch.Tensor | None = None,
    video_grid_thw: torch.Tensor | None = None,
    video_second_per_grid: torch.Tensor | None = None,
    audio_feature_lengths: torch.Tensor | None = None,
) -> tuple[torch.Tensor, float]:
    """([3, n] float32 positions, rope delta) of a prompt of ``n`` ids. Raises ValueError
    when the placeholders do not match the media (counts or sizes)."""
    toks = ids.reshape(-1).tolist()
    n, merge, pps = len(toks), tokens.spatial_merge_size, tokens.position_id_per_seconds
    out = _Builder()
    counters = {"image": 0, "video": 0, "audio": 0}

    def take(kind: str, table: torch.Tensor | None) -> int:
        i = counters[kind]
        if table is None or i >= len(table):
            raise ValueError(f"the prompt has more {kind} placeholders than {kind} inputs")
        counters[kind] += 1
        return i

    def expect(start: int, token: int, count: int, kind: str) -> None:
        if toks[start : start + count] != [token] * count:
            raise ValueError(f"{kind} placeholder block at {start} does not hold the {count} tokens its input needs")

    def audio_len(i: int) -> int:
        assert audio_feature_lengths is not None
        return int(audio_token_count(audio_feature_lengths[i : i + 1], tokens.audio_n_window)[0])

    cursor = 0
    i = 0
    while i < n:
        tok = toks[i]
        if tok != tokens.vision_start_token_id and tok != tokens.audio_start_token_id:
            i += 1
            continue
        out.add(_line(i - cursor, out.next))  # text before the block
        kind_tok = toks[i + 1] if i + 1 < n else None
        if tok == tokens.audio_start_token_id:
            a = take("audio", audio_feature_lengths)
            length = audio_len(a)
            expect(i + 1, tokens.audio_token_id, length, "audio")
            out.add(_line(1, out.next))
            out.add(_line(length, out.next))
            out.add(_line(1, out.next))
            cursor = i + 2 + length
        elif kind_tok == tokens.image_token_id:
            g = take("image", image_grid_thw)
            assert image_grid_thw is not None
            grid = image_grid_thw[g]
            length = int(grid.prod()) // merge**2
            expect(i + 1, tokens.image_token_id, length, "image")
            out.add(_line(1, out.next))
            t_index = torch.arange(int(grid[0]), dtype=torch.float32) * 1 * pps
            out.add(_grid_positions(grid, t_index, merge, out.next))
            out.add(_line(1, out.next))
            cursor = i + 2 + length
        elif kind_tok in (tokens.video_token_id, tokens.audio_start_token_id):
            v = take("video", video_grid_thw)
            assert video_grid_thw is not None
            grid = video_grid_thw[v]
            length = int(grid.prod()) // merge**2
            per_grid = torch.tensor(1.0) if video_second_per_grid is None else video_second_per_grid[v].float()
            t_index = (torch.arange(int(grid[0]), dtype=torch.float32) * per_grid * pps).float()
            if kind_tok == tokens.video_token_id:
                expect(i + 1, tokens.video_token_id, length, "video")
                out.add(_line(1, out.next))
                out.add(_grid_positions(grid, t_index, merge, out.next))
                out.add(_line(1, out.next))
                cursor = i + 2 + length
            else:
                cursor = i + _video_with_audio(out, toks, i, grid, t_index, merge, audio_len(take("audio", audio_feature_lengths)), length, tokens)
        else:
            raise ValueError(f"vision block at {i} holds neither image, video nor audio placeholders")
        i = cursor
    out.add(_line(n - cursor, out.next))
    positions = torch.cat(out.pieces, dim=1) if out.pieces else torch.zeros(3, 0)
    if positions.shape[1] != n:
        raise ValueError(f"multimodal blocks cover {positions.shape[1]} positions of a {n}-token prompt")
    delta = float(positions.max()) + 1 - n if n else 0.0
    return positions, delta


def _video_with_audio(
    out: _Builder, toks: list[int], i: int, grid: torch.Tensor, t_index: torch.Tensor, merge: int,
    audio_length: int, video_length: int, tokens: MultimodalTokens,
) -> int:
    """A video block with its audio interleaved in time; returns the block's token count."""
    out.add(_line(2, out.next))  # vision start + audio start
    start = out.next
    video = _grid_positions(grid, t_index, merge, start)
    audio = _line(audio_length, start)
    merged_t = torch.cat([video[0], audio[0]])
    order = torch.sort(merged_t, stable=True).indices  # video first on equal times
    is_video = order < video.shape[1]
    merged = torch.cat([video, audio], dim=1)[:, order]
    body = toks[i + 2 : i + 2 + video_length + audio_length]
    want = [tokens.video_token_id if v else tokens.audio_token_id for v in is_video.tolist()]
    if body != want:
        raise ValueError(f"video-with-audio block at {i} does not interleave its tokens as its media need")
    # The position after the block follows the last run of one source (as the reference does).
    run = int(torch.nonzero(is_video != is_video[-1]).max()) + 1 if bool((is_video != is_video[-1]).any()) else 0
    out.add(merged, last=merged[:, run:])
    out.add(_line(2, out.next))  # audio end + vision end
    return 4 + video_length + audio_length
