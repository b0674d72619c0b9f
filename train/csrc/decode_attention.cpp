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
//
// What made the loops fast (storefront GRPO rollouts on 2 cores: 1.0 -> 0.75 ms a call, same samples): the
// exponentials eight at a time by our own polynomial (the compiler called libm's expf once per score, a third
// of the time), scores of eight columns at once summed by a transpose-and-add tree (not eight serial horizontal
// sums), two sets of value sums at head size 32 (one multiply-add's latency per column bounded that loop), and
// the tasks cut into one part per thread by columns read, not by count (rows hold very different lengths).
#include "kernels.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <limits>
#include <vector>

namespace trace_kernels {
namespace {

// The lane sums of eight vectors: result[c] = sum over i of s[c][i]. A transpose-and-add tree (7 adds, 14
// shuffles) instead of eight serial horizontal sums.
inline v8 lane_sums(const v8* s) {
  const v8i even = {0, 8, 2, 10, 4, 12, 6, 14}, odd = {1, 9, 3, 11, 5, 13, 7, 15};
  const v8i low_pairs = {0, 1, 8, 9, 4, 5, 12, 13}, high_pairs = {2, 3, 10, 11, 6, 7, 14, 15};
  const v8i low_half = {0, 1, 2, 3, 8, 9, 10, 11}, high_half = {4, 5, 6, 7, 12, 13, 14, 15};
  v8 a[4];
  for (int p = 0; p < 4; ++p)
    a[p] = __builtin_shuffle(s[2 * p], s[2 * p + 1], even) + __builtin_shuffle(s[2 * p], s[2 * p + 1], odd);
  const v8 b0 = __builtin_shuffle(a[0], a[1], low_pairs) + __builtin_shuffle(a[0], a[1], high_pairs);
  const v8 b1 = __builtin_shuffle(a[2], a[3], low_pairs) + __builtin_shuffle(a[2], a[3], high_pairs);
  return __builtin_shuffle(b0, b1, low_half) + __builtin_shuffle(b0, b1, high_half);
}

// One partial attention, unnormalised: scores of the scaled query against n columns of keys [n, D], their
// maximum `top`, sum of exp(score - top) `total`, and the exp-weighted sum of values in `acc`. `scores` holds
// at least n rounded up to 8 floats.
template <int64_t D>
void partial(const v8* query, const float* keys, const float* values, int64_t n, float* scores, v8* acc,
             float& top, float& total) {
  constexpr int64_t W = D / 8;
  const int64_t blocks = n / 8;
  v8 top8 = splat(-std::numeric_limits<float>::infinity());
  for (int64_t b = 0; b < blocks; ++b) {  // keys read once, eight columns at a time
    v8 sums[8];
    for (int c = 0; c < 8; ++c) {
      const float* key = keys + (b * 8 + c) * D;
      v8 sum = query[0] * load8(key);
#pragma GCC unroll 16
      for (int64_t w = 1; w < W; ++w) sum += query[w] * load8(key + w * 8);
      sums[c] = sum;
    }
    const v8 block = lane_sums(sums);
    std::memcpy(scores + b * 8, &block, sizeof(block));
    top8 = block > top8 ? block : top8;
  }
  top = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < 8; ++i) top = top8[i] > top ? top8[i] : top;
  for (int64_t j = blocks * 8; j < n; ++j) {
    v8 sum = query[0] * load8(keys + j * D);
#pragma GCC unroll 16
    for (int64_t w = 1; w < W; ++w) sum += query[w] * load8(keys + j * D + w * 8);
    float score = 0.f;
    for (int i = 0; i < 8; ++i) score += sum[i];
    scores[j] = score;
    top = score > top ? score : top;
  }
  const int64_t padded = (n + 7) / 8 * 8;
  for (int64_t j = n; j < padded; ++j) scores[j] = -std::numeric_limits<float>::infinity();  // exp -> 0
  v8 total8 = splat(0.f);
  const v8 top_splat = splat(top);
  for (int64_t j = 0; j < padded; j += 8) {
    const v8 weight = exp_nonpositive(load8(scores + j) - top_splat);
    std::memcpy(scores + j, &weight, sizeof(weight));
    total8 += weight;
  }
  total = 0.f;
  for (int i = 0; i < 8; ++i) total += total8[i];
  // values read once; with few lanes per column (D = 32) two sets of sums, even and odd columns, so that each
  // sum waits on one multiply-add in two columns (its latency, not the loads, bounded the loop)
  constexpr int64_t SETS = W >= 8 ? 1 : 8 / W;
  v8 sums[SETS][W];
  for (int64_t k = 0; k < SETS; ++k)
    for (int64_t w = 0; w < W; ++w) sums[k][w] = splat(0.f);
  int64_t j = 0;
  for (; j + SETS <= n; j += SETS) {
#pragma GCC unroll 4
    for (int64_t k = 0; k < SETS; ++k) {
      const v8 weight = splat(scores[j + k]);
#pragma GCC unroll 16
      for (int64_t w = 0; w < W; ++w) sums[k][w] += weight * load8(values + (j + k) * D + w * 8);
    }
  }
  for (; j < n; ++j) {
    const v8 weight = splat(scores[j]);
#pragma GCC unroll 16
    for (int64_t w = 0; w < W; ++w) sums[0][w] += weight * load8(values + j * D + w * 8);
  }
  for (int64_t w = 0; w < W; ++w) {
    acc[w] = sums[0][w];
    for (int64_t k = 1; k < SETS; ++k) acc[w] += sums[k][w];
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
  // Tasks (row, head) in row order, cut into one contiguous part per thread of about equal work (columns read):
  // rows hold very different numbers of columns, and an even split by task count left a thread idle.
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), rows * q_heads));
  std::vector<int64_t> cuts(parts + 1, rows * q_heads);
  cuts[0] = 0;
  {
    int64_t work = 0, all = 0;
    for (int64_t row = 0; row < rows; ++row) all += (lengths[row] + prefix_len + 16) * q_heads;
    int64_t part = 1;
    for (int64_t task = 0; task < rows * q_heads && part < parts; ++task) {
      work += lengths[task / q_heads] + prefix_len + 16;
      while (part < parts && work * parts >= all * part) cuts[part++] = task + 1;
    }
  }
  int64_t longest = prefix_len;
  for (int64_t row = 0; row < rows; ++row) longest = std::max(longest, lengths[row]);
  at::parallel_for(0, parts, 1, [&](int64_t first_part, int64_t end_part) {
    std::vector<float> scores((longest + 7) / 8 * 8);
    v8 q[W], suffix_acc[W], prefix_acc[W];
    for (int64_t task = cuts[first_part]; task < cuts[end_part]; ++task) {
      const int64_t row = task / q_heads, kv_head = (task % q_heads) / groups;
      for (int64_t w = 0; w < W; ++w) q[w] = load8(query + task * D + w * 8) * splat(scale);
      const int64_t slot_base = ((slots[row] * kv_heads + kv_head) * columns) * D;
      float suffix_top, suffix_total;
      partial<D>(q, keys + slot_base, values + slot_base, lengths[row], scores.data(), suffix_acc, suffix_top,
                 suffix_total);
      float top = suffix_top, total = suffix_total;
      if (prefix_len > 0) {  // merge by the log-sum-exps: lse_x = top_x + log(total_x)
        float prefix_top, prefix_total;
        const int64_t prefix_base = kv_head * prefix_len * D;
        partial<D>(q, prefix_keys + prefix_base, prefix_values + prefix_base, prefix_len, scores.data(), prefix_acc,
                   prefix_top, prefix_total);
        top = prefix_top > suffix_top ? prefix_top : suffix_top;
        const float prefix_weight = std::exp(prefix_top - top), suffix_weight = std::exp(suffix_top - top);
        total = prefix_total * prefix_weight + suffix_total * suffix_weight;
        for (int64_t w = 0; w < W; ++w)
          suffix_acc[w] = prefix_acc[w] * splat(prefix_weight) + suffix_acc[w] * splat(suffix_weight);
      }
      const v8 inverse = splat(1.f / total);
      for (int64_t w = 0; w < W; ++w) {
        const v8 result = suffix_acc[w] * inverse;
        std::memcpy(out + task * D + w * 8, &result, sizeof(result));
      }
      lse[task] = top + std::log(total);
    }
  });
}

}  // namespace

void attend(const float* query, const float* keys, const float* values, const int64_t* slots, const int64_t* lengths,
            const float* prefix_keys, const float* prefix_values, int64_t prefix_len, float* out, float* lse,
            int64_t rows, int64_t q_heads, int64_t kv_heads, int64_t columns, int64_t head_dim, float scale) {
  switch (head_dim) {
    case 32: return attend_rows<32>(query, keys, values, slots, lengths, prefix_keys, prefix_values, prefix_len, out,
                                    lse, rows, q_heads, kv_heads, columns, scale);
    case 64: return attend_rows<64>(query, keys, values, slots, lengths, prefix_keys, prefix_values, prefix_len, out,
                                    lse, rows, q_heads, kv_heads, columns, scale);
    case 128: return attend_rows<128>(query, keys, values, slots, lengths, prefix_keys, prefix_values, prefix_len,
                                      out, lse, rows, q_heads, kv_heads, columns, scale);
    default: TORCH_CHECK(false, "head_dim 32, 64 or 128, got ", head_dim);
  }
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
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t slot = slots_c.data_ptr<int64_t>()[row], length = lengths_c.data_ptr<int64_t>()[row];
    TORCH_CHECK(length >= 1 && length <= columns && slot >= 0 && slot < keys.size(0),
                "every length in [1, columns] and every slot in the pool");
  }
  auto out = torch::empty({rows, q_heads, head_dim}, query.options());
  auto lse = torch::empty({rows, q_heads}, query.options());
  attend(query.data_ptr<float>(), keys.data_ptr<float>(), values.data_ptr<float>(), slots_c.data_ptr<int64_t>(),
         lengths_c.data_ptr<int64_t>(), prefix_keys.data_ptr<float>(), prefix_values.data_ptr<float>(), prefix_len,
         out.data_ptr<float>(), lse.data_ptr<float>(), rows, q_heads, kv_heads, columns, head_dim,
         static_cast<float>(scale));
  return {out, lse};
}

}  // namespace trace_kernels
