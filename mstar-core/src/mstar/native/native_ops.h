// The C++ ops of compiled regions (mstar/native/__init__.py builds them; module.cpp registers).
#pragma once

#include <torch/extension.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace mstar_native {

// draws.cpp: mstar_native::draw_aux, mstar_native::draw_main and their per-thread binding.
at::Tensor draw_aux(const at::Tensor& logits, int64_t label, const std::optional<at::Tensor>& after);
at::Tensor draw_main(const at::Tensor& logits, const std::optional<at::Tensor>& after);
void bind_draws(const std::vector<py::object>& entries, py::object resolve_late);
void bind_main(py::object fallback, const py::object& main);
std::optional<at::Tensor> unbind_draws();

// paged_attention.cpp: mstar_native::paged_attention and its per-thread binding.
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t layer);
void bind_attention(py::object fallback, py::object decode_step);
std::vector<int64_t> unbind_attention();

}  // namespace mstar_native
