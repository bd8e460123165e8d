"""``Execution`` against a runtime of fakes: timeout, admission release, abort on close."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import torch
from mstar.api.adapter import ApiAdapter, EngineRequest
from mstar.api.errors import ApiError
from mstar.server.admission import Admission
from mstar.server.execution import Execution
from mstar.server.messages import AbortRequest
from mstar.server.metrics import ServerMetrics
from mstar.server.router import Router
from mstar.server.tensor_codec import TensorCodec


class SilentEngine:
    name = "0"
    down_reason = None
    alive = serving = True

    def __init__(self) -> None:
        self.sent: list = []

    def send(self, cmd) -> None:
        self.sent.append(cmd)


class Preprocess:
    async def run(self, endpoint, request, request_id="", voice=None):
        return EngineRequest({"ids": torch.tensor([1, 2])})


def runtime(timeout: float):
    engine = SilentEngine()
    return SimpleNamespace(
        node_samplers={},
        adapter=ApiAdapter(),
        admission=Admission(1, 0),
        preprocess=Preprocess(),
        graph=SimpleNamespace(request_inputs=("ids",)),
        router=Router({"0": engine}, {}, TensorCodec("mstar_exectest_")),
        config=SimpleNamespace(request_timeout_s=timeout),
        metrics=ServerMetrics(),
    ), engine


def test_timeout_fails_with_504_aborts_and_frees_the_slot():
    rt, engine = runtime(0.2)

    async def run():
        ex = Execution(rt, "generate")
        await ex.start(object(), None, None)
        assert rt.admission.running == 1
        with pytest.raises(ApiError) as err:
            async for _ in ex.batches():
                pass
        ex.close()
        return err.value

    err = asyncio.run(run())
    assert err.status == 504 and "timed out" in err.message
    assert isinstance(engine.sent[-1], AbortRequest)
    assert rt.admission.running == 0 and rt.router.streams == {}


def test_full_admission_is_429_before_any_engine_work():
    rt, engine = runtime(0)

    async def run():
        first = Execution(rt, "generate")
        await first.start(object(), None, None)
        with pytest.raises(ApiError) as err:
            await Execution(rt, "generate").start(object(), None, None)
        first.close()
        return err.value

    assert asyncio.run(run()).status == 429
    assert len([c for c in engine.sent if not isinstance(c, AbortRequest)]) == 1
    assert rt.admission.running == 0
