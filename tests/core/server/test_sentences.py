"""The WebSocket speech route's sentence rule (mstar.server.sentences)."""

from __future__ import annotations

import pytest
from mstar.server.sentences import SentenceSplitter


def feed_all(pieces: list[str], max_chars: int = 300) -> list[str]:
    s = SentenceSplitter(max_chars)
    out = [sentence for piece in pieces for sentence in s.feed(piece)]
    return out + s.flush()


def test_ascii_terminators_wait_for_whitespace() -> None:
    s = SentenceSplitter()
    assert s.feed("Hello there.") == []  # "." might be "3.14": the next character decides
    assert s.feed(" How") == ["Hello there."]
    assert s.feed(" are you?! Fine") == ["How are you?!"]
    assert s.flush() == ["Fine"]
    assert s.flush() == []


def test_numbers_and_domains_stay_whole() -> None:
    assert feed_all(["Pi is 3", ".", "14 and example.com is a site. Next"]) == ["Pi is 3.14 and example.com is a site.", "Next"]


def test_closing_quotes_stay_with_their_sentence() -> None:
    assert feed_all(['He said "stop." Then', " left."]) == ['He said "stop."', "Then left."]


def test_newline_ends_a_sentence_at_once() -> None:
    s = SentenceSplitter()
    assert s.feed("A title\n") == ["A title"]
    assert s.feed("line two\n\n") == ["line two"]


def test_cjk_full_stops_need_no_space() -> None:
    assert feed_all(["你好。今天", "天气很好！", "是吗？"]) == ["你好。", "今天天气很好！", "是吗？"]


def test_max_chars_cuts_at_the_last_space_or_hard() -> None:
    assert feed_all(["aaa bbb ccc ddd"], max_chars=9) == ["aaa bbb", "ccc ddd"]
    assert feed_all(["abcdefghij"], max_chars=4) == ["abcd", "efgh", "ij"]


def test_nothing_to_speak_is_dropped() -> None:
    assert feed_all(["... ", "!!\n", "   "]) == []


def test_max_chars_must_be_positive() -> None:
    with pytest.raises(ValueError):
        SentenceSplitter(0)
