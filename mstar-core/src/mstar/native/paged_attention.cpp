// mstar_native::paged_attention: a compiled layer stack's attention without Python on decode
// steps served by the torch backend's decode buffer (mstar/attention/native_attention.py
// says when). It writes the new K/V into the paged cache and the buffer and runs SDPA with
// the same ATen ops, in the same order, as TorchAttentionBackend.run, KVCacheManager.write
// and DecodeBuffer.keys_values do from Python, so its outputs and caches are theirs bit for
// bit. Any other step (prefill, mixed, no buffer, another dtype) calls the backend's Python
// run with the GIL taken.

#include "native_ops.h"

#include <stdexcept>
#include <string>

namespace mstar_native {
namespace {

struct LayerBuffers {
  at::Tensor k_slots, v_slots;  // [blocks * block_size, Hkv, D]: the paged cache, one row per slot
  at::Tensor k_cache, v_cache;  // [blocks, block_size, Hkv, D]: the same cache by block
  at::Tensor k_read, v_read;    // [B, Hkv, capacity, D]: the buffer as SDPA reads it
  at::Tensor k_rows, v_rows;    // [B * capacity, Hkv, D]: the buffer as rows to write
};

struct DecodeStep {
  std::vector<LayerBuffers> layers;
  at::Tensor slot_mapping;  // [B]
  bool fill = false;        // gather every row's K/V into the buffer (else append the new token)
  at::Tensor fill_blocks;   // [B * capacity / block_size], on fill
  at::Tensor append_index;  // [B]
  int64_t keys = 0;         // keys per row SDPA sees
  std::optional<at::Tensor> mask;  // additive, in the cache's dtype; none when every key counts
};

thread_local std::optional<DecodeStep> step;
thread_local py::object fallback;  // backend.run(layer, q, k, v); null between calls
thread_local std::vector<int64_t> written;

DecodeStep to_step(const py::tuple& t) {
  DecodeStep s;
  for (const py::handle& layer : t[0].cast<py::sequence>()) {
    py::tuple l = layer.cast<py::tuple>();
    s.layers.push_back({l[0].cast<at::Tensor>(), l[1].cast<at::Tensor>(), l[2].cast<at::Tensor>(),
                        l[3].cast<at::Tensor>(), l[4].cast<at::Tensor>(), l[5].cast<at::Tensor>(),
                        l[6].cast<at::Tensor>(), l[7].cast<at::Tensor>()});
  }
  s.slot_mapping = t[1].cast<at::Tensor>();
  s.fill = t[2].cast<bool>();
  if (s.fill) {
    s.fill_blocks = t[3].cast<at::Tensor>();
  }
  s.append_index = t[4].cast<at::Tensor>();
  s.keys = t[5].cast<int64_t>();
  if (!t[6].is_none()) {
    s.mask = t[6].cast<at::Tensor>();
  }
  return s;
}

// TorchAttentionBackend._check_shapes.
void check_shapes(const LayerBuffers& l, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t rows) {
  const int64_t hkv = l.k_slots.size(1), dim = l.k_slots.size(2);
  auto is_kv = [&](const at::Tensor& t) { return t.dim() == 3 && t.size(0) == rows && t.size(1) == hkv && t.size(2) == dim; };
  if (!is_kv(k) || !is_kv(v)) {
    throw std::invalid_argument("k/v must be [T, Hkv, D] = [" + std::to_string(rows) + ", " + std::to_string(hkv) +
                                ", " + std::to_string(dim) + "]");
  }
  if (q.dim() != 3 || q.size(0) != rows || q.size(2) != dim) {
    throw std::invalid_argument("q must be [T=" + std::to_string(rows) + ", Hq, D=" + std::to_string(dim) + "]");
  }
  if (q.size(1) % hkv != 0) {
    throw std::invalid_argument("query heads (" + std::to_string(q.size(1)) + ") must be a multiple of kv heads (" +
                                std::to_string(hkv) + ")");
  }
}

at::Tensor attend(const DecodeStep& s, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t layer) {
  const LayerBuffers& l = s.layers.at(layer);
  check_shapes(l, q, k, v, s.slot_mapping.size(0));
  const at::ScalarType dtype = l.k_slots.scalar_type();
  const bool convert = k.scalar_type() != dtype || v.scalar_type() != dtype;
  const at::Tensor new_k = convert ? k.to(dtype) : k;
  const at::Tensor new_v = convert ? v.to(dtype) : v;
  // KVCacheManager.write
  l.k_slots.index_copy_(0, s.slot_mapping, new_k);
  l.v_slots.index_copy_(0, s.slot_mapping, new_v);
  // DecodeBuffer.keys_values
  if (s.fill) {
    for (auto [rows, cache] : {std::pair{l.k_rows, l.k_cache}, std::pair{l.v_rows, l.v_cache}}) {
      at::Tensor out = rows.view({-1, cache.size(1), cache.size(2), cache.size(3)});
      at::index_select_out(out, cache, 0, s.fill_blocks);
    }
  } else {
    l.k_rows.index_copy_(0, s.append_index, new_k);
    l.v_rows.index_copy_(0, s.append_index, new_v);
  }
  written.push_back(layer);
  const at::Tensor keys = l.k_read.slice(2, 0, s.keys);
  const at::Tensor values = l.v_read.slice(2, 0, s.keys);
  at::Tensor out = at::scaled_dot_product_attention(q.unsqueeze(2), keys, values, s.mask, 0.0, /*is_causal=*/false,
                                                    std::nullopt, /*enable_gqa=*/q.size(1) != keys.size(1));
  return out.squeeze(2);
}

}  // namespace

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t layer) {
  // Native only where the buffer's dtype is the activations' (its mask was made in it).
  if (step && layer >= 0 && layer < static_cast<int64_t>(step->layers.size()) &&
      q.scalar_type() == step->layers[layer].k_slots.scalar_type()) {
    return attend(*step, q, k, v, layer);
  }
  py::gil_scoped_acquire gil;
  if (!fallback) {
    throw std::runtime_error("mstar_native::paged_attention ran with no backend bound (call it through its compiled wrapper)");
  }
  return fallback(layer, q, k, v).cast<at::Tensor>();
}

// decode_step: None (every layer calls fallback) or the tuple of
// TorchAttentionBackend.native_decode_step.
void bind_attention(py::object run, py::object decode_step) {
  step.reset();
  written.clear();
  if (!decode_step.is_none()) {
    step = to_step(decode_step.cast<py::tuple>());
  }
  fallback = std::move(run);
}

std::vector<int64_t> unbind_attention() {
  step.reset();
  fallback = py::object();
  std::vector<int64_t> done;
  done.swap(written);
  return done;
}

}  // namespace mstar_native
