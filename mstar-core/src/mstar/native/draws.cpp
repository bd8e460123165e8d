// mstar_native::draw_aux and mstar_native::draw_main: a compiled region's draws without
// Python (mstar/sampling/native_draw.py says when they are used).
//
// The caller binds, for this thread, per aux label and for the main label, either the rows'
// top-k state (every row samples with top_k and no other filter) or only a Python fallback.
// The top-k draw runs the same ATen ops, in the same order, as draw._draw_top_k and
// draw.inverse_cdf do from Python, so it gives the same tokens bit for bit, and advances the
// step counters as SlotSampler.commit does. A main draw may also carry the rows'
// penalties (kernel.penalise_at's ops on the seen tokens, their terms computed in Python at
// bind time) and min_tokens stop ids (kernel.suppress_stop_tokens's mask), and counts its
// tokens into the output counts as commit does; the host-side seen sets are updated by
// Python after the call (unbind_draws returns the tokens). Anything else calls the
// fallback (the batch's Python sampler) with the GIL taken.

#include "native_ops.h"

#include <cstdint>
#include <limits>
#include <string>
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

struct MainRows {
  TopKRows rows;
  int64_t vocab = 0;
  std::optional<at::Tensor> seen_rows, seen_cols;  // int64 [n]: penalised (row, token) pairs
  std::optional<at::Tensor> repetition;            // float32 [n]: their rows' repetition penalty
  std::optional<at::Tensor> subtract;              // float32 [n]: presence + frequency terms
  std::optional<at::Tensor> suppress;              // bool [B, V]: stop ids under min_tokens
  std::optional<at::Tensor> counts;                // int32 [S, V]: output counts, or none kept
};

thread_local std::vector<std::optional<Bound>> bound_labels;
thread_local std::optional<MainRows> main_rows;
thread_local py::object main_fallback;           // fallback(logits) -> int64 [B]
thread_local std::optional<at::Tensor> main_drawn;  // the tokens drawn natively this call
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

std::optional<at::Tensor> optional_tensor(const py::handle& h) {
  if (h.is_none()) {
    return std::nullopt;
  }
  return h.cast<at::Tensor>();
}

// (top-k rows tuple, vocab, seen rows, seen cols, repetition, subtract, suppress, counts).
MainRows to_main(const py::tuple& t) {
  MainRows m;
  m.rows = to_rows(t[0].cast<py::tuple>());
  m.vocab = t[1].cast<int64_t>();
  m.seen_rows = optional_tensor(t[2]);
  m.seen_cols = optional_tensor(t[3]);
  m.repetition = optional_tensor(t[4]);
  m.subtract = optional_tensor(t[5]);
  m.suppress = optional_tensor(t[6]);
  m.counts = optional_tensor(t[7]);
  const bool penalised = m.seen_rows.has_value();
  if (penalised != m.seen_cols.has_value() || penalised != m.repetition.has_value() ||
      penalised != m.subtract.has_value() || (m.counts && m.counts->scalar_type() != at::kInt)) {
    throw std::invalid_argument("mstar_native.bind: malformed main rows");
  }
  return m;
}

// kernel.penalise_at on the bound seen tokens, then kernel.suppress_stop_tokens.
at::Tensor penalised(at::Tensor x, const MainRows& m) {
  if (m.seen_rows) {
    const c10::List<std::optional<at::Tensor>> at_seen({*m.seen_rows, *m.seen_cols});
    at::Tensor v = x.index(at_seen);
    v = at::where(v > 0, v / *m.repetition, v * *m.repetition);
    v = v - *m.subtract;
    x = x.clone();
    x.index_put_(at_seen, v);
  }
  if (m.suppress) {
    x = x.masked_fill(*m.suppress, -std::numeric_limits<double>::infinity());
  }
  return x;
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

at::Tensor draw_main(const at::Tensor& logits, const std::optional<at::Tensor>& after) {
  (void)after;  // orders the main draws in the graph; no data
  if (!main_rows) {
    py::gil_scoped_acquire gil;
    if (!main_fallback) {
      throw std::runtime_error("mstar_native::draw_main ran with no sampler bound (call it through its compiled wrapper)");
    }
    return main_fallback(logits).cast<at::Tensor>();
  }
  const MainRows& m = *main_rows;
  if (logits.dim() != 2 || logits.size(0) != m.rows.slots.size(0) || logits.size(1) != m.vocab) {
    throw std::invalid_argument("mstar_native::draw_main: logits must be [" + std::to_string(m.rows.slots.size(0)) +
                                ", " + std::to_string(m.vocab) + "], got " + std::to_string(logits.dim()) + " dims");
  }
  at::Tensor tokens = draw_top_k(penalised(logits.to(at::kFloat), m), m.rows);
  if (m.counts) {
    m.counts->index_put_({m.rows.slots, tokens}, m.rows.advance.to(at::kInt), /*accumulate=*/true);
  }
  main_drawn = tokens;
  return tokens;
}

// main: None (every main draw calls main_fallback) or to_main's tuple.
void bind_main(py::object fallback, const py::object& main) {
  main_rows.reset();
  if (!main.is_none()) {
    main_rows = to_main(main.cast<py::tuple>());
  }
  main_fallback = std::move(fallback);
  main_drawn.reset();
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

// Clears every draw binding of this thread; returns the main tokens drawn natively, if any.
std::optional<at::Tensor> unbind_draws() {
  bound_labels.clear();
  resolver = py::object();
  main_rows.reset();
  main_fallback = py::object();
  std::optional<at::Tensor> drawn = std::move(main_drawn);
  main_drawn.reset();
  return drawn;
}

}  // namespace mstar_native
