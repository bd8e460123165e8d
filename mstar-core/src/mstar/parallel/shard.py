"""Split a loaded node's shared layers over a tensor-parallel group, in place.

Plugins build their nodes as for one device; the engine calls ``shard_module``, which
rewrites the modules it knows (``mstar.layers``' attention and gated MLP, ``embed_tokens``,
``lm_head``) into their rank's part: while the factory builds the node (its
``mstar.weights.materialize`` or ``load_weights`` call, ``mstar.weights.sharding``), so the
rank reads only its part of each split tensor from the checkpoint, and again after the
factory returns, for a factory that calls neither:

- attention: each rank keeps ``num_heads / N`` query heads and the key/value heads they read
  (``num_kv_heads / N``; with fewer key/value heads than ranks, the one its query heads share,
  so it is held by several ranks); ``o_proj`` becomes row-parallel (a sum over ranks);
- gated MLP: ``intermediate / N`` columns of gate and up, ``down_proj`` row-parallel;
- ``embed_tokens`` (an ``nn.Embedding`` of that name at any depth, HF's name for the token
  embedding): ``vocab / N`` rows; each rank looks up the ids in its rows, zeros for the rest,
  and the ranks' lookups are summed (one term is nonzero, so the sum is the row itself). The
  node must use it by calling it, or its weight only through ``vocab_logits`` (a tied head);
- ``lm_head``: ``vocab / N`` rows, the logits gathered so every rank has all of them (each
  rank's sampler then draws the same tokens from the same seeds), whether the node calls the
  module or passes its weight to ``mstar.layers.vocab_logits``; a head tied to a split
  ``embed_tokens`` shares its rows (the same parameter), a head tied to any other embedding
  gets its own. A node computing logits from the weight any other way must not have a module
  named ``lm_head``.

Other embeddings (codec codebooks, a plugin's own names), norms and every other module stay
whole on every rank. Each split parameter records what it holds (``split_parameter``:
``mstar_shards``). Numerics: a row-parallel layer sums N partial products, a
different order than one device, so outputs differ from N = 1 by float rounding (about 1e-6
relative in float32); the embeddings are exact (up to the sign of a zero).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mstar.layers.attention import PagedSelfAttention
from mstar.layers.mlp import GatedMLP
from mstar.layers.packed_linear import linear
from mstar.parallel.group import TensorParallelGroup


class _Split(nn.Module):
    """A module holding this rank's part of a linear or embedding: its weight carries the
    group under ``_mark`` (code computing from the parameter reads it), put back whenever
    ``to``/``to_empty`` replace the parameter."""

    _mark = ""

    def _apply(self, fn, recurse: bool = True):  # noqa: ANN001, ANN202 - nn.Module's signature
        super()._apply(fn, recurse)
        setattr(self.weight, self._mark, self.tp)
        return self


class RowParallelLinear(_Split):
    """This rank's input columns of a linear; the partial products summed over the ranks,
    the bias added once after the sum. Its weight carries the group
    (``mstar_row_parallel``), so model code that computes the layer from its parameters
    through ``mstar.layers.packed_linear.linear`` sums too."""

    _mark = "mstar_row_parallel"

    def __init__(self, full: nn.Linear, tp: TensorParallelGroup) -> None:
        super().__init__()
        self.tp = tp
        split_parameter(self, "weight", full.weight, 1, equal_part(full.weight.shape[1], tp))
        setattr(self.weight, self._mark, tp)
        # Registered even when None, as nn.Linear does: model code reads _parameters["bias"].
        bias = None if full.bias is None else nn.Parameter(full.bias.data.clone(), requires_grad=False)
        self.register_parameter("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


class GatheredColumnLinear(_Split):
    """This rank's output rows of a linear; the outputs gathered along the last dim. Its
    weight carries the group (``mstar_tensor_parallel``), so a node that computes its logits
    from the weight (``mstar.layers.vocab_logits``) gathers them too."""

    _mark = "mstar_tensor_parallel"

    def __init__(self, full: nn.Linear, tp: TensorParallelGroup) -> None:
        super().__init__()
        self.tp = tp
        rows = equal_part(full.weight.shape[0], tp)
        split_parameter(self, "weight", full.weight, 0, rows)
        setattr(self.weight, self._mark, tp)
        self.register_parameter("bias", None)
        if full.bias is not None:
            split_parameter(self, "bias", full.bias, 0, rows)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_gather(linear(x, self.weight, self.bias), dim=-1)


class VocabParallelEmbedding(_Split):
    """This rank's rows of an embedding table: ids outside them look up zeros, and the
    ranks' lookups are summed, so every rank gets every id's row. Its weight carries the
    group (``mstar_tensor_parallel``), so a head tied to it gathers its logits through
    ``mstar.layers.vocab_logits``."""

    _mark = "mstar_tensor_parallel"

    def __init__(self, full: nn.Embedding, tp: TensorParallelGroup) -> None:
        super().__init__()
        if full.max_norm is not None:
            raise ValueError("an embedding with max_norm cannot be split over tensor-parallel ranks")
        self.tp = tp
        self.num_embeddings, self.embedding_dim = full.num_embeddings, full.embedding_dim
        rows = equal_part(full.num_embeddings, tp)
        split_parameter(self, "weight", full.weight, 0, rows)
        setattr(self.weight, self._mark, tp)
        self.start = rows[0][0]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        outside = (local < 0) | (local >= self.weight.shape[0])
        rows = F.embedding(local.masked_fill(outside, 0), self.weight)
        return self.tp.all_reduce(rows.masked_fill_(outside.unsqueeze(-1), 0.0))


Spans = tuple[tuple[int, int], ...]


def equal_part(n: int, tp: TensorParallelGroup) -> Spans:
    """This rank's span of ``n`` split evenly over the ranks."""
    if n % tp.size:
        raise ValueError(f"cannot split {n} over {tp.size} tensor-parallel ranks")
    part = n // tp.size
    return ((tp.rank * part, (tp.rank + 1) * part),)


def split_parameter(module: nn.Module, name: str, full: torch.Tensor, dim: int, spans: Spans) -> nn.Parameter:
    """Set ``module.<name>`` to the ``spans`` of ``full`` along ``dim``, side by side, and
    record it in ``module.mstar_shards`` (``mstar.weights.sharding``): on the meta device
    (a ``materialize``d build) nothing is copied, and ``load_weights`` then reads only these
    spans from the checkpoint. For a plugin's own module's ``shard_tensor_parallel``."""
    pieces = [full.data.narrow(dim, a, b - a) for a, b in spans]
    param = nn.Parameter(torch.cat(pieces, dim) if len(pieces) > 1 else pieces[0].clone(), requires_grad=False)
    setattr(module, name, param)
    shards = module.__dict__.setdefault("mstar_shards", {})
    shards[name] = (tuple(full.shape), dim, tuple(spans))
    return param


def _rows(full: nn.Linear, spans: Spans) -> nn.Linear:
    """A linear keeping the given row spans of ``full``'s output, in order."""
    size = sum(b - a for a, b in spans)
    out = nn.Linear(full.in_features, size, bias=full.bias is not None, device="meta")
    split_parameter(out, "weight", full.weight, 0, spans)
    if full.bias is not None:
        split_parameter(out, "bias", full.bias, 0, spans)
    return out


def local_kv_heads(num_kv_heads: int, size: int) -> int:
    """Key/value heads a rank holds: ``num_kv_heads / size``, or 1 (replicated) when there
    are fewer than ranks."""
    if num_kv_heads >= size:
        if num_kv_heads % size:
            raise ValueError(f"{num_kv_heads} key/value heads do not split over {size} tensor-parallel ranks")
        return num_kv_heads // size
    if size % num_kv_heads:
        raise ValueError(f"{size} tensor-parallel ranks do not share {num_kv_heads} key/value heads evenly")
    return 1


def shard_attention_heads(attn: nn.Module, tp: TensorParallelGroup) -> None:
    """Keep this rank's heads of an attention module with HF's layout: ``q_proj``/``k_proj``/
    ``v_proj`` (or one ``qkv_proj``), ``o_proj`` (made row-parallel) and ``num_heads``/
    ``num_kv_heads``/``head_dim`` attributes (updated; ``sizes`` too when present). For a
    plugin's own attention class: call it from its ``shard_tensor_parallel(tp)``."""
    hq, hkv, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
    if hq % tp.size:
        raise ValueError(f"{hq} attention heads do not split over {tp.size} tensor-parallel ranks")
    q_local, kv_local = hq // tp.size, local_kv_heads(hkv, tp.size)
    q0 = tp.rank * q_local
    kv0 = q0 // (hq // hkv)  # the first key/value head this rank's query heads read
    q_span, kv_span = (q0 * d, (q0 + q_local) * d), (kv0 * d, (kv0 + kv_local) * d)
    if "qkv_proj" in attn._modules:
        k_off, v_off = hq * d, (hq + hkv) * d
        attn.qkv_proj = _rows(attn.qkv_proj, [q_span, (k_off + kv_span[0], k_off + kv_span[1]),
                                              (v_off + kv_span[0], v_off + kv_span[1])])
    else:
        attn.q_proj, attn.k_proj, attn.v_proj = _rows(attn.q_proj, [q_span]), _rows(attn.k_proj, [kv_span]), _rows(attn.v_proj, [kv_span])
    attn.o_proj = RowParallelLinear(attn.o_proj, tp)
    attn.num_heads, attn.num_kv_heads = q_local, kv_local
    if hasattr(attn, "sizes"):
        attn.sizes = [q_local * d, kv_local * d, kv_local * d]


def _shard_mlp(mlp: GatedMLP, tp: TensorParallelGroup) -> None:
    if "gate_up_proj" in mlp._modules:
        inter = mlp.gate_up_proj.out_features // 2
        part = inter // tp.size
        a = tp.rank * part
        mlp.gate_up_proj = _rows(mlp.gate_up_proj, [(a, a + part), (inter + a, inter + a + part)])
    else:
        part = mlp.gate_proj.out_features // tp.size
        span = [(tp.rank * part, (tp.rank + 1) * part)]
        mlp.gate_proj, mlp.up_proj = _rows(mlp.gate_proj, span), _rows(mlp.up_proj, span)
    mlp.down_proj = RowParallelLinear(mlp.down_proj, tp)


def shard_module(module: nn.Module, tp: TensorParallelGroup) -> dict[str, int]:
    """Rewrite ``module``'s attention, gated MLPs, ``embed_tokens`` and ``lm_head`` into this
    rank's part; how many of each it holds split. A module with none of them stays whole
    (replicated). A plugin's own module opts in with ``shard_tensor_parallel(tp) ->
    "attention" | "mlp" | "embedding"`` (e.g. calling ``shard_attention_heads`` or
    ``split_parameter``): it shards itself, and says what it was. Idempotent: what is split
    already stays as it is (the engine may split a node during its factory's loading,
    ``mstar.weights.sharding``, and calls this again after)."""
    for sub in list(module.modules()):
        if getattr(sub, "mstar_split", None) is not None:
            continue
        custom = getattr(sub, "shard_tensor_parallel", None)
        if custom is not None:
            sub.mstar_split = custom(tp)
        elif isinstance(sub, PagedSelfAttention):
            shard_attention_heads(sub, tp)
            sub.mstar_split = "attention"
        elif isinstance(sub, GatedMLP):
            _shard_mlp(sub, tp)
            sub.mstar_split = "mlp"
    split: dict[int, nn.Parameter] = {}  # id(a split table's full weight) -> this rank's rows
    for parent in list(module.modules()):  # the token embedding, at any depth
        table = parent._modules.get("embed_tokens")
        if type(table) is nn.Embedding and table.num_embeddings % tp.size == 0:
            parent.embed_tokens = VocabParallelEmbedding(table, tp)
            split[id(table.weight)] = parent.embed_tokens.weight
    for parent in list(module.modules()):  # a head named lm_head at any depth
        head = parent._modules.get("lm_head")
        if isinstance(head, nn.Linear):
            sharded = GatheredColumnLinear(head, tp)
            if id(head.weight) in split:  # tied to a split embedding: the same rows, held once
                sharded.weight = split[id(head.weight)]
            parent.lm_head = sharded
    counts = {"attention": 0, "mlp": 0, "embedding": 0, "lm_head": 0}
    for sub in module.modules():
        kind = getattr(sub, "mstar_split", None)
        if isinstance(sub, VocabParallelEmbedding):
            kind = "embedding"
        elif isinstance(sub, GatheredColumnLinear):
            kind = "lm_head"
        if kind is not None:
            counts[kind] += 1
    return counts
