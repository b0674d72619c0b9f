// One decoding step of a Llama-family model for the shared-prefix sampler (train/lean_forward.py's `decode`): every
// row one new token, every layer, in one call.
//
// Why: with the projections, norms and attention compiled (small_linear.cpp, rms_norm.cpp, decode_attention.cpp),
// what was left of a decoding step of the demo's agent was ~30 tensor calls a layer from Python (views,
// concatenations, the rotary embedding's six ops, the key/value writes, SiLU and the residual adds), ~2 ms of a
// 3.3 ms step at 4 rows, paid ~700 times in a 64-episode GRPO batch. Here the same computation runs on our own
// buffers: per layer RMSNorm, one projection for queries, keys and values (their weights packed as one), the
// per-head query/key norms (Qwen3) and the rotary embedding, the keys/values written into the rows' slots, the
// decoding attention, the output projection added to the residual, RMSNorm, one projection for gate and up, SiLU
// times up, the down projection added to the residual; then the final norm and the head.
//
// Inputs: tokens [A] (ids) and embedding [V, E]; cos/sin [A, D] (the rotary embedding at each row's position,
// attention scaling applied, as transformers' rotary module returns them); per layer LAYER_TENSORS tensors (see
// below; packed weights [P, K, 16] as small_linear.cpp, biases empty or zero-padded to P * 16, q/k norm weights
// [D] or empty); the final norm [E] and the head packed (+ bias); per layer the slot pool's keys/values
// [S, Hkv, C, D] and the prefix's [Hkv, P, D]; row a writes its key/value at column starts[a] of slot slots[a] and
// attends columns [0, starts[a]] there and the whole prefix. Returns logits [A, V], float32.
#include "kernels.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace trace_kernels {
namespace {

// per layer: input norm, qkv packed, qkv bias, q norm, k norm, o packed, o bias, post-attention norm, gate-up
// packed, gate-up bias, down packed, down bias
constexpr size_t LAYER_TENSORS = 12;

struct Packed {
  const float* weight;
  int64_t panels;
  const float* bias;  // nullptr: none
};

Packed packed_of(const torch::Tensor& weight, const torch::Tensor& bias, int64_t in_features, int64_t out_features,
                 const char* name) {
  TORCH_CHECK(weight.dim() == 3 && weight.size(1) == in_features && weight.size(2) == 16 &&
              weight.size(0) == (out_features + 15) / 16, name, ": packed weight [P, K, 16] with K = ", in_features,
              " and P = ceil(", out_features, " / 16)");
  TORCH_CHECK(bias.numel() == 0 || (bias.dim() == 1 && bias.size(0) == weight.size(0) * 16), name,
              ": bias empty or zero-padded to P * 16");
  return {weight.data_ptr<float>(), weight.size(0), bias.numel() ? bias.data_ptr<float>() : nullptr};
}

void check_cpu_float(const torch::Tensor& tensor, const char* name) {
  TORCH_CHECK(tensor.scalar_type() == torch::kFloat && tensor.is_contiguous() && tensor.device().is_cpu(), name,
              ": a float32 contiguous CPU tensor");
}

// The rotary embedding (rotate-half convention) of one head in place: x * cos + rotate_half(x) * sin.
inline void rotate(float* x, int64_t D, const float* cos, const float* sin) {
  const int64_t half = D / 2;
  float rotated[128];
  for (int64_t d = 0; d < half; ++d) rotated[d] = -x[d + half];
  for (int64_t d = half; d < D; ++d) rotated[d] = x[d - half];
  for (int64_t d = 0; d < D; ++d) x[d] = x[d] * cos[d] + rotated[d] * sin[d];
}

// silu(gate) * up over n values: silu(g) = g / (1 + e^-g), computed from e^-|g| (never overflows)
void silu_times(const float* gate, const float* up, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const v8 g = load8(gate + i);
    const v8 e = exp_nonpositive(g < 0 ? g : -g);  // e^-|g|
    const v8 sigmoid = g < 0 ? e / (splat(1.f) + e) : splat(1.f) / (splat(1.f) + e);
    store8(out + i, g * sigmoid * load8(up + i));
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
}

}  // namespace

torch::Tensor decode_step(const std::vector<int64_t>& tokens, const torch::Tensor& embedding, const torch::Tensor& cos,
                          const torch::Tensor& sin, const std::vector<torch::Tensor>& layers,
                          const torch::Tensor& final_norm, const torch::Tensor& head, const torch::Tensor& head_bias,
                          int64_t head_features, const std::vector<torch::Tensor>& keys, const std::vector<torch::Tensor>& values,
                          const std::vector<torch::Tensor>& prefix_keys, const std::vector<torch::Tensor>& prefix_values,
                          const std::vector<int64_t>& slots, const std::vector<int64_t>& starts, int64_t q_heads,
                          int64_t kv_heads, int64_t intermediate, double eps, double scale) {
  const int64_t rows = static_cast<int64_t>(tokens.size());
  const size_t n_layers = keys.size();
  TORCH_CHECK(rows >= 1 && static_cast<int64_t>(slots.size()) == rows && static_cast<int64_t>(starts.size()) == rows,
              "one token, slot and start a row");
  TORCH_CHECK(n_layers >= 1 && layers.size() == n_layers * LAYER_TENSORS && values.size() == n_layers &&
              prefix_keys.size() == n_layers && prefix_values.size() == n_layers,
              "per layer ", LAYER_TENSORS, " weights, the pool's keys and values and the prefix's");
  check_cpu_float(embedding, "embedding");
  TORCH_CHECK(embedding.dim() == 2, "embedding [V, E]");
  const int64_t width = embedding.size(1), vocab = embedding.size(0);  // vocab: the embedding's rows
  for (const auto& tensor : layers) check_cpu_float(tensor, "layer weight");
  for (const auto* group : {&keys, &values, &prefix_keys, &prefix_values})
    for (const auto& tensor : *group) check_cpu_float(tensor, "keys/values");
  TORCH_CHECK(keys[0].dim() == 4, "pool keys/values [S, Hkv, C, D]");
  const int64_t pool_slots = keys[0].size(0), columns = keys[0].size(2), head_dim = keys[0].size(3);
  TORCH_CHECK(head_dim == 32 || head_dim == 64 || head_dim == 128, "head size 32, 64 or 128, got ", head_dim);
  for (const auto* tensor : {&cos, &sin}) {
    check_cpu_float(*tensor, "cos/sin");
    TORCH_CHECK(tensor->dim() == 2 && tensor->size(0) == rows && tensor->size(1) == head_dim,
                "cos/sin [A, D]: the rotary embedding over whole heads");
  }
  TORCH_CHECK(q_heads >= 1 && kv_heads >= 1 && q_heads % kv_heads == 0, "query heads a multiple of key/value heads");
  for (size_t l = 0; l < n_layers; ++l) {
    TORCH_CHECK(keys[l].dim() == 4 && values[l].sizes() == keys[l].sizes() && keys[l].size(0) == pool_slots &&
                keys[l].size(1) == kv_heads && keys[l].size(2) == columns && keys[l].size(3) == head_dim,
                "pool keys/values [S, Hkv, C, D], the same in every layer");
    TORCH_CHECK(prefix_keys[l].dim() == 3 && prefix_values[l].sizes() == prefix_keys[l].sizes() &&
                prefix_keys[l].size(2) == head_dim && prefix_keys[l].size(1) == prefix_keys[0].size(1) &&
                (prefix_keys[l].size(1) == 0 || prefix_keys[l].size(0) == kv_heads),
                "prefix keys/values [Hkv, P, D], the same P in every layer");
  }
  std::vector<int64_t> lengths(rows);
  for (int64_t a = 0; a < rows; ++a) {
    TORCH_CHECK(tokens[a] >= 0 && tokens[a] < vocab, "token id ", tokens[a], " outside the embedding's ", vocab);
    TORCH_CHECK(slots[a] >= 0 && slots[a] < pool_slots && starts[a] >= 0 && starts[a] < columns,
                "every slot in the pool and every start before its last column");
    lengths[a] = starts[a] + 1;
  }
  const int64_t prefix_len = prefix_keys[0].size(1);
  const int64_t q_width = q_heads * head_dim, kv_width = kv_heads * head_dim, qkv_width = q_width + 2 * kv_width;
  const float epsilon = static_cast<float>(eps);

  auto options = embedding.options();
  auto hidden = torch::empty({rows, width}, options);  // [A, E], the residual stream
  auto normed = torch::empty({rows, width}, options);  // [A, E]
  auto qkv = torch::empty({rows, qkv_width}, options);  // [A, (Hq + 2 Hkv) D]
  auto query = torch::empty({rows, q_heads, head_dim}, options);  // [A, Hq, D]
  auto attended = torch::empty({rows, q_heads, head_dim}, options);  // [A, Hq, D]
  auto lse = torch::empty({rows, q_heads}, options);  // [A, Hq], unused
  auto gate_up = torch::empty({rows, 2 * intermediate}, options);  // [A, 2F]
  auto act = torch::empty({rows, intermediate}, options);  // [A, F]
  float* h = hidden.data_ptr<float>();
  for (int64_t a = 0; a < rows; ++a)
    std::memcpy(h + a * width, embedding.data_ptr<float>() + tokens[a] * width, width * sizeof(float));

  for (size_t l = 0; l < n_layers; ++l) {
    const torch::Tensor* w = layers.data() + l * LAYER_TENSORS;
    TORCH_CHECK(w[0].numel() == width && w[7].numel() == width, "layer norms [E]");
    TORCH_CHECK((w[3].numel() == 0 || w[3].numel() == head_dim) && w[3].numel() == w[4].numel(),
                "query/key norms [D] each, or both empty");
    const Packed qkv_proj = packed_of(w[1], w[2], width, qkv_width, "q/k/v projection");
    const Packed o_proj = packed_of(w[5], w[6], q_width, width, "o projection");
    const Packed gate_up_proj = packed_of(w[8], w[9], width, 2 * intermediate, "gate/up projection");
    const Packed down_proj = packed_of(w[10], w[11], intermediate, width, "down projection");
    const float* q_norm = w[3].numel() ? w[3].data_ptr<float>() : nullptr;
    const float* k_norm = w[4].numel() ? w[4].data_ptr<float>() : nullptr;
    float* pool_keys = keys[l].data_ptr<float>();
    float* pool_values = values[l].data_ptr<float>();

    rms_norm_rows(h, rows, width, w[0].data_ptr<float>(), epsilon, normed.data_ptr<float>());
    linear_rows(normed.data_ptr<float>(), rows, width, qkv_proj.weight, qkv_proj.panels, qkv_proj.bias, qkv_width,
                nullptr, qkv.data_ptr<float>());
    for (int64_t a = 0; a < rows; ++a) {  // per-head norms, rotary, keys/values into the row's slot
      float* row = qkv.data_ptr<float>() + a * qkv_width;
      const float* c = cos.data_ptr<float>() + a * head_dim;
      const float* s = sin.data_ptr<float>() + a * head_dim;
      for (int64_t head = 0; head < q_heads; ++head) {
        float* q = query.data_ptr<float>() + (a * q_heads + head) * head_dim;
        if (q_norm) rms_norm_row(row + head * head_dim, head_dim, q_norm, epsilon, q);
        else std::memcpy(q, row + head * head_dim, head_dim * sizeof(float));
        rotate(q, head_dim, c, s);
      }
      for (int64_t head = 0; head < kv_heads; ++head) {
        const int64_t column = ((slots[a] * kv_heads + head) * columns + starts[a]) * head_dim;
        float* k = pool_keys + column;
        if (k_norm) rms_norm_row(row + q_width + head * head_dim, head_dim, k_norm, epsilon, k);
        else std::memcpy(k, row + q_width + head * head_dim, head_dim * sizeof(float));
        rotate(k, head_dim, c, s);
        std::memcpy(pool_values + column, row + q_width + kv_width + head * head_dim, head_dim * sizeof(float));
      }
    }
    attend(query.data_ptr<float>(), pool_keys, pool_values, slots.data(), lengths.data(),
           prefix_keys[l].data_ptr<float>(), prefix_values[l].data_ptr<float>(), prefix_len,
           attended.data_ptr<float>(), lse.data_ptr<float>(), rows, q_heads, kv_heads, columns, head_dim,
           static_cast<float>(scale));
    linear_rows(attended.data_ptr<float>(), rows, q_width, o_proj.weight, o_proj.panels, o_proj.bias, width, h, h);
    rms_norm_rows(h, rows, width, w[7].data_ptr<float>(), epsilon, normed.data_ptr<float>());
    linear_rows(normed.data_ptr<float>(), rows, width, gate_up_proj.weight, gate_up_proj.panels, gate_up_proj.bias,
                2 * intermediate, nullptr, gate_up.data_ptr<float>());
    for (int64_t a = 0; a < rows; ++a) {
      const float* gate = gate_up.data_ptr<float>() + a * 2 * intermediate;
      silu_times(gate, gate + intermediate, intermediate, act.data_ptr<float>() + a * intermediate);
    }
    linear_rows(act.data_ptr<float>(), rows, intermediate, down_proj.weight, down_proj.panels, down_proj.bias, width,
                h, h);
  }
  check_cpu_float(final_norm, "final norm");
  check_cpu_float(head, "head");
  check_cpu_float(head_bias, "head bias");
  TORCH_CHECK(final_norm.numel() == width, "final norm [E]");
  const Packed head_proj = packed_of(head, head_bias, width, head_features, "head");
  rms_norm_rows(h, rows, width, final_norm.data_ptr<float>(), epsilon, normed.data_ptr<float>());
  auto logits = torch::empty({rows, head_features}, options);  // [A, V]
  linear_rows(normed.data_ptr<float>(), rows, width, head_proj.weight, head_proj.panels, head_proj.bias,
              head_features, nullptr, logits.data_ptr<float>());
  return logits;
}

}  // namespace trace_kernels
