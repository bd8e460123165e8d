"""``benchmarks/soak.py``'s memory verdict: a process is flat when its second half's highest
RSS stays within the tolerance of its first half's."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SOAK = Path(__file__).resolve().parents[3] / "benchmarks" / "soak.py"


def load_soak():
    spec = importlib.util.spec_from_file_location("soak_benchmark", SOAK)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def rows(*per_minute: dict[str, float]) -> list[dict]:
    return [{"minute": i + 1, "rss_mib": rss} for i, rss in enumerate(per_minute)]


def test_memory_verdicts_per_process():
    soak = load_soak()
    report = rows(
        {"1:api": 300, "2:engine": 830, "3:old": 500},
        {"1:api": 301, "2:engine": 900},
        {"1:api": 302, "2:engine": 980, "4:new": 510},  # 980 <= 900 * 1.1 = 990
        {"1:api": 340, "2:engine": 850, "4:new": 520},  # 340 > 301 * 1.1
    )
    v = soak.memory_verdicts(report, 0.10)
    assert v["2:engine"]["flat"] is True and v["2:engine"]["first_max_mib"] == 900 and v["2:engine"]["second_max_mib"] == 980
    assert v["1:api"]["flat"] is False and round(v["1:api"]["limit_mib"], 1) == 331.1
    assert v["3:old"]["flat"] is None and v["4:new"]["flat"] is None  # not alive in both halves
    assert soak.memory_verdicts(report, 0.0)["2:engine"]["flat"] is False


def test_odd_minutes_put_the_middle_one_in_the_second_half():
    soak = load_soak()
    v = soak.memory_verdicts(rows({"e": 100}, {"e": 200}, {"e": 105}), 0.10)
    assert v["e"]["first_max_mib"] == 100 and v["e"]["second_max_mib"] == 200 and v["e"]["flat"] is False
