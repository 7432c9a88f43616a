// Next-token sampling for a batch on the CPU, one pass over each row's logits per step of the
// algorithm instead of one torch op per step: exactly the distribution core_engine/engine/sampler.py
// defines (greedy rows: the first maximum; others: softmax at the row's temperature, top-p nucleus
// drawn by rejection) and the same counter-hash uniforms, so a seeded request gives the same
// tokens in any batch. Every loop is bounded whatever the input: the rejection loop gives up after
// MAX_DRAWS draws and finds the row's nucleus by a sort (the same distribution), a top_p that rounds
// to 0 keeps the top token (nothing lies above it), and a temperature below FLT_MIN is greedy.

#include <ATen/Parallel.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <functional>
#include <cstdint>
#include <vector>

#include "cpu_vec.h"
#include "ops_cpu.h"

namespace batchtop_cpu {
namespace {

constexpr uint64_t MASK32 = 0xFFFFFFFFull;
constexpr uint64_t MIX = 0x45D9F3Bull;
constexpr int64_t MAX_DRAWS = 32;  // sampler.MAX_DRAWS

inline uint64_t mix32(uint64_t x) {  // sampler._mix32
  x ^= x >> 16;
  x = (x * MIX) & MASK32;
  x ^= x >> 16;
  x = (x * MIX) & MASK32;
  return x ^ (x >> 16);
}

inline float uniform(int64_t lo, int64_t hi, int64_t counter, int64_t attempt) {  // sampler.uniforms
  uint64_t h = mix32((static_cast<uint64_t>(counter) & MASK32) ^ mix32(static_cast<uint64_t>(attempt) + 0x9E3779B));
  h = mix32(static_cast<uint64_t>(lo) ^ mix32(static_cast<uint64_t>(hi) ^ h));
  return static_cast<float>(h >> 8) * (1.0f / (1 << 24));
}

template <typename T>
int64_t first_max(const T* x, int64_t n) {  // the row's maximum found vectorised, then its first index
  float value = to_float(x[0]);
  int64_t i = 0;
#if defined(__AVX512F__)
  if (n >= 16) {
    __m512 m = load16(x);
    for (i = 16; i + 16 <= n; i += 16) m = _mm512_max_ps(m, load16(x + i));
    value = _mm512_reduce_max_ps(m);
  }
#elif defined(BATCHTOP_AVX2)
  if (n >= 8) {
    __m256 m = load8(x);
    for (i = 8; i + 8 <= n; i += 8) m = _mm256_max_ps(m, load8(x + i));
    value = reduce_max8(m);
  }
#endif
  for (; i < n; ++i) value = std::max(value, to_float(x[i]));
  for (i = 0; i < n; ++i)
    if (to_float(x[i]) == value) return i;
  return 0;  // only a NaN row gets here
}

// e[i] = exp((x[i] - max) / temperature); returns their sum
template <typename T>
float softmax_weights(const T* x, int64_t n, float max, float inv_t, float* e) {
  float sum = 0.f;
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 vmax = _mm512_set1_ps(max), vinv = _mm512_set1_ps(inv_t);
  __m512 acc = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    const __m512 v = exp16(_mm512_mul_ps(_mm512_sub_ps(load16(x + i), vmax), vinv));
    _mm512_storeu_ps(e + i, v);
    acc = _mm512_add_ps(acc, v);
  }
  sum = _mm512_reduce_add_ps(acc);
#elif defined(BATCHTOP_AVX2)
  const __m256 vmax = _mm256_set1_ps(max), vinv = _mm256_set1_ps(inv_t);
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 v = exp8(_mm256_mul_ps(_mm256_sub_ps(load8(x + i), vmax), vinv));
    _mm256_storeu_ps(e + i, v);
    acc = _mm256_add_ps(acc, v);
  }
  sum = reduce_add8(acc);
#endif
  for (; i < n; ++i) sum += (e[i] = std::exp((to_float(x[i]) - max) * inv_t));
  return sum;
}

float sum_above(const float* e, int64_t n, float floor) {  // the mass of weights strictly above floor
  float sum = 0.f;
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 vfloor = _mm512_set1_ps(floor);
  __m512 acc = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(e + i);
    acc = _mm512_mask_add_ps(acc, _mm512_cmp_ps_mask(v, vfloor, _CMP_GT_OQ), acc, v);
  }
  sum = _mm512_reduce_add_ps(acc);
#elif defined(BATCHTOP_AVX2)
  const __m256 vfloor = _mm256_set1_ps(floor);
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(e + i);
    acc = _mm256_add_ps(acc, _mm256_and_ps(_mm256_cmp_ps(v, vfloor, _CMP_GT_OQ), v));
  }
  sum = reduce_add8(acc);
#endif
  for (; i < n; ++i)
    if (e[i] > floor) sum += e[i];
  return sum;
}

// inverse CDF over the weights strictly above floor: the first index whose running sum passes u * total
int64_t draw(const float* e, int64_t n, float floor, float total, float u) {
  const float target = u * total;
  float running = 0.f;
  int64_t last = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (e[i] > floor) {
      running += e[i];
      last = i;
      if (running > target) return i;
    }
  }
  return last;  // rounding left the running sum at the target: the last kept token
}

// the top token (nothing above it) is always kept, so a top_p of 0 keeps only it and its ties
inline bool in_nucleus(float above, float top_p, float total) {
  return above <= 0.f || above < top_p * total || top_p >= 1.f;
}

// the smallest weight the nucleus keeps, found by a sort (sampler.sample_nucleus_sorted): a NaN
// weight sorts last and is never kept
float nucleus_smallest(const float* e, int64_t n, float top_p, float total, std::vector<float>& sorted) {
  sorted.assign(e, e + n);
  for (float& v : sorted)
    if (std::isnan(v)) v = -1.f;
  std::sort(sorted.begin(), sorted.end(), std::greater<float>());
  float above = 0.f, smallest = sorted[0];
  for (int64_t i = 0; i < n && sorted[i] >= 0.f && in_nucleus(above, top_p, total); ++i) {
    smallest = sorted[i];
    above += sorted[i];
  }
  return smallest;
}

template <typename T>
void sample_impl(at::Tensor& tokens, const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& top_p,
                 const at::Tensor& seed_lo, const at::Tensor& seed_hi, const at::Tensor& counter) {
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  const T* lp = logits.data_ptr<T>();
  const float* tp = temperature.data_ptr<float>();
  const float* pp = top_p.data_ptr<float>();
  const int64_t *lo = seed_lo.data_ptr<int64_t>(), *hi = seed_hi.data_ptr<int64_t>(), *ctr = counter.data_ptr<int64_t>();
  int64_t* out = tokens.data_ptr<int64_t>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> e(vocab), sorted;
    for (int64_t r = begin; r < end; ++r) {
      const T* x = lp + r * logits.stride(0);
      const int64_t best = first_max(x, vocab);
      if (!(tp[r] >= FLT_MIN)) {  // 0, a denormal whose reciprocal overflows, or NaN: greedy
        out[r] = best;
        continue;
      }
      const float z = softmax_weights(x, vocab, to_float(x[best]), 1.f / tp[r], e.data());
      float floor = -1.f;  // no floor: every token may be drawn
      float total = z;
      out[r] = -1;
      for (int64_t attempt = 0; attempt < MAX_DRAWS; ++attempt) {
        const int64_t tok = draw(e.data(), vocab, floor, total, uniform(lo[r], hi[r], ctr[r], attempt));
        if (in_nucleus(sum_above(e.data(), vocab, e[tok]), pp[r], z)) {
          out[r] = tok;
          break;
        }
        floor = e[tok];  // outside the nucleus: draw again from the tokens above it
        total = sum_above(e.data(), vocab, floor);
      }
      if (out[r] < 0) {  // still outside after MAX_DRAWS: the nucleus by a sort, then one draw from it
        floor = std::nextafter(nucleus_smallest(e.data(), vocab, pp[r], z, sorted), -INFINITY);
        out[r] = draw(e.data(), vocab, floor, sum_above(e.data(), vocab, floor),
                      uniform(lo[r], hi[r], ctr[r], MAX_DRAWS));
      }
    }
  });
}

template <typename T>
void argmax_impl(at::Tensor& tokens, const at::Tensor& logits) {
  const int64_t vocab = logits.size(1);
  const T* lp = logits.data_ptr<T>();
  int64_t* out = tokens.data_ptr<int64_t>();
  at::parallel_for(0, logits.size(0), 4, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) out[r] = first_max(lp + r * logits.stride(0), vocab);
  });
}

}  // namespace

// tokens (S,) int64 out; logits (S, V) float32 or bfloat16 rows; per row: temperature (< FLT_MIN: greedy) and
// top_p (float32), seed_lo, seed_hi and counter (int64), as in sampler.SamplingBatch
void sample(at::Tensor tokens, const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& top_p,
            const at::Tensor& seed_lo, const at::Tensor& seed_hi, const at::Tensor& counter) {
  const int64_t rows = logits.size(0);
  TORCH_CHECK(logits.device().is_cpu() && logits.dim() == 2 && logits.stride(1) == 1 && logits.size(1) > 0,
              "sample: logits (rows, vocab) on the CPU with contiguous rows");
  TORCH_CHECK(tokens.scalar_type() == at::kLong && tokens.is_contiguous() && tokens.numel() == rows, "sample: tokens");
  for (const at::Tensor* t : {&temperature, &top_p})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->numel() == rows,
                "sample: temperature and top_p are float32 (rows,)");
  for (const at::Tensor* t : {&seed_lo, &seed_hi, &counter})
    TORCH_CHECK(t->scalar_type() == at::kLong && t->is_contiguous() && t->numel() == rows,
                "sample: seed_lo, seed_hi and counter are int64 (rows,)");
  by_dtype(logits, "sample: float32 or bfloat16 logits only",
           [&](auto t) { sample_impl<decltype(t)>(tokens, logits, temperature, top_p, seed_lo, seed_hi, counter); });
}

void argmax(at::Tensor tokens, const at::Tensor& logits) {  // the first maximum of each row
  TORCH_CHECK(logits.device().is_cpu() && logits.dim() == 2 && logits.stride(1) == 1 && logits.size(1) > 0,
              "argmax: logits (rows, vocab) on the CPU with contiguous rows");
  TORCH_CHECK(tokens.scalar_type() == at::kLong && tokens.is_contiguous() && tokens.numel() == logits.size(0),
              "argmax: tokens");
  by_dtype(logits, "argmax: float32 or bfloat16 logits only",
           [&](auto t) { argmax_impl<decltype(t)>(tokens, logits); });
}

}  // namespace batchtop_cpu
