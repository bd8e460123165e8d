"""mstar.weights.load_weights: the one strict loader (names, fused/split and stacked
tensors, ties, casting, shards, torch files, weight norm, and its one error)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from mstar.testing.sharding import shard_checkpoint
from mstar.weights import (
    CheckpointMismatchError,
    Packed,
    SafetensorsSource,
    Stacked,
    WeightNormFolded,
    check_weights,
    load_weights,
    torch_file,
)
from safetensors.torch import save_file
from torch import nn

QKV = Packed("qkv_proj", ("q_proj", "k_proj", "v_proj"))
GATE_UP = Packed("gate_up_proj", ("gate_proj", "up_proj"))


def save(path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def filled(module: nn.Module, value: float = 7.0) -> nn.Module:
    with torch.no_grad():
        for t in module.state_dict().values():
            t.fill_(value)
    return module


class Split(nn.Module):
    """q/k/v and gate/up as separate linears (grouped-query sizes: q wider than k and v)."""

    def __init__(self) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(8, 8), nn.Linear(8, 4), nn.Linear(8, 4)
        self.gate_proj, self.up_proj = nn.Linear(8, 6, bias=False), nn.Linear(8, 6, bias=False)


class Fused(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv_proj = nn.Linear(8, 16)
        self.gate_up_proj = nn.Linear(8, 12, bias=False)


def split_state(seed: int = 0) -> dict[str, torch.Tensor]:
    return {k: randn(*v.shape, seed=seed + i) for i, (k, v) in enumerate(Split().state_dict().items())}


def test_prefix_skip_and_a_tie_need_one_name(tmp_path: Path) -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(10, 4)
            self.head = nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight

    table = randn(10, 4)
    ckpt = save(tmp_path / "ckpt", {"model.embed.weight": table, "other.x": torch.zeros(1)})
    dst = Tied()
    load_weights(dst, ckpt, prefix="model.")  # skip=None: other.x is another component's
    assert torch.equal(dst.head.weight, table) and dst.head.weight is dst.embed.weight
    load_weights(Tied(), ckpt, prefix="model.", skip=("other.",))
    with pytest.raises(CheckpointMismatchError, match=r"unexpected keys \(1\): \['other.x'\]"):
        load_weights(Tied(), ckpt, prefix="model.", skip=())  # strict outside the prefix too
    with pytest.raises(CheckpointMismatchError, match=r"missing keys \(1\): \[\"model.embed.weight \(or tied \['model.head.weight'\]\)\"\]"):
        load_weights(Tied(), save(tmp_path / "none", {"model.x": torch.zeros(1)}), prefix="model.", ignore=[r"^x$"])


def test_skip_inside_the_prefix_and_ignore(tmp_path: Path) -> None:
    lin = nn.Linear(2, 2)
    ckpt = save(tmp_path, {"a.weight": randn(2, 2), "a.bias": randn(2), "a.enc.weight": randn(3),
                           "a.rotary_emb.inv_freq": randn(1)})
    with pytest.raises(CheckpointMismatchError, match=r"unexpected keys \(2\): \['a.enc.weight', 'a.rotary_emb.inv_freq'\]"):
        load_weights(lin, ckpt, prefix="a.")
    load_weights(lin, ckpt, prefix="a.", skip=("a.enc.",), ignore=[r"\.inv_freq$"])
    assert torch.equal(lin.weight, randn(2, 2))


def test_renames_map_checkpoint_names_onto_the_module(tmp_path: Path) -> None:
    state = split_state()
    ckpt = save(tmp_path / "ckpt", {f"module.backbone.blk.{k}": v for k, v in state.items()})
    dst = Split()
    load_weights(dst, ckpt, renames=[(r"^module\.", ""), (r"^backbone\.", ""), (r"^blk\.", "")])
    assert all(torch.equal(dst.state_dict()[k], v) for k, v in state.items())
    with pytest.raises(CheckpointMismatchError, match="renamed onto the same name"):
        load_weights(Split(), save(tmp_path / "clash", {"x.q_proj.weight": randn(8, 8), "y.q_proj.weight": randn(8, 8)}),
                     renames=[(r"^[xy]\.", "")])


def test_fused_module_from_split_checkpoint_and_back(tmp_path: Path) -> None:
    state = split_state()
    fused = Fused()
    load_weights(fused, save(tmp_path / "split", state), packed=[QKV, GATE_UP])
    assert torch.equal(fused.qkv_proj.weight, torch.cat([state["q_proj.weight"], state["k_proj.weight"], state["v_proj.weight"]]))
    assert torch.equal(fused.qkv_proj.bias[8:12], state["k_proj.bias"])
    assert torch.equal(fused.gate_up_proj.weight, torch.cat([state["gate_proj.weight"], state["up_proj.weight"]]))
    split = Split()  # the module's own sizes place each part (q 8 rows, k and v 4)
    load_weights(split, save(tmp_path / "fused", fused.state_dict()), packed=[QKV, GATE_UP])
    assert all(torch.equal(split.state_dict()[k], v) for k, v in state.items())


def test_split_along_another_dim(tmp_path: Path) -> None:
    class Cols(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Parameter(torch.zeros(3, 2))
            self.b = nn.Parameter(torch.zeros(3, 5))

    whole = randn(3, 7)
    dst = Cols()
    load_weights(dst, save(tmp_path, {"ab": whole}), packed=[Packed("ab", ("a", "b"), dim=1)])
    assert torch.equal(dst.a, whole[:, :2]) and torch.equal(dst.b, whole[:, 2:])


def test_stacked_rows_from_one_key_each(tmp_path: Path) -> None:
    class Experts(nn.Module):  # run from stacked tensors, stored one module per expert
        def __init__(self) -> None:
            super().__init__()
            self.gate_up = nn.Parameter(torch.zeros(3, 10, 4))
            self.down = nn.Parameter(torch.zeros(3, 4, 5))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mlp = Experts()

    ckpt = {f"mlp.experts.{e}.{p}.weight": randn(*shape, seed=10 * e + i)
            for e in range(3) for i, (p, shape) in enumerate((("gate_proj", (5, 4)), ("up_proj", (5, 4)), ("down_proj", (4, 5))))}
    rules = dict(stacked=[Stacked("mlp.gate_up", "mlp.experts.{}.gate_up_proj.weight"),
                          Stacked("mlp.down", "mlp.experts.{}.down_proj.weight")], packed=[GATE_UP])
    dst = Block()
    load_weights(dst, save(tmp_path / "ok", ckpt), **rules)
    for e in range(3):
        assert torch.equal(dst.mlp.gate_up[e, :5], ckpt[f"mlp.experts.{e}.gate_proj.weight"])
        assert torch.equal(dst.mlp.gate_up[e, 5:], ckpt[f"mlp.experts.{e}.up_proj.weight"])
        assert torch.equal(dst.mlp.down[e], ckpt[f"mlp.experts.{e}.down_proj.weight"])
    del ckpt["mlp.experts.1.up_proj.weight"]
    with pytest.raises(CheckpointMismatchError, match=r"missing keys \(1\): \['mlp.experts.1.up_proj.weight'\]") as err:
        load_weights(Block(), save(tmp_path / "bad", ckpt), **rules)
    assert "unexpected" not in str(err.value)  # expert 1's gate_proj is expected, only alone


def test_cast_to_each_tensors_own_dtype(tmp_path: Path) -> None:
    state = split_state()
    ckpt = save(tmp_path, state)
    dst = Split().to(torch.bfloat16)
    dst.v_proj.float()  # a part kept in float32 stays float32
    load_weights(dst, ckpt)
    assert dst.q_proj.weight.dtype == torch.bfloat16 and dst.v_proj.weight.dtype == torch.float32
    assert torch.equal(dst.q_proj.weight, state["q_proj.weight"].to(torch.bfloat16))
    assert torch.equal(dst.v_proj.weight, state["v_proj.weight"])
    fused = Fused().to(torch.float16)  # casting into slices of a fused tensor too
    load_weights(fused, ckpt, packed=[QKV, GATE_UP])
    assert torch.equal(fused.qkv_proj.weight[8:12], state["k_proj.weight"].half())


def test_one_error_lists_every_kind_with_counts(tmp_path: Path) -> None:
    class Wide(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(12))

    ckpt = {f"layers.{i}.weight": randn(4, 4) for i in range(12)}  # every bias missing
    ckpt |= {f"extra.{i}": randn(1) for i in range(10)}
    ckpt["layers.3.weight"] = randn(5, 4)
    with pytest.raises(CheckpointMismatchError) as err:
        load_weights(Wide(), save(tmp_path, ckpt))
    message = str(err.value)
    assert "missing keys (12): ['layers.0.bias', 'layers.1.bias', 'layers.10.bias', 'layers.11.bias', 'layers.2.bias', " \
           "'layers.3.bias', 'layers.4.bias', 'layers.5.bias'] +4 more" in message
    assert "unexpected keys (10): ['extra.0', " in message and "] +2 more" in message
    assert "shape mismatches (1): ['layers.3.weight: checkpoint [5, 4] vs model [4, 4]']" in message


def test_nothing_is_copied_when_anything_is_wrong(tmp_path: Path) -> None:
    state = split_state()
    state["v_proj.weight"] = randn(5, 8)  # the last of the file's keys to be read is wrong
    dst = filled(Split())
    with pytest.raises(CheckpointMismatchError, match=r"shape mismatches \(1\): \['v_proj.weight: checkpoint \[5, 8\] vs model \[4, 8\]'\]"):
        load_weights(dst, save(tmp_path / "shape", state))
    assert all(bool((t == 7.0).all()) for t in dst.state_dict().values())
    dst = filled(Split())
    with pytest.raises(CheckpointMismatchError, match="unexpected keys"):
        load_weights(dst, save(tmp_path / "extra", split_state() | {"zz": randn(1)}))
    assert all(bool((t == 7.0).all()) for t in dst.state_dict().values())


def test_packed_shapes_that_do_not_add_up(tmp_path: Path) -> None:
    state = split_state()
    state["k_proj.weight"] = randn(6, 8)  # q 8 + k 6 + v 4 rows != the fused 16
    with pytest.raises(CheckpointMismatchError, match=r"do not stack along dim 0 into model qkv_proj.weight \[16, 8\]"):
        load_weights(Fused(), save(tmp_path / "parts", state), packed=[QKV, GATE_UP])
    fused = Fused().state_dict()
    fused["qkv_proj.weight"] = randn(18, 8)  # the module's parts take only 16 of its rows
    with pytest.raises(CheckpointMismatchError, match=r"qkv_proj.weight: checkpoint \[18, 8\], the module's parts take 16 of its 18"):
        load_weights(Split(), save(tmp_path / "fused", fused), packed=[QKV, GATE_UP])


def test_a_sharded_checkpoint_loads_like_the_single_file(tmp_path: Path) -> None:
    state = split_state()
    single, sharded = save(tmp_path / "single", state), save(tmp_path / "sharded", state)
    shards = shard_checkpoint(sharded, 3)
    assert [p.name for p in shards] == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(state) and set(index["weight_map"].values()) == {p.name for p in shards}
    assert index["metadata"]["total_size"] == sum(v.numel() * 4 for v in state.values())
    assert not (sharded / "model.safetensors").exists()
    a, b = Split(), filled(Split())
    load_weights(a, single)
    load_weights(b, sharded)
    assert all(torch.equal(a.state_dict()[k], v) for k, v in b.state_dict().items())
    (sharded / shards[1].name).unlink()
    with pytest.raises(FileNotFoundError, match="shard"):
        load_weights(Split(), sharded)


def test_safetensors_source_maps_one_file_at_a_time(tmp_path: Path) -> None:
    from safetensors import SafetensorError

    ckpt = save(tmp_path, split_state())
    shard_checkpoint(ckpt, 2)
    source = SafetensorsSource(ckpt)
    handles, keys = [], source.keys()
    for key in keys:
        source.read(key)
        if source._handle not in handles:
            handles.append(source._handle)
    assert len(handles) == 2  # shard by shard, each opened once
    with pytest.raises(SafetensorError, match="closed"):  # the first was closed when the second opened
        handles[0].get_tensor(keys[0])
    source.close()
    with pytest.raises(SafetensorError, match="closed"):
        handles[1].get_tensor(keys[-1])


def test_a_torch_file_memory_mapped_with_nested_dicts(tmp_path: Path) -> None:
    state = split_state()
    torch.save({"model": {f"module.{k}": v for k, v in state.items()}, "epoch": 3}, tmp_path / "ckpt.pt")
    source = torch_file(tmp_path / "ckpt.pt")
    assert set(source.keys()) == {f"model.module.{k}" for k in state}
    dst = Split()
    load_weights(dst, source, prefix="model.", renames=[(r"^module\.", "")])
    assert all(torch.equal(dst.state_dict()[k], v) for k, v in state.items())
    with pytest.raises(CheckpointMismatchError, match=r"ckpt.pt \(keys model.\*\) does not match Split"):
        load_weights(Split(), source, prefix="model.")


@pytest.mark.filterwarnings("ignore:.*torch.nn.utils.weight_norm.*:FutureWarning")
def test_weight_norm_pairs_fold_into_plain_weights(tmp_path: Path) -> None:
    normed = nn.utils.parametrizations.weight_norm(nn.Conv1d(3, 4, 5))
    legacy = nn.utils.weight_norm(nn.Conv1d(3, 4, 5))
    with torch.no_grad():
        for m in (normed, legacy):
            for p in m.parameters():
                p.copy_(randn(*p.shape, seed=p.numel()))
            legacy(torch.zeros(1, 3, 5))  # the legacy hook recomputes .weight on a call
    torch.save({"a": normed.state_dict(), "b": legacy.state_dict()}, tmp_path / "wn.bin")
    source = WeightNormFolded(torch_file(tmp_path / "wn.bin"))
    for name, ref in (("a.", normed), ("b.", legacy)):
        plain = nn.Conv1d(3, 4, 5)
        load_weights(plain, source, prefix=name)
        assert torch.equal(plain.weight, ref.weight) and torch.equal(plain.bias, ref.bias)


def test_a_meta_module_is_refused_but_can_be_checked(tmp_path: Path) -> None:
    with torch.device("meta"):
        lin = nn.Linear(2, 2)
    ckpt = save(tmp_path, {"weight": randn(2, 2), "bias": randn(2)})
    with pytest.raises(ValueError, match="to_empty"):
        load_weights(lin, ckpt)
    check_weights(lin, ckpt)  # names and shapes only
    with pytest.raises(CheckpointMismatchError, match=r"missing keys \(1\): \['weight'\]"):
        check_weights(lin, ckpt, ignore=["weight"])
