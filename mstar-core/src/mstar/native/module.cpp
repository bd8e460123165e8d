// Registers the ops with torch's dispatcher (CPU kernels: an inductor C++ wrapper calls them
// without Python) and exposes their per-thread bindings to Python.
#include "native_ops.h"

TORCH_LIBRARY(mstar_native, m) {
  m.def("draw_aux(Tensor logits, int label, Tensor? after) -> Tensor");
  m.def("draw_main(Tensor logits, Tensor? after) -> Tensor");
  m.def("paged_attention(Tensor q, Tensor k, Tensor v, int layer) -> Tensor");
}

TORCH_LIBRARY_IMPL(mstar_native, CPU, m) {
  m.impl("draw_aux", &mstar_native::draw_aux);
  m.impl("draw_main", &mstar_native::draw_main);
  m.impl("paged_attention", &mstar_native::paged_attention);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("bind_draws", &mstar_native::bind_draws, "Bind the labels' draw state for this thread");
  m.def("bind_main", &mstar_native::bind_main, "Bind the main draw's state for this thread");
  m.def("unbind_draws", &mstar_native::unbind_draws,
        "Clear this thread's draw state; returns the main tokens drawn natively, or None");
  m.def("bind_attention", &mstar_native::bind_attention, "Bind the step's attention for this thread");
  m.def("unbind_attention", &mstar_native::unbind_attention,
        "Clear this thread's attention state; returns the layers it wrote natively");
}
