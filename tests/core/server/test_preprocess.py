from __future__ import annotations

import asyncio

import pytest
from mstar.api.adapter import CHAT, GENERATE
from mstar.api.errors import ApiError
from mstar.api.protocol import ChatCompletionRequest, GenerateRequest
from mstar.server.preprocess import PreprocessPool, load_adapter


class Hook:
    def __init__(self, decision):
        self.decision = decision
        self.calls = 0

    def mstar_offload_preprocess(self, model_name, request):
        self.calls += 1
        return self.decision


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from mstar_toy.checkpoint import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("toy"))


def chat(content) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="toy", messages=[{"role": "user", "content": content}])


def test_pool_and_inline_agree_and_failures_fail_alone(ckpt):
    _, adapter = load_adapter("toy", ckpt)
    hook = Hook(None)  # no decision: offload
    pool = PreprocessPool("toy", ckpt, adapter, hook, workers=1)
    pool.start()

    async def run():
        await pool.warm_up()
        pooled = await pool.run(CHAT, chat("hello"))
        bad = [{"type": "image_url", "image_url": {"url": "x"}}]
        with pytest.raises(ApiError) as err:
            await pool.run(CHAT, chat(bad))
        again = await pool.run(CHAT, chat("hello"))  # the pool still serves
        hook.decision = False
        inline = await pool.run(CHAT, chat("hello"))
        return pooled, err.value, again, inline

    try:
        pooled, err, again, inline = asyncio.run(run())
    finally:
        pool.shutdown()
    assert err.status == 400 and "text parts only" in err.message
    assert (pooled.inputs["prompt_ids"] == inline.inputs["prompt_ids"].numpy()).all()
    assert (again.inputs["prompt_ids"] == pooled.inputs["prompt_ids"]).all()
    assert pooled.prompt_tokens == inline.prompt_tokens > 0
    assert hook.calls == 4


def test_no_pool_runs_inline_and_generate_decodes_tensors(ckpt):
    _, adapter = load_adapter("toy", ckpt)
    pool = PreprocessPool("toy", ckpt, adapter, Hook(None), workers=0)
    req = GenerateRequest(model="toy", inputs={"prompt_ids": [256, 1]})
    out = asyncio.run(pool.run(GENERATE, req))
    assert out.inputs["prompt_ids"].tolist() == [256, 1]
    with pytest.raises(ApiError) as err:
        asyncio.run(pool.run(GENERATE, GenerateRequest(model="toy", inputs={"x": {"dtype": "nope", "shape": [1], "data": ""}})))
    assert err.value.param == "inputs.x"
