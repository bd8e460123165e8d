"""Tensor parallelism on CPU: two ranks over gloo, each its own process and engine, a model's
attention heads, MLP columns and LM head rows split between them (mstar.parallel.shard), the
follower stepping with rank 0 (mstar.engine.lockstep). Greedy ids equal one device's, logits
within 1e-5 (Orpheus: its audio too), also under preemption (both sides given the same
number of KV blocks).

Models: the text LM fixture (its head a module call) and Orpheus (its head through
``mstar.layers.vocab_logits`` on the weight, a 156,940-token vocabulary, SNAC kept whole)."""

from __future__ import annotations

import multiprocessing as mp
import socket
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"
TOKENS = 24
# Each model's KV node and the bytes of one 16-position block of it on one device: 2 layers x
# K,V x 2 kv heads x head_dim (16; Qwen3-TTS's talker 8) x 16 positions x 4 bytes; a rank
# holds one kv head, half of it.
KV_NODE = {"text": ("lm", 2 * 2 * 2 * 16 * 16 * 4), "orpheus": ("lm", 2 * 2 * 2 * 16 * 16 * 4),
           "qwen3tts": ("talker", 2 * 2 * 2 * 8 * 16 * 4), "qwen3omni": ("thinker", 0)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _requests(model: str, ckpt: Path, n: int) -> list[dict]:
    g = torch.Generator().manual_seed(7)
    if model == "qwen3tts":
        from mstar_qwen3tts.config import Qwen3TTSConfig, load_config
        from mstar_qwen3tts.prompt import assistant_text, build_prompt
        from mstar_qwen3tts.text_tokenizer import encode, load_tokenizer

        cfg, tok = Qwen3TTSConfig.from_dict(load_config(ckpt)), load_tokenizer(ckpt)
        texts = ["Hello there.", "A quick brown fox jumps.", "Seven owls.", "Good night, moon.", "Yes", "The end of it all."]
        return [{"inputs": build_prompt(cfg, encode(tok, assistant_text(texts[i % len(texts)])), "vivian", "auto", True).inputs(),
                 "sampling": {"talker": {"main": {"temperature": 0.0, "max_tokens": TOKENS}, "aux": {"code_predictor": {"temperature": 0.0}}}},
                 "kwargs": {"return_logits": True}} for i in range(n)]
    if model == "orpheus":
        from mstar_orpheus.config import load_config
        from mstar_orpheus.prompt import SpeechPrompt

        speech = SpeechPrompt.from_config(load_config(ckpt), ckpt)
        words = ["the quick brown fox", "jumps over", "a lazy dog while seven tired owls", "sing", "quietly now", "hello"]
        prompts = [speech.encode(words[i % len(words)] * (1 + i % 3), "tara") for i in range(n)]
        sampling = {"temperature": 0, "repetition_penalty": 1.0, "top_p": 1.0, "max_tokens": TOKENS}
    else:
        prompts = [torch.randint(0, 383, (5 + 3 * i,), generator=g) for i in range(n)]
        sampling = {"temperature": 0, "max_tokens": TOKENS, "ignore_eos": True}
    return [{"inputs": {"prompt_ids": p}, "sampling": sampling, "kwargs": {"return_logits": True}} for p in prompts]


def _engine(model: str, ckpt: Path, kv_budget: int, **tp: object):
    from mstar import Engine
    from mstar.engine.builder import EngineConfig, build_core

    options = {"dtype": "float32", "kv_budget_bytes": kv_budget, "block_size": 16, "max_num_seqs": 16, **tp}
    if model in ("orpheus", "qwen3tts", "qwen3omni"):
        return Engine.from_model(model, weights=ckpt, **options)
    sys.path.insert(0, str(BENCHMARKS))
    from text_lm_overhead import load_text_plugin

    loaded = load_text_plugin()
    return Engine(build_core(loaded, ckpt, EngineConfig(**options)), loaded, ckpt)


def _run(engine, model: str, requests: list[dict]) -> dict:
    results = engine.run_batch(requests)
    assert all(r.error is None for r in results), [r.error for r in results]
    token = {"orpheus": "token", "qwen3tts": "codes"}.get(model, "tokens")
    return {
        "tokens": [r.cat(token).tolist() for r in results],
        "codes": [r.cat("codes").tolist() for r in results],
        # numpy: pickled through the queue, not shared memory the child takes with it
        # per step (a spoken answer's Thinker and Talker logits have different vocabularies)
        "logits": [[x.numpy() for x in r.signals["logits"]] for r in results],
        "audio": [r.cat("audio").numpy() if "audio" in r.signals else None for r in results],
        "preemptions": engine.core.stats.preemptions,
        "steps": engine.core.stats.steps,
    }


def _rank(model: str, rank: int, size: int, port: int, ckpt: str, kv_budget: int, requests: list[dict], out: mp.Queue,
          options: dict) -> None:
    torch.set_num_threads(1)
    try:
        engine = _engine(model, Path(ckpt), kv_budget, tensor_parallel_size=size, tensor_parallel_rank=rank,
                         tensor_parallel_init=f"tcp://127.0.0.1:{port}", **options)
        from mstar.parallel.shard import VocabParallelEmbedding

        sub = engine.core.nodes[KV_NODE[model][0]].submodule
        # This rank's key/value heads, and the rows it holds of each split token embedding.
        heads = (engine.core.nodes[KV_NODE[model][0]].kv.num_kv_heads,
                 {n: (m.start, m.weight.shape[0], m.num_embeddings) for n, m in sub.named_modules()
                  if isinstance(m, VocabParallelEmbedding)},
                 # MoE blocks: (first expert, experts held, expert rows of its weights)
                 {(m.first_expert, m.local_experts, m.gate_up.shape[0]) for m in sub.modules() if hasattr(m, "local_experts")})
        if rank == 0:
            got = _run(engine, model, requests)
            engine.close()
            out.put((rank, heads, got))
        else:
            out.put((rank, heads, {"steps": engine.follow()}))
    except BaseException as exc:  # reported to the test, not lost in the child
        out.put((rank, None, repr(exc)))
        raise


def _tensor_parallel(model: str, ckpt: Path, kv_budget: int, requests: list[dict], size: int = 2, **options: object) -> dict[int, tuple]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(model, r, size, port, str(ckpt), kv_budget, requests, out, options)) for r in range(size)]
    for p in procs:
        p.start()
    got = {}
    for _ in range(size):
        rank, heads, result = out.get(timeout=300)
        got[rank] = (heads, result)
    for p in procs:
        p.join(timeout=60)
    assert all(v[0] is not None for v in got.values()), got
    return got


@pytest.fixture(scope="module")
def text_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    sys.path.insert(0, str(BENCHMARKS))
    from text_lm_overhead import write_checkpoint

    # 4 query heads and 2 key/value heads: one of each key/value head per rank.
    return write_checkpoint(tmp_path_factory.mktemp("tp-ckpt"), 64, 2, 384, 512)


@pytest.fixture(scope="module")
def qwen3tts_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mstar_qwen3tts.tiny_checkpoint import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("tp-qwen3tts"))


@pytest.fixture(scope="module")
def orpheus_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mstar_orpheus.checkpoint import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("tp-orpheus"), seed=1, snac={"noise": False})


@pytest.mark.parametrize("preempt", [False, True])
@pytest.mark.parametrize("model", ["text", "orpheus", "qwen3tts"])
def test_two_ranks_equal_one_device(model: str, preempt: bool, request: pytest.FixtureRequest) -> None:
    ckpt = request.getfixturevalue(f"{model}_ckpt")
    n = 6
    node, block_bytes = KV_NODE[model]
    one_budget = (12 if preempt else 200) * block_bytes  # the same number of blocks each way
    one = _engine(model, ckpt, one_budget)
    assert one.core.nodes[node].kv.num_blocks == one_budget // block_bytes
    requests = _requests(model, ckpt, n)
    want = _run(one, model, requests)
    one.close()
    got = _tensor_parallel(model, ckpt, one_budget // 2, requests)
    _assert_equal(got, want, preempt, set() if model == "qwen3tts" else {"model.embed_tokens"})  # its tables have other names


def _assert_equal(got: dict[int, tuple], want: dict, preempt: bool, embeddings: set[str]) -> None:
    ((heads0, tables0, _), lead), ((heads1, tables1, _), follower) = got[0], got[1]
    assert heads0 == heads1 == 1  # each rank holds one of the two key/value heads
    # The token embedding (where the node has one named embed_tokens): each rank half of it.
    assert tables0.keys() == tables1.keys() == embeddings
    for name, (start, rows, full) in tables0.items():
        assert (start, rows) == (0, full // 2) and tables1[name] == (full // 2, full // 2, full)
    assert lead["tokens"] == want["tokens"] and lead["codes"] == want["codes"]
    assert all(len(t) > 0 for t in lead["tokens"])
    for steps, want_steps in zip(lead["logits"], want["logits"], strict=True):
        assert len(steps) == len(want_steps) > 0
        for a, b in zip(steps, want_steps, strict=True):
            torch.testing.assert_close(torch.from_numpy(a), torch.from_numpy(b), rtol=1e-5, atol=1e-5)
    for a, b in zip(lead["audio"], want["audio"], strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(torch.from_numpy(a), torch.from_numpy(b), rtol=1e-5, atol=1e-5)
    assert follower["steps"] == lead["steps"] >= TOKENS  # the follower stepped with rank 0, every step
    assert (lead["preemptions"] > 0) == preempt and lead["preemptions"] == want["preemptions"]


@pytest.fixture(scope="module")
def qwen3omni_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mstar_qwen3omni.tiny_checkpoint import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("tp-qwen3omni"))


@pytest.mark.parametrize(("preempt", "experts"), [(False, False), (True, False), (False, True)])
def test_qwen3omni_thinker_and_talker_on_two_ranks(qwen3omni_ckpt: Path, preempt: bool, experts: bool) -> None:
    """Spoken answers (Thinker -> Talker + code predictor -> Code2Wav) to a text, an image and
    an audio question: the Thinker's and Talker's attention heads, MLPs and MoE experts'
    columns split over two ranks (encoders, code predictor and Code2Wav whole). Text ids and
    codec codes equal one device, logits and audio within 1e-5; with a Thinker cache that
    holds the longest request and one block more, under preemption too."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "qwen3omni"))
    from thinker_reference import make_cases

    cases = make_cases(qwen3omni_ckpt)
    sampling = {"thinker": {"temperature": 0, "max_tokens": 6},
                "talker": {"main": {"temperature": 0, "max_tokens": 12, "min_tokens": 6},
                           "aux": {"code_predictor": {"temperature": 0}}}}
    requests = []
    for name, media in (("text", []), ("image", ["image"]), ("audio", ["audio"])):
        c = cases[name]
        requests.append({"inputs": {"prompt_ids": torch.tensor(c.prompt), **c.hf_inputs}, "sampling": sampling,
                         "kwargs": {"modalities": ["text", "audio"], "voice": "Chelsie", "media": media, "return_logits": True}})
    budget = 1 << 24
    if preempt:  # the KV budget is split between the Thinker and the Talker, equally
        probe = _engine("qwen3omni", qwen3omni_ckpt, budget)
        per_block = max(probe.core.nodes[n].kv.block_bytes for n in ("thinker", "talker"))
        probe.close()
        longest = max(r["inputs"]["prompt_ids"].numel() for r in requests)
        budget = 2 * per_block * (-(-(longest + 8) // 16) + 1)
    one = _engine("qwen3omni", qwen3omni_ckpt, budget)
    want = _run(one, "qwen3omni", requests)
    one.close()
    assert all(len(c) > 0 for c in want["codes"]) and all(a is not None for a in want["audio"])
    got = _tensor_parallel("qwen3omni", qwen3omni_ckpt, budget // 2, requests, expert_parallel=experts)
    _assert_equal(got, want, preempt, {"lm.model.embed_tokens"})
    # expert_parallel: each rank holds half the experts whole; else all, each split by columns
    moe0, moe1 = got[0][0][2], got[1][0][2]
    assert len(moe0) == len(moe1) == 1  # every Thinker MoE layer alike
    ((first0, held0, rows0),), ((first1, held1, rows1),) = moe0, moe1
    assert held0 == held1 == rows0 == rows1 and first0 == 0
    assert (first1 == held0) if experts else (first1 == 0)
