from __future__ import annotations

import asyncio

import pytest
from mstar.api.errors import ApiError
from mstar.server.admission import Admission


def test_queue_then_429_then_fifo_handover():
    async def run() -> None:
        adm = Admission(max_concurrency=2, max_queue=1)
        await adm.acquire()
        await adm.acquire()
        waiter = asyncio.create_task(adm.acquire())
        await asyncio.sleep(0)
        assert adm.waiting == 1 and not waiter.done()
        with pytest.raises(ApiError) as err:
            await adm.acquire()
        assert err.value.status == 429
        adm.release()
        await waiter
        assert adm.running == 2 and adm.waiting == 0
        adm.release()
        adm.release()
        assert adm.running == 0

    asyncio.run(run())


def test_cancelled_waiter_leaves_the_queue():
    async def run() -> None:
        adm = Admission(max_concurrency=1, max_queue=4)
        await adm.acquire()
        waiter = asyncio.create_task(adm.acquire())
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert adm.waiting == 0
        adm.release()
        assert adm.running == 0

    asyncio.run(run())
