"""``mstar.api.audio_input.read_mono``: what uploaded audio declares is checked before it is
decoded (a few KB of FLAC can declare minutes of 8-channel audio), and channels are averaged
block by block with the same values as averaging the whole array."""

from __future__ import annotations

import io
import tracemalloc

import numpy as np
import pytest
import soundfile as sf
from mstar.api.audio_input import AudioInputError, read_mono


def _encode(wave: np.ndarray, rate: int, fmt: str = "FLAC") -> bytes:
    buf = io.BytesIO()
    sf.write(buf, wave, rate, format=fmt)
    return buf.getvalue()


def test_a_long_silent_flac_is_refused_from_its_header_without_decoding():
    data = _encode(np.zeros((96000 * 60, 8), np.float32), 96000)  # 60 s, 8 channels: 176 MiB as float32
    assert len(data) < 200_000
    tracemalloc.start()
    try:
        with pytest.raises(AudioInputError) as err:
            read_mono(data, max_seconds=30)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert err.value.code == "audio_too_long" and "60.0 s" in str(err.value)
    assert peak < 8 << 20, peak


def test_a_rate_over_the_limit_is_refused():
    with pytest.raises(AudioInputError) as err:
        read_mono(_encode(np.zeros(1000, np.float32), 384000, "WAV"), max_seconds=30)
    assert err.value.code == "audio_rate_too_high"


def test_channels_are_averaged_as_a_whole_read_would():
    wave = np.random.default_rng(0).uniform(-0.5, 0.5, (150_000, 3)).astype(np.float32)
    data = _encode(wave, 24000, "WAV")
    got, rate = read_mono(data, max_seconds=30)
    whole, _ = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    assert rate == 24000 and got.dtype == np.float32
    np.testing.assert_array_equal(got, whole.mean(axis=1))


def test_garbage_is_invalid_audio():
    with pytest.raises(AudioInputError) as err:
        read_mono(b"not audio at all", max_seconds=30)
    assert err.value.code == "invalid_audio"
