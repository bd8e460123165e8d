// mstar_native::draw_aux: a compiled region's aux draw without Python
// (mstar/sampling/native_draw.py says when it is used).
//
// The caller binds, per label and for this thread, either the rows' top-k state (every row
// samples with top_k and no other filter, no penalties, no stop ids) or a Python fallback.
// The top-k draw runs the same ATen ops, in the same order, as draw._draw_top_k and
// draw.inverse_cdf do from Python, so it gives the same tokens bit for bit, and advances the
// step counters as CudaGraphableSampler.commit does. Anything else calls the fallback (the
// batch's Python sampler) with the GIL taken.

#include "native_ops.h"

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <vector>

namespace mstar_native {
namespace {

struct TopKRows {
  at::Tensor step;         // int64 [S]: the label's step counters, advanced in place
  at::Tensor slots;        // int64 [B]: the rows' slots
  at::Tensor advance;      // int64 [B]: 1 where a row moves to its next step
  std::vector<uint64_t> keys;  // the rows' mixed seeds (counter_rng.row_keys)
  at::Tensor temperature;  // float32 [B, 1]
  bool divide = false;     // some row's temperature is not 1
  at::Tensor top_k;        // int64 [B, 1]
  int64_t same_k = 0;      // the k every row shares, 0 when they differ
  int64_t max_k = 0;
};

struct Bound {
  std::optional<TopKRows> rows;
  py::object fallback;  // fallback(logits) -> int64 [B]
};

thread_local std::vector<std::optional<Bound>> bound_labels;
// resolver(label) -> an entry, for a label bound late. Null between calls: a thread-local
// Python object would be released at thread exit, without the GIL.
thread_local py::object resolver;

constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ULL;

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// counter_rng.uniform_of_keys for the rows' current steps.
at::Tensor uniforms(const TopKRows& r) {
  const int64_t batch = r.slots.size(0);
  at::Tensor u = at::empty({batch}, at::kDouble);
  const int64_t* slots = r.slots.data_ptr<int64_t>();
  const int64_t* step = r.step.data_ptr<int64_t>();
  double* out = u.data_ptr<double>();
  for (int64_t i = 0; i < batch; ++i) {
    const uint64_t t = static_cast<uint64_t>(step[slots[i]]) + 1;
    out[i] = static_cast<double>(mix64(r.keys[i] + t * kGamma) >> 11) * 0x1.0p-53;
  }
  return u;
}

// draw.inverse_cdf with host=True.
at::Tensor inverse_cdf(const at::Tensor& weights, const at::Tensor& u) {
  const int64_t vocab = weights.size(1);
  at::Tensor cdf = at::cumsum(weights, 1, at::kDouble);
  at::Tensor target = u.unsqueeze(1) * cdf.slice(1, vocab - 1);
  at::Tensor idx = at::searchsorted(cdf, target, /*out_int32=*/false, /*right=*/true);
  if (idx.max().item<int64_t>() < vocab) {
    return idx.squeeze(1);
  }
  idx = idx.clamp_max_(vocab - 1).squeeze(1);
  at::Tensor ok = weights.gather(1, idx.unsqueeze(1)).squeeze(1) > 0;
  at::Tensor last_positive = (vocab - 1) - (weights > 0).flip({1}).to(at::kByte).argmax(1);
  return at::where(ok, idx, last_positive);
}

// draw._draw_top_k, then the sampler's commit of the step counters.
at::Tensor draw_top_k(const at::Tensor& logits, const TopKRows& r) {
  at::Tensor x = logits.to(at::kFloat);
  const int64_t vocab = x.size(1);
  at::Tensor u = uniforms(r);
  at::Tensor d = x - x.amax({1}, /*keepdim=*/true);
  if (r.divide) {
    d.div_(r.temperature);
  }
  at::Tensor top = std::get<0>(at::topk(d, std::min(r.max_k, vocab), 1, /*largest=*/true, /*sorted=*/true));
  at::Tensor thresh = r.same_k > 0 ? top.slice(1, std::min(r.same_k, vocab) - 1)
                                   : top.gather(1, r.top_k.clamp_max(vocab) - 1);
  at::Tensor tokens = inverse_cdf(at::where(d >= thresh, d.exp(), 0.0), u);
  int64_t* step = r.step.data_ptr<int64_t>();
  const int64_t* slots = r.slots.data_ptr<int64_t>();
  const int64_t* adv = r.advance.data_ptr<int64_t>();
  for (int64_t i = 0; i < r.slots.size(0); ++i) {
    step[slots[i]] += adv[i];
  }
  return tokens;
}

TopKRows to_rows(const py::tuple& t) {
  TopKRows r;
  r.step = t[0].cast<at::Tensor>();
  r.slots = t[1].cast<at::Tensor>();
  r.advance = t[2].cast<at::Tensor>();
  r.keys = t[3].cast<std::vector<uint64_t>>();
  r.temperature = t[4].cast<at::Tensor>();
  r.divide = t[5].cast<bool>();
  r.top_k = t[6].cast<at::Tensor>();
  r.same_k = t[7].cast<int64_t>();
  r.max_k = t[8].cast<int64_t>();
  const int64_t batch = r.slots.size(0);
  if (r.step.scalar_type() != at::kLong || r.slots.scalar_type() != at::kLong || r.advance.scalar_type() != at::kLong ||
      !r.step.is_contiguous() || !r.slots.is_contiguous() || !r.advance.is_contiguous() ||
      r.advance.size(0) != batch || static_cast<int64_t>(r.keys.size()) != batch || r.max_k < 1) {
    throw std::invalid_argument("mstar_native.bind: malformed top-k rows");
  }
  return r;
}

// An entry: (fallback, rows tuple or None).
Bound to_bound(const py::object& entry) {
  py::tuple t = entry.cast<py::tuple>();
  Bound b;
  b.fallback = t[0];
  if (!t[1].is_none()) {
    b.rows = to_rows(t[1].cast<py::tuple>());
  }
  return b;
}

}  // namespace

at::Tensor draw_aux(const at::Tensor& logits, int64_t label, const std::optional<at::Tensor>& after) {
  (void)after;  // orders the draws of a label in the graph; no data
  if (label < 0) {
    throw std::invalid_argument("mstar_native::draw_aux: negative label id");
  }
  if (label >= static_cast<int64_t>(bound_labels.size()) || !bound_labels[label]) {
    // A label first seen while this call traced its graph: ask the binder for it.
    py::gil_scoped_acquire gil;
    if (!resolver) {
      throw std::runtime_error("mstar_native::draw_aux ran with no sampler bound (call it through its compiled wrapper)");
    }
    if (label >= static_cast<int64_t>(bound_labels.size())) {
      bound_labels.resize(label + 1);
    }
    bound_labels[label] = to_bound(resolver(label));
  }
  const Bound& b = *bound_labels[label];
  if (b.rows) {
    return draw_top_k(logits, *b.rows);
  }
  py::gil_scoped_acquire gil;
  return b.fallback(logits).cast<at::Tensor>();
}

// entries[label]: None (resolved on first use through resolve_late) or an entry.
void bind_draws(const std::vector<py::object>& entries, py::object resolve_late) {
  std::vector<std::optional<Bound>> labels(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    if (!entries[i].is_none()) {
      labels[i] = to_bound(entries[i]);
    }
  }
  bound_labels = std::move(labels);
  resolver = resolve_late.is_none() ? py::object() : std::move(resolve_late);
}

void unbind_draws() {
  bound_labels.clear();
  resolver = py::object();
}

}  // namespace mstar_native
