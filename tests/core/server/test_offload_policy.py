"""``mstar_offload_preprocess`` decides, per request, where preprocessing runs: ``None``
(no opinion) and ``True`` send it to the preprocess pool, ``False`` keeps it inline in the
API process, and a server without a pool runs everything inline."""

from __future__ import annotations

import asyncio

import pytest
from mstar.api.adapter import CHAT
from mstar.api.protocol import ChatCompletionRequest
from mstar.server.preprocess import PreprocessPool, load_adapter


class Decide:
    """The hook relay's one method: answers per request, by its text."""

    def mstar_offload_preprocess(self, model_name, request):
        return {"pool": True, "inline": False}.get(request.messages[0].content)


class Spy:
    """The API process's adapter, counting the requests it prepared itself (the pool's
    workers load their own adapter and never touch this one)."""

    def __init__(self, adapter) -> None:
        self.adapter = adapter
        self.inline: list[str] = []

    def __getattr__(self, name):
        return getattr(self.adapter, name)

    def chat_inputs(self, request):
        self.inline.append(request.messages[0].content)
        return self.adapter.chat_inputs(request)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from mstar_toy.checkpoint import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("toy"))


def chat(text: str) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="toy", messages=[{"role": "user", "content": text}])


def test_the_hook_decides_pool_or_inline(ckpt):
    _, adapter = load_adapter("toy", ckpt)
    spy = Spy(adapter)
    pool = PreprocessPool("toy", ckpt, spy, Decide(), workers=1)
    pool.start()

    async def run():
        await pool.warm_up()
        return [await pool.run(CHAT, chat(text)) for text in ("no opinion", "pool", "inline")]

    try:
        outs = asyncio.run(run())
    finally:
        pool.shutdown()
    assert spy.inline == ["inline"]  # only the vetoed request stayed in this process
    expected = [adapter.chat_inputs(chat(t)).inputs["prompt_ids"].tolist() for t in ("no opinion", "pool", "inline")]
    assert [o.inputs["prompt_ids"].tolist() for o in outs] == expected


def test_without_a_pool_everything_is_inline(ckpt):
    _, adapter = load_adapter("toy", ckpt)
    spy = Spy(adapter)
    pool = PreprocessPool("toy", ckpt, spy, Decide(), workers=0)
    for text in ("no opinion", "pool", "inline"):
        asyncio.run(pool.run(CHAT, chat(text)))
    assert spy.inline == ["no opinion", "pool", "inline"]
