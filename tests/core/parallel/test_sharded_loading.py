"""A tensor-parallel rank reads only its part of each split tensor from the checkpoint
(mstar.weights.sharding): each rank built in one process with a stand-in group, inside the
engine's ``sharded_build``, against the whole node loaded and split afterwards. Orpheus and
Qwen3-Omni's Thinker build on the meta device (``materialize``: nothing whole is ever
allocated; the Thinker's MoE experts split by ``split_parameter``), the text LM fixture on
the CPU (``load_weights`` splits it before reading). With expert parallelism a rank reads
its experts whole and none of the others'."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest
import torch
from mstar.parallel.shard import shard_module
from mstar.plugins.loading import load_model
from mstar.weights import SafetensorsSource
from mstar.weights.sharding import shard_specs, sharded_build
from test_vocab_parallel import OwnPart

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"
NODES = {"orpheus": "lm", "qwen3omni": "thinker", "text": "lm"}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[object, Path]]:
    from mstar_orpheus.checkpoint import write_checkpoint as orpheus
    from mstar_qwen3omni.tiny_checkpoint import write_checkpoint as qwen3omni

    sys.path.insert(0, str(BENCHMARKS))
    from text_lm_overhead import load_text_plugin, write_checkpoint

    return {
        "orpheus": (load_model("orpheus"), orpheus(tmp_path_factory.mktemp("orpheus"), seed=1, snac={"noise": False})),
        "qwen3omni": (load_model("qwen3omni"), qwen3omni(tmp_path_factory.mktemp("qwen3omni"))),
        "text": (load_text_plugin(), write_checkpoint(tmp_path_factory.mktemp("text"), 64, 2, 384, 512)),
    }


def _build(loaded, ckpt: Path, node: str) -> torch.nn.Module:
    config = loaded.spec.load_config(ckpt)
    factory = loaded.hook.mstar_node_factories(config=config)[node]
    return factory(config, ckpt, "cpu", dtype=torch.float32)


@pytest.fixture
def elements_read(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The elements every SafetensorsSource.read returns, as they are read."""
    counts: list[int] = []
    read = SafetensorsSource.read

    def counted(self, key, index=()):  # noqa: ANN001, ANN202
        out = read(self, key, index)
        counts.append(out.numel())
        return out

    monkeypatch.setattr(SafetensorsSource, "read", counted)
    return counts


@pytest.mark.parametrize(("model", "experts"), [("orpheus", False), ("qwen3omni", False), ("qwen3omni", True), ("text", False)])
def test_a_rank_reads_and_holds_only_its_part(model: str, experts: bool, checkpoints, elements_read: list[int]) -> None:
    """``experts``: expert parallelism, the Thinker's MoE experts placed whole on the ranks."""
    loaded, ckpt = checkpoints[model]
    for rank in (0, 1):
        tp = OwnPart(rank, expert_parallel=experts)
        del elements_read[:]
        whole = _build(loaded, ckpt, NODES[model])
        read_whole = sum(elements_read)
        shard_module(whole, tp)  # the old way: everything read, then split
        del elements_read[:]
        with sharded_build(functools.partial(shard_module, tp=tp)):
            part = _build(loaded, ckpt, NODES[model])
        read_part = sum(elements_read)
        got, want = part.state_dict(), whole.state_dict()
        assert got.keys() == want.keys()
        for name, tensor in want.items():
            assert got[name].shape == tensor.shape and torch.equal(got[name], tensor), name
        # What the rank saved reading: the whole of each split tensor less its part.
        specs = shard_specs(part)  # named_parameters: a tied tensor once
        spared = sum(torch.Size(specs[n][0]).numel() - p.numel() for n, p in part.named_parameters() if n in specs)
        assert spared > 0 and read_part == read_whole - spared, (read_part, read_whole, spared)
        # Splitting again changes nothing (the engine calls shard_module after the factory).
        counts = shard_module(part, tp)
        assert counts["attention"] > 0 and counts["mlp"] > 0
        assert all(torch.equal(part.state_dict()[n], t) for n, t in want.items())
