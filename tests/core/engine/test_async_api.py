"""``Engine.generate_async``: streams events, equals the sync path, aborts when dropped."""

from __future__ import annotations

import asyncio
import time

from toy_reference import GREEDY, prompts


def test_async_generate_matches_sync_and_streams(make_engine):
    engine = make_engine()
    ps = prompts(4, seed=11)

    async def collect(p):
        toks, audio_before_end = [], False
        async for out in engine.generate_async({"prompt_ids": p}, GREEDY):
            if out.signal == "token":
                toks.append(int(out.data))
            if out.signal == "audio" and not out.finished:
                audio_before_end = audio_before_end or len(toks) < 12
            if out.finished:
                assert out.error is None
        return toks, audio_before_end

    async def main():
        return await asyncio.gather(*(collect(p) for p in ps))

    results = asyncio.run(main())
    sync = [r.cat("token").tolist() for r in engine.run_batch([{"inputs": {"prompt_ids": p}, "sampling": GREEDY} for p in ps])]
    assert [t for t, _ in results] == sync
    assert any(early for _, early in results)


def test_dropping_an_async_stream_aborts_the_request(make_engine):
    engine = make_engine()
    sampling = {"main": {"temperature": 0, "max_tokens": 400, "ignore_eos": True}}

    async def take_three():
        n = 0
        agen = engine.generate_async({"prompt_ids": prompts(1)[0]}, sampling)
        async for out in agen:
            n += out.signal == "token"
            if n == 3:
                break
        await agen.aclose()

    asyncio.run(take_three())
    asyncio.run(take_three())  # the engine thread survives a consumer whose loop closed
    deadline = time.monotonic() + 5
    while engine.core.has_work() and time.monotonic() < deadline:
        time.sleep(0.01)
    kv = engine.core.nodes["lm"].kv
    assert not engine.core.has_work()
    assert kv.num_free_blocks == kv.num_blocks
    assert engine._thread.is_alive() and engine.fatal_error is None
