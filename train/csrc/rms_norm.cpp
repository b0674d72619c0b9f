// RMSNorm of float32 rows (train/lean_forward.py): out = weight * (x / sqrt(mean(x^2) + eps)), per row of x [M, D].
//
// Why our own: torch's CPU `rms_norm` is composed of ~8 tensor ops (pow, mean, add, rsqrt, mul, casts), ~25-40 us
// a call on a decoding step's few rows, and a step of the demo's agent runs 17 of them (two per layer, Qwen3's
// per-head query/key norms, the final one): ~0.7 ms of a ~7 ms step. One pass per row here, in transformers'
// order (normalise, then scale by the weight).
#include "kernels.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

namespace trace_kernels {

void rms_norm_rows(const float* xs, int64_t M, int64_t D, const float* ws, float epsilon, float* outs) {
  // a thread's share at least ~64k values: fewer are not worth waking the pool for
  at::parallel_for(0, M, std::max<int64_t>(1, 65536 / std::max<int64_t>(D, 1)), [&](int64_t first, int64_t end) {
    for (int64_t m = first; m < end; ++m) rms_norm_row(xs + m * D, D, ws, epsilon, outs + m * D);
  });
}

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 1 && weight.size(0) == x.size(1), "shapes: x [M, D], weight [D]");
  for (const auto* tensor : {&x, &weight}) {
    TORCH_CHECK(tensor->scalar_type() == torch::kFloat && tensor->is_contiguous() && tensor->device().is_cpu(),
                "float32 contiguous CPU tensors");
  }
  const int64_t M = x.size(0), D = x.size(1);
  auto out = torch::empty({M, D}, x.options());
  rms_norm_rows(x.data_ptr<float>(), M, D, weight.data_ptr<float>(), static_cast<float>(eps), out.data_ptr<float>());
  return out;
}

}  // namespace trace_kernels
