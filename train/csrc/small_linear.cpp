// Linear layers of a few rows for the sampler's decoding steps (train/small_linear.py): out = x W^T + b for
// x [M, K] with M up to a few hundred, W prepacked as [P, K, 16] (panel p holds output features 16p..16p+15,
// feature-minor, zero-padded past N).
//
// Why our own: in a decoding step each weight is read once for a handful of rows, after the attention kernel has
// streamed the rows' keys/values through the cache, so the weights come from memory. torch's CPU linear (MKL
// sgemm) reads them at ~5 GB/s there (it repacks its operand for every call); this loop reads each 16-feature
// panel once, in order, and keeps a tile of rows x 16 sums in registers while it does (cold weights, 2 cores:
// 62 -> 17 us a layer at 4 rows, 107 -> 52 us at 23, 166 -> 106 us at 64; see the module).
#include "kernels.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace trace_kernels {
namespace {

constexpr int64_t PANEL = 16;  // output features per panel: two vectors of sums per row

// ROWS rows of x [., K] times one panel [K, 16] (+ bias [16]) -> out's `features` columns (16, or fewer in the
// last panel), rows `out_stride` apart. Each weight vector loaded once feeds ROWS multiply-adds per lane.
template <int ROWS>
inline void tile(const float* x, int64_t K, const float* panel, const float* bias, const float* residual, float* out,
                 int64_t out_stride, int64_t features) {
  v8 sums[ROWS][2];
  for (int r = 0; r < ROWS; ++r) {
    sums[r][0] = bias ? load8(bias) : splat(0.f);
    sums[r][1] = bias ? load8(bias + 8) : splat(0.f);
  }
  for (int64_t k = 0; k < K; ++k) {
    const v8 low = load8(panel + k * PANEL), high = load8(panel + k * PANEL + 8);
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; ++r) {
      const v8 value = splat(x[r * K + k]);
      sums[r][0] += value * low;
      sums[r][1] += value * high;
    }
  }
  for (int r = 0; r < ROWS; ++r) {
    float* target = out + r * out_stride;
    if (features == PANEL) {
      // the residual added to the finished sum, as `hidden + linear(x)` does (it may be `out` itself: read first)
      store8(target, residual ? sums[r][0] + load8(residual + r * out_stride) : sums[r][0]);
      store8(target + 8, residual ? sums[r][1] + load8(residual + r * out_stride + 8) : sums[r][1]);
    } else {
      float row[PANEL];
      store8(row, sums[r][0]);
      store8(row + 8, sums[r][1]);
      if (residual)
        for (int64_t f = 0; f < features; ++f) row[f] += residual[r * out_stride + f];
      std::memcpy(target, row, features * sizeof(float));
    }
  }
}

}  // namespace

void linear_rows(const float* x, int64_t M, int64_t K, const float* packed, int64_t panels, const float* bias,
                 int64_t features, const float* residual, float* out) {
  at::parallel_for(0, panels, 1, [&](int64_t first, int64_t end) {
    for (int64_t p = first; p < end; ++p) {
      const float* panel = packed + p * K * PANEL;
      const float* panel_bias = bias ? bias + p * PANEL : nullptr;
      const int64_t columns = std::min<int64_t>(PANEL, features - p * PANEL);
      const float* panel_residual = residual ? residual + p * PANEL : nullptr;
      // rows m .. m + ROWS - 1 of this panel, one tile (ROWS a compile-time constant: the tile stays inlined)
      auto tile_at = [&](auto rows, int64_t m) {
        tile<decltype(rows)::value>(x + m * K, K, panel, panel_bias,
                                    panel_residual ? panel_residual + m * features : nullptr,
                                    out + p * PANEL + m * features, features, columns);
      };
      int64_t m = 0;
      for (; m + 6 <= M; m += 6) tile_at(std::integral_constant<int, 6>{}, m);
      for (; m + 3 <= M; m += 3) tile_at(std::integral_constant<int, 3>{}, m);
      for (; m < M; ++m) tile_at(std::integral_constant<int, 1>{}, m);
    }
  });
}

torch::Tensor small_linear(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& bias,
                           int64_t features) {
  TORCH_CHECK(x.dim() == 2 && packed.dim() == 3 && packed.size(2) == PANEL && packed.size(1) == x.size(1),
              "shapes: x [M, K], packed weight [P, K, 16]");
  TORCH_CHECK(features >= 1 && features <= packed.size(0) * PANEL && features > (packed.size(0) - 1) * PANEL,
              "features N must fill the last panel: (P - 1) * 16 < N <= P * 16");
  TORCH_CHECK(bias.numel() == 0 || (bias.dim() == 1 && bias.size(0) == packed.size(0) * PANEL),
              "bias empty or zero-padded to P * 16");
  for (const auto* tensor : {&x, &packed, &bias}) {
    TORCH_CHECK(tensor->scalar_type() == torch::kFloat && tensor->is_contiguous() && tensor->device().is_cpu(),
                "float32 contiguous CPU tensors");
  }
  const int64_t M = x.size(0), K = x.size(1), panels = packed.size(0);
  auto out = torch::empty({M, features}, x.options());
  linear_rows(x.data_ptr<float>(), M, K, packed.data_ptr<float>(), panels,
              bias.numel() ? bias.data_ptr<float>() : nullptr, features, nullptr, out.data_ptr<float>());
  return out;
}

}  // namespace trace_kernels
