// Decoding attention for the shared-prefix sampler (train/shared_prefix.py): each row's one new token attends to
// the shared prefix and to exactly the columns its own slot holds, both in one call per layer for all rows.
//
// Why our own kernel: on the CPU, torch's fused attention (aten::_scaled_dot_product_flash_attention_for_cpu)
// takes dense batches, and rows hold different numbers of columns, so the sampler called it once per row (or
// run of neighbouring rows): ~10 calls per layer per step on GRPO's 64-row storefront rollouts, with one query
// token each, far below the memory bandwidth. Here one task per (row, query head) reads the row's keys and values
// once; the prefix (the same for every row, so it stays in cache) is read by each task from there.
//
// Inputs: query [A, Hq, D] float32; keys/values [S, Hkv, C, D] float32 (the slot pool); slots [A], lengths [A]
// int64 (row a attends columns 0 .. lengths[a]-1 of slot slots[a]); prefix_keys/prefix_values [Hkv, P, D]
// float32 (P may be 0). Query head h reads kv head h / (Hq / Hkv), as transformers' repeat_kv lays them out.
// Each task computes two partial attentions, the prefix's (o_p, lse_p) and the suffix's (o_s, lse_s), and merges
// them by their log-sum-exps, o = o_p * exp(lse_p - lse) + o_s * exp(lse_s - lse), lse = logaddexp(lse_p, lse_s)
// (the cascade combination). Returns out [A, Hq, D] and lse [A, Hq], float32.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

// Eight floats in one vector register (GCC/Clang vector extensions): the loops accumulate in these so that the
// compiler keeps the sums in registers (with plain float arrays it reloaded them every column: half the speed).
typedef float v8 __attribute__((vector_size(32)));

// One partial attention, unnormalised: scores of the scaled query against n columns of keys [n, D], their
// maximum `top`, sum of exp(score - top) `total`, and the exp-weighted sum of values in `acc`.
template <int64_t D>
void partial(const v8* query, const float* keys, const float* values, int64_t n, std::vector<float>& scores,
             v8* acc, float& top, float& total) {
  constexpr int64_t W = D / 8;
  scores.resize(n);
  top = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) {  // keys read once
    v8 sum = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma GCC unroll 16
    for (int64_t w = 0; w < W; ++w) {
      v8 key;
      for (int i = 0; i < 8; ++i) key[i] = keys[j * D + w * 8 + i];
      sum += query[w] * key;
    }
    float score = 0.f;
    for (int i = 0; i < 8; ++i) score += sum[i];
    scores[j] = score;
    top = score > top ? score : top;
  }
  total = 0.f;
  for (int64_t j = 0; j < n; ++j) {
    const float weight = std::exp(scores[j] - top);
    scores[j] = weight;
    total += weight;
  }
  for (int64_t w = 0; w < W; ++w) acc[w] = v8{0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t j = 0; j < n; ++j) {  // values read once
    const float weight = scores[j];
#pragma GCC unroll 16
    for (int64_t w = 0; w < W; ++w) {
      v8 value;
      for (int i = 0; i < 8; ++i) value[i] = values[j * D + w * 8 + i];
      acc[w] += weight * value;
    }
  }
}

template <int64_t D>
void attend_rows(const float* query, const float* keys, const float* values, const int64_t* slots,
                 const int64_t* lengths, const float* prefix_keys, const float* prefix_values, int64_t prefix_len,
                 float* out, float* lse, int64_t rows, int64_t q_heads, int64_t kv_heads, int64_t columns,
                 float scale) {
  static_assert(D % 8 == 0, "head size a multiple of 8");
  constexpr int64_t W = D / 8;
  const int64_t groups = q_heads / kv_heads;
  at::parallel_for(0, rows * q_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    v8 q[W], suffix_acc[W], prefix_acc[W];
    for (int64_t task = begin; task < end; ++task) {
      const int64_t row = task / q_heads, kv_head = (task % q_heads) / groups;
      for (int64_t w = 0; w < W; ++w)
        for (int i = 0; i < 8; ++i) q[w][i] = query[task * D + w * 8 + i] * scale;
      const int64_t slot_base = ((slots[row] * kv_heads + kv_head) * columns) * D;
      float suffix_top, suffix_total;
      partial<D>(q, keys + slot_base, values + slot_base, lengths[row], scores, suffix_acc, suffix_top, suffix_total);
      float top = suffix_top, total = suffix_total;
      if (prefix_len > 0) {  // merge by the log-sum-exps: lse_x = top_x + log(total_x)
        float prefix_top, prefix_total;
        const int64_t prefix_base = kv_head * prefix_len * D;
        partial<D>(q, prefix_keys + prefix_base, prefix_values + prefix_base, prefix_len, scores, prefix_acc,
                   prefix_top, prefix_total);
        top = prefix_top > suffix_top ? prefix_top : suffix_top;
        const float prefix_weight = std::exp(prefix_top - top), suffix_weight = std::exp(suffix_top - top);
        total = prefix_total * prefix_weight + suffix_total * suffix_weight;
        for (int64_t w = 0; w < W; ++w) suffix_acc[w] = prefix_acc[w] * prefix_weight + suffix_acc[w] * suffix_weight;
      }
      const float inverse = 1.f / total;
      for (int64_t w = 0; w < W; ++w)
        for (int i = 0; i < 8; ++i) out[task * D + w * 8 + i] = suffix_acc[w][i] * inverse;
      lse[task] = top + std::log(total);
    }
  });
}

std::vector<torch::Tensor> decode_attention(const torch::Tensor& query, const torch::Tensor& keys,
                                            const torch::Tensor& values, const torch::Tensor& slots,
                                            const torch::Tensor& lengths, const torch::Tensor& prefix_keys,
                                            const torch::Tensor& prefix_values, double scale) {
  TORCH_CHECK(query.dim() == 3 && keys.dim() == 4 && values.sizes() == keys.sizes() && prefix_keys.dim() == 3 &&
              prefix_values.sizes() == prefix_keys.sizes(), "shapes: query [A, Hq, D], keys/values [S, Hkv, C, D], "
              "prefix keys/values [Hkv, P, D]");
  for (const auto* tensor : {&query, &keys, &values, &prefix_keys, &prefix_values}) {
    TORCH_CHECK(tensor->scalar_type() == torch::kFloat && tensor->is_contiguous() && tensor->device().is_cpu(),
                "float32 contiguous CPU tensors");
  }
  TORCH_CHECK(slots.scalar_type() == torch::kLong && lengths.scalar_type() == torch::kLong &&
              slots.numel() == query.size(0) && lengths.numel() == query.size(0), "int64 slots and lengths, one a row");
  const int64_t rows = query.size(0), q_heads = query.size(1), head_dim = query.size(2);
  const int64_t kv_heads = keys.size(1), columns = keys.size(2), prefix_len = prefix_keys.size(1);
  TORCH_CHECK(keys.size(3) == head_dim && q_heads % kv_heads == 0 && prefix_keys.size(2) == head_dim &&
              (prefix_len == 0 || prefix_keys.size(0) == kv_heads), "head sizes");
  auto slots_c = slots.contiguous();
  auto lengths_c = lengths.contiguous();
  TORCH_CHECK(rows == 0 || (lengths_c.min().item<int64_t>() >= 1 && lengths_c.max().item<int64_t>() <= columns &&
              slots_c.min().item<int64_t>() >= 0 && slots_c.max().item<int64_t>() < keys.size(0)),
              "every length in [1, columns] and every slot in the pool");
  auto out = torch::empty({rows, q_heads, head_dim}, query.options());
  auto lse = torch::empty({rows, q_heads}, query.options());
#define TRACE_ATTEND(D)                                                                                           \
  attend_rows<D>(query.data_ptr<float>(), keys.data_ptr<float>(), values.data_ptr<float>(),                      \
                 slots_c.data_ptr<int64_t>(), lengths_c.data_ptr<int64_t>(), prefix_keys.data_ptr<float>(),       \
                 prefix_values.data_ptr<float>(), prefix_len, out.data_ptr<float>(), lse.data_ptr<float>(), rows, \
                 q_heads, kv_heads, columns, static_cast<float>(scale))
  switch (head_dim) {
    case 32: TRACE_ATTEND(32); break;
    case 64: TRACE_ATTEND(64); break;
    case 128: TRACE_ATTEND(128); break;
    default: TORCH_CHECK(false, "head_dim 32, 64 or 128, got ", head_dim);
  }
#undef TRACE_ATTEND
  return {out, lse};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode_attention", &decode_attention,
        "one new token per row over the shared prefix and its own slot columns, merged -> (out, lse)");
}
