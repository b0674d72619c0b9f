// The compiled CPU kernels' entry points (train/cpu_kernels.py builds them into one extension).
#pragma once
#include <torch/extension.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace trace_kernels {

// Eight floats in one vector register (GCC/Clang vector extensions): the loops accumulate in these so that the
// compiler keeps the sums in registers (with plain float arrays it reloaded them every column: half the speed).
typedef float v8 __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

inline v8 load8(const float* p) {
  v8 x;
  std::memcpy(&x, p, sizeof(x));  // one unaligned vector load
  return x;
}

inline void store8(float* p, v8 x) { std::memcpy(p, &x, sizeof(x)); }

inline v8 splat(float x) { return v8{x, x, x, x, x, x, x, x}; }

// train/csrc/decode_attention.cpp
std::vector<torch::Tensor> decode_attention(const torch::Tensor& query, const torch::Tensor& keys,
                                            const torch::Tensor& values, const torch::Tensor& slots,
                                            const torch::Tensor& lengths, const torch::Tensor& prefix_keys,
                                            const torch::Tensor& prefix_values, double scale);

// train/csrc/small_linear.cpp
torch::Tensor small_linear(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& bias,
                           int64_t features);

// train/csrc/rms_norm.cpp
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

}  // namespace trace_kernels
