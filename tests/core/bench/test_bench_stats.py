"""Statistics of ``mstar bench`` against hand-computed values."""

from __future__ import annotations

import math
import statistics

import pytest
from mstar.bench import BenchRun, RequestRecord, arrival_gaps, describe, percentile, summarize, tpot


def test_percentile_interpolates_linearly_between_order_statistics() -> None:
    xs = [4.0, 1.0, 3.0, 2.0]  # sorted: 1 2 3 4; position (n-1) q / 100
    assert percentile(xs, 0) == 1.0
    assert percentile(xs, 50) == pytest.approx(2.5)  # position 1.5
    assert percentile(xs, 90) == pytest.approx(3.7)  # position 2.7
    assert percentile(xs, 99) == pytest.approx(3.97)  # position 2.97
    assert percentile(xs, 100) == 4.0
    assert percentile([5.0], 99) == 5.0
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError, match="outside"):
        percentile(xs, 101)


def test_describe_mean_median_population_std_and_percentiles_scaled() -> None:
    d = describe([0.001, 0.002, 0.003, 0.010], (50, 90), scale=1000.0)
    assert d["mean"] == pytest.approx(4.0)
    assert d["median"] == pytest.approx(2.5)
    # population std of 1, 2, 3, 10: deviations -3 -2 -1 6 -> (9+4+1+36)/4 = 12.5
    assert d["std"] == pytest.approx(math.sqrt(12.5))
    assert d["p50"] == pytest.approx(2.5)
    assert d["p90"] == pytest.approx(3 + 0.7 * 7)  # position 2.7 between 3 and 10


def _chat(latency: float, times: list[float], out: int, prompt: int) -> RequestRecord:
    return RequestRecord("chat", ok=True, latency=latency, chunk_times=times, output_tokens=out, prompt_tokens=prompt)


def test_summary_of_chat_records() -> None:
    a = _chat(1.0, [0.1, 0.3, 0.6], out=4, prompt=10)  # ITL 0.2 0.3; TPOT (1.0-0.1)/3 = 0.3
    b = _chat(2.0, [0.5, 1.5], out=2, prompt=20)  # ITL 1.0;     TPOT (2.0-0.5)/1 = 1.5
    failed = RequestRecord("chat", ok=False, error="HTTP 500", latency=0.2)
    s = summarize(BenchRun([a, b, failed], duration=4.0, requests_sent=3), percentiles=(50, 90, 99))
    assert (s["requests"], s["completed"], s["failed"]) == (3, 2, 1)
    assert (s["total_input_tokens"], s["total_output_tokens"]) == (30, 6)
    assert s["request_throughput"] == pytest.approx(0.5)
    assert s["output_throughput"] == pytest.approx(1.5)
    assert s["total_token_throughput"] == pytest.approx(9.0)
    assert s["mean_ttft_ms"] == pytest.approx(300.0)
    assert s["p90_ttft_ms"] == pytest.approx(100 + 0.9 * 400)
    assert s["mean_tpot_ms"] == pytest.approx(900.0)
    assert tpot(a) == pytest.approx(0.3)
    # ITLs 200, 300, 1000 ms: median 300, p90 at position 1.8 = 300 + 0.8 * 700
    assert s["median_itl_ms"] == pytest.approx(300.0)
    assert s["p90_itl_ms"] == pytest.approx(860.0)
    assert s["p99_itl_ms"] == pytest.approx(300 + 0.98 * 700)
    assert s["mean_e2el_ms"] == pytest.approx(1500.0)  # the failed request is not in it
    assert "mean_ttfa_ms" not in s and "audio_throughput" not in s


def test_summary_of_speech_records() -> None:
    recs = [
        RequestRecord("speech", ok=True, latency=1.0, chunk_times=[0.2, 0.5], audio_seconds=2.0),  # RTF 0.5
        RequestRecord("speech", ok=True, latency=3.0, chunk_times=[0.4], audio_seconds=1.0),  # RTF 3.0
    ]
    s = summarize(BenchRun(recs, duration=5.0, requests_sent=2), percentiles=(50,))
    assert s["total_audio_seconds"] == pytest.approx(3.0)
    assert s["audio_throughput"] == pytest.approx(0.6)
    assert s["mean_ttfa_ms"] == pytest.approx(300.0)
    assert s["mean_rtf"] == pytest.approx(1.75)
    assert s["p50_rtf"] == pytest.approx(1.75)
    assert "mean_ttft_ms" not in s


def test_tpot_needs_two_tokens_and_a_first_chunk() -> None:
    assert tpot(_chat(1.0, [0.5], out=1, prompt=1)) is None
    assert tpot(_chat(1.0, [], out=5, prompt=1)) is None


def test_arrival_gaps_infinite_rate_and_poisson_and_bursty() -> None:
    assert list(arrival_gaps(3, math.inf)) == [0.0, 0.0, 0.0]
    poisson = list(arrival_gaps(20000, rate=10.0, seed=1))
    assert statistics.fmean(poisson) == pytest.approx(0.1, rel=0.03)
    # exponential gaps: coefficient of variation 1; gamma with shape k: 1/sqrt(k)
    assert statistics.pstdev(poisson) / statistics.fmean(poisson) == pytest.approx(1.0, rel=0.05)
    bursty = list(arrival_gaps(20000, rate=10.0, burstiness=0.25, seed=1))
    assert statistics.fmean(bursty) == pytest.approx(0.1, rel=0.05)
    assert statistics.pstdev(bursty) / statistics.fmean(bursty) == pytest.approx(2.0, rel=0.05)
    assert list(arrival_gaps(5, 3.0, seed=7)) == list(arrival_gaps(5, 3.0, seed=7))
    with pytest.raises(ValueError):
        list(arrival_gaps(1, 0.0))
