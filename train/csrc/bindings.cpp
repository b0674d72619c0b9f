// Python bindings of the compiled CPU kernels (train/cpu_kernels.py).
#include "kernels.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode_attention", &trace_kernels::decode_attention,
        "one new token per row over the shared prefix and its own slot columns, merged -> (out, lse)");
  m.def("small_linear", &trace_kernels::small_linear,
        "x [M, K] times a weight packed [P, K, 16] (+ bias padded to P * 16) -> [M, N]");
  m.def("rms_norm", &trace_kernels::rms_norm, "weight * (x / sqrt(mean(x^2) + eps)) per row of x [M, D]");
  m.def("decode_step", &trace_kernels::decode_step,
        "one decoding step of a Llama-family model, every layer, one token a row -> logits [A, V]");
}
