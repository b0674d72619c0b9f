// The compiled CPU kernels' entry points (train/cpu_kernels.py builds them into one extension).
#pragma once
#include <torch/extension.h>

#include <vector>

namespace trace_kernels {

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
