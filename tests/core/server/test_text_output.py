from __future__ import annotations

import torch
from mstar.server.text_output import TextAssembler
from mstar_toy.adapter import ByteTextDecoder


def feed_all(asm: TextAssembler, text: bytes) -> str:
    out = "".join(asm.feed(torch.tensor([b])) for b in text)
    return out + asm.finish()


def test_no_stop_passes_everything():
    asm = TextAssembler(ByteTextDecoder())
    assert feed_all(asm, "héllo wörld".encode()) == "héllo wörld"


def test_stop_string_trims_and_never_leaks_a_prefix():
    asm = TextAssembler(ByteTextDecoder(), ["STOP"])
    released = []
    for b in b"abc STO":
        released.append(asm.feed(torch.tensor([b])))
    assert "".join(released) == "abc "  # "STO" held back: it may start the stop string
    assert asm.feed(torch.tensor([ord("P")])) == ""
    assert asm.stopped and asm.text == "abc "
    assert asm.feed(torch.tensor([ord("x")])) == ""


def test_held_text_is_released_when_it_cannot_match():
    asm = TextAssembler(ByteTextDecoder(), ["xyz"])
    assert feed_all(asm, b"axybxy") == "axybxy"
    assert not asm.stopped


def test_earliest_of_several_stops_wins():
    asm = TextAssembler(ByteTextDecoder(), ["cd", "b"])
    assert feed_all(asm, b"abcd") == "a"
