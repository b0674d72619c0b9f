// The compiled CPU kernels' entry points (train/cpu_kernels.py builds them into one extension).
#pragma once
#include <torch/extension.h>

#include <cmath>
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

// exp(x) for x <= 0, eight at a time: x = n ln2 + r, |r| <= ln2 / 2, e^r by Cephes' degree-6 polynomial, 2^n put
// into the exponent bits; about 1 ulp from the libm value (the compiler calls libm's expf once per element
// otherwise). Below -87.3 (where 2^n leaves the normal range) the result is 0, as a float exp underflows there
// anyway; NaN stays NaN.
inline v8 exp_nonpositive(v8 x) {
  const v8 low = splat(-87.3f);
  const v8 input = x;
  const v8i not_a_number = x != x;
  const v8i underflow = x < low;
  x = x < low ? low : x;
  const v8i n = -__builtin_convertvector(splat(0.5f) - x * splat(1.44269504088896341f), v8i);  // round(x/ln2)
  const v8 nf = __builtin_convertvector(n, v8);
  const v8 r = x - nf * splat(0.693359375f) - nf * splat(-2.12194440e-4f);
  v8 p = splat(1.9875691500e-4f);
  p = p * r + splat(1.3981999507e-3f);
  p = p * r + splat(8.3334519073e-3f);
  p = p * r + splat(4.1665795894e-2f);
  p = p * r + splat(1.6666665459e-1f);
  p = p * r + splat(5.0000001201e-1f);
  const v8 y = p * r * r + r + splat(1.f);
  v8i bits;
  std::memcpy(&bits, &y, sizeof(bits));
  bits += n << 23;
  v8 out;
  std::memcpy(&out, &bits, sizeof(out));
  out = underflow ? splat(0.f) : out;
  return not_a_number ? input : out;
}

// weight * x / sqrt(mean(x^2) + eps) over one row of D values (out may be x itself): every RMSNorm of the kernels
// (rms_norm.cpp's rows, decode_step.cpp's rows and per-head query/key norms), so all round alike.
inline void rms_norm_row(const float* x, int64_t D, const float* weight, float eps, float* out) {
  float squares = 0.f;
  for (int64_t d = 0; d < D; ++d) squares += x[d] * x[d];
  const float inverse = 1.f / std::sqrt(squares / static_cast<float>(D) + eps);
  for (int64_t d = 0; d < D; ++d) out[d] = weight[d] * (x[d] * inverse);
}

// The raw loops behind the entry points below, for callers that hold their own buffers (decode_step.cpp).
// out [M, N] = x [M, K] W^T + bias (+ residual [M, N] when given; it may be `out` itself), W packed [P, K, 16].
void linear_rows(const float* x, int64_t M, int64_t K, const float* packed, int64_t panels, const float* bias,
                 int64_t features, const float* residual, float* out);
// out [M, D] = weight * x / sqrt(mean(x^2) + eps) per row of x [M, D] (out may be x itself).
void rms_norm_rows(const float* x, int64_t M, int64_t D, const float* weight, float eps, float* out);
// Decoding attention (decode_attention.cpp) for head sizes 32, 64 and 128: query [A, Hq, D] -> out [A, Hq, D],
// lse [A, Hq]; row a reads columns [0, lengths[a]) of slot slots[a] of the pool [S, Hkv, C, D] and the prefix.
void attend(const float* query, const float* keys, const float* values, const int64_t* slots, const int64_t* lengths,
            const float* prefix_keys, const float* prefix_values, int64_t prefix_len, float* out, float* lse,
            int64_t rows, int64_t q_heads, int64_t kv_heads, int64_t columns, int64_t head_dim, float scale);

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

// train/csrc/decode_step.cpp
torch::Tensor decode_step(const std::vector<int64_t>& tokens, const torch::Tensor& embedding, const torch::Tensor& cos,
                          const torch::Tensor& sin, const std::vector<torch::Tensor>& layers,
                          const torch::Tensor& final_norm, const torch::Tensor& head, const torch::Tensor& head_bias,
                          int64_t head_features, const std::vector<torch::Tensor>& keys,
                          const std::vector<torch::Tensor>& values, const std::vector<torch::Tensor>& prefix_keys,
                          const std::vector<torch::Tensor>& prefix_values, const std::vector<int64_t>& slots,
                          const std::vector<int64_t>& starts, int64_t q_heads, int64_t kv_heads, int64_t intermediate,
                          double eps, double scale);

}  // namespace trace_kernels
