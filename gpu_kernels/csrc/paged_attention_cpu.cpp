// Paged attention for the CPU, reading the KV pool in place. Every query row has its own block
// table row and context length, so decode rows (one new token each) and the rows of prompt chunks
// whose K/V already sit in the pool go through one call: the "varlen" batch of a whole step.
//
// The pool layer is (num_blocks, block_size, kv_heads, head_dim); token p of a row's sequence sits in
// block_tables[row_tables[r]][p / block_size] at offset p % block_size. The query heads that share a
// KV head are handled together, so each key and value is read once per KV head. Math in fp32 with a
// max-subtracted softmax, like the torch reference; each row is computed alone in a fixed order, so
// its result does not depend on which other rows share the batch.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "cpu_vec.h"
#include "paged_attention_cpu.h"

namespace {

using namespace batchtop_cpu;

struct Job {  // one (query row, KV head): where its inputs are and where its output goes
  const void* q;  // first of its `group` query heads
  int64_t q_head_stride;
  const int64_t* table;
  int64_t context;
  void* out;
  int64_t out_head_stride;
};

struct Pool {
  const void* k;
  const void* v;
  int64_t block_size, token_stride, head_offset;

  template <typename T>
  const T* key(const T* base, const int64_t* table, int64_t t) const {
    return base + (table[t / block_size] * block_size + t % block_size) * token_stride + head_offset;
  }
};

// The portable path: plain loops the compiler may vectorise.
template <typename T>
void attend_scalar(const Job& job, const Pool& pool, int group, int64_t hd, float scale, std::vector<float>& work) {
  const T* q = static_cast<const T*>(job.q);
  const T* kc = static_cast<const T*>(pool.k);
  const T* vc = static_cast<const T*>(pool.v);
  const int64_t n = job.context;
  work.assign(group * (n + 2 * hd), 0.f);
  float* scores = work.data();
  float* qf = scores + group * n;
  float* acc = qf + group * hd;
  for (int g = 0; g < group; ++g)
    for (int64_t d = 0; d < hd; ++d) qf[g * hd + d] = to_float(q[g * job.q_head_stride + d]) * scale;
  for (int64_t t = 0; t < n; ++t) {
    const T* k = pool.key(kc, job.table, t);
    for (int g = 0; g < group; ++g) {
      float s = 0.f;
      for (int64_t d = 0; d < hd; ++d) s += qf[g * hd + d] * to_float(k[d]);
      scores[g * n + t] = s;
    }
  }
  for (int g = 0; g < group; ++g) {
    float* sg = scores + g * n;
    const float m = *std::max_element(sg, sg + n);
    float sum = 0.f;
    for (int64_t t = 0; t < n; ++t) sum += (sg[t] = std::exp(sg[t] - m));
    for (int64_t t = 0; t < n; ++t) sg[t] /= sum;
  }
  for (int64_t t = 0; t < n; ++t) {
    const T* v = pool.key(vc, job.table, t);
    for (int g = 0; g < group; ++g)
      for (int64_t d = 0; d < hd; ++d) acc[g * hd + d] += scores[g * n + t] * to_float(v[d]);
  }
  T* out = static_cast<T*>(job.out);
  for (int g = 0; g < group; ++g)
    for (int64_t d = 0; d < hd; ++d) store(out + g * job.out_head_stride + d, acc[g * hd + d]);
}

#if defined(__AVX512F__)
// Lane sums of 16 vectors as one vector: out[j] = sum of a[j]'s 16 lanes, in 15 adds and 30 shuffles.
inline __m512 reduce16(const __m512 (&a)[16]) {
  __m512 r[8], s[4];
  for (int i = 0; i < 8; ++i)  // per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3] of a[2i], a[2i+1]
    r[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {  // per 128-bit lane: the lane's partial sums of keys 4i..4i+3, in order
    const __m512d x = _mm512_castps_pd(r[2 * i]), y = _mm512_castps_pd(r[2 * i + 1]);
    s[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  const __m512 x01 = _mm512_add_ps(_mm512_shuffle_f32x4(s[0], s[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(s[0], s[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 x23 = _mm512_add_ps(_mm512_shuffle_f32x4(s[2], s[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(s[2], s[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(x01, x23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(x01, x23, _MM_SHUFFLE(3, 1, 3, 1)));
}

// C = head_dim / 16 vectors per head, G query heads per KV head (0: a runtime group). With both fixed,
// the query heads and the accumulators stay in registers. Keys are walked block by block.
template <typename T, int C, int G>
void attend_avx512(const Job& job, const Pool& pool, int runtime_group, float scale, std::vector<float>& work) {
  constexpr int HD = 16 * C;
  const int group = G > 0 ? G : runtime_group;
  const T* q = static_cast<const T*>(job.q);
  const T* kc = static_cast<const T*>(pool.k);
  const T* vc = static_cast<const T*>(pool.v);
  const int64_t n = job.context, padded = (n + 15) / 16 * 16, bs = pool.block_size;
  work.resize(group * (padded + HD) + group);
  float* scores = work.data();
  float* qf = scores + group * padded;
  float* inv_sum = qf + group * HD;
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int g = 0; g < group; ++g)
    for (int c = 0; c < C; ++c)
      _mm512_storeu_ps(qf + g * HD + 16 * c, _mm512_mul_ps(load16(q + g * job.q_head_stride + 16 * c), vscale));

  // Scores, 16 keys at a time: the tile's keys in fp32 once, then per query head 16 dot products
  // whose lane sums are reduced together (reduce16), not one horizontal sum per key.
  alignas(64) float kt[16 * HD];
  int64_t block = 0, offset = 0;  // where key t0 sits, advanced without a division per key
  for (int64_t t0 = 0; t0 < n; t0 += 16) {
    const int64_t len = std::min<int64_t>(16, n - t0);
    for (int64_t j = 0; j < 16; ++j) {
      if (j < len) {
        const T* kp = kc + (job.table[block] * bs + offset) * pool.token_stride + pool.head_offset;
        for (int c = 0; c < C; ++c) _mm512_store_ps(kt + j * HD + 16 * c, load16(kp + 16 * c));
        if (++offset == bs) offset = 0, ++block;
      } else {
        for (int c = 0; c < C; ++c) _mm512_store_ps(kt + j * HD + 16 * c, _mm512_setzero_ps());
      }
    }
    for (int g = 0; g < group; ++g) {
      __m512 qg[C];
      for (int c = 0; c < C; ++c) qg[c] = _mm512_loadu_ps(qf + g * HD + 16 * c);
      __m512 a[16];
      for (int j = 0; j < 16; ++j) {
        a[j] = _mm512_mul_ps(qg[0], _mm512_load_ps(kt + j * HD));
        for (int c = 1; c < C; ++c) a[j] = _mm512_fmadd_ps(qg[c], _mm512_load_ps(kt + j * HD + 16 * c), a[j]);
      }
      _mm512_storeu_ps(scores + g * padded + t0, reduce16(a));
    }
  }
  for (int g = 0; g < group; ++g) {
    float* sg = scores + g * padded;
    for (int64_t t = n; t < padded; ++t) sg[t] = -std::numeric_limits<float>::infinity();
    __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t t = 0; t < padded; t += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(sg + t));
    const __m512 vmax = _mm512_set1_ps(_mm512_reduce_max_ps(m));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t t = 0; t < padded; t += 16) {
      const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(sg + t), vmax));
      _mm512_storeu_ps(sg + t, e);
      sum = _mm512_add_ps(sum, e);
    }
    inv_sum[g] = 1.f / _mm512_reduce_add_ps(sum);
  }

  constexpr int AG = G > 0 ? G : 16;  // register accumulators when the group is fixed
  __m512 acc[AG][C];
  for (int g = 0; g < group; ++g)
    for (int c = 0; c < C; ++c) acc[g][c] = _mm512_setzero_ps();
  for (int64_t start = 0; start < n; start += bs) {
    const T* vp = vc + job.table[start / bs] * bs * pool.token_stride + pool.head_offset;
    const int64_t len = std::min(bs, n - start);
    for (int64_t j = 0; j < len; ++j, vp += pool.token_stride) {
      __m512 v[C];
      for (int c = 0; c < C; ++c) v[c] = load16(vp + 16 * c);
      for (int g = 0; g < group; ++g) {
        const __m512 p = _mm512_set1_ps(scores[g * padded + start + j]);
        for (int c = 0; c < C; ++c) acc[g][c] = _mm512_fmadd_ps(p, v[c], acc[g][c]);
      }
    }
  }
  T* out = static_cast<T*>(job.out);
  for (int g = 0; g < group; ++g) {
    const __m512 inv = _mm512_set1_ps(inv_sum[g]);
    for (int c = 0; c < C; ++c) store16(out + g * job.out_head_stride + 16 * c, _mm512_mul_ps(acc[g][c], inv));
  }
}

template <typename T, int C>
void attend_avx512_group(const Job& job, const Pool& pool, int group, float scale, std::vector<float>& work) {
  switch (group) {
    case 1: return attend_avx512<T, C, 1>(job, pool, group, scale, work);
    case 2: return attend_avx512<T, C, 2>(job, pool, group, scale, work);
    case 3: return attend_avx512<T, C, 3>(job, pool, group, scale, work);  // SmolLM2: 9 heads on 3
    case 4: return attend_avx512<T, C, 4>(job, pool, group, scale, work);
    case 8: return attend_avx512<T, C, 8>(job, pool, group, scale, work);
    default: return attend_avx512<T, C, 0>(job, pool, group, scale, work);
  }
}
#endif

template <typename T>
void run_all(const at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
             const at::Tensor& block_tables, const std::optional<at::Tensor>& row_tables,
             const at::Tensor& context_lens, double scale) {
  const int64_t rows = q.size(0), heads = q.size(1), hd = q.size(2);
  const int64_t kv_heads = k_cache.size(2);
  const int group = static_cast<int>(heads / kv_heads);
  const T* qp = q.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int64_t* which = row_tables ? row_tables->data_ptr<int64_t>() : nullptr;  // none: row r reads table r
  const int64_t* lens = context_lens.data_ptr<int64_t>();
  const int64_t table_stride = block_tables.stride(0);
  const float fscale = static_cast<float>(scale);
  at::parallel_for(0, rows * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> work;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t r = i / kv_heads, h = i % kv_heads;
      const Job job{qp + r * q.stride(0) + h * group * q.stride(1), q.stride(1), tables + (which ? which[r] : r) * table_stride,
                    lens[r], op + r * out.stride(0) + h * group * out.stride(1), out.stride(1)};
      const Pool pool{k_cache.data_ptr<T>(), v_cache.data_ptr<T>(), k_cache.size(1), kv_heads * hd, h * hd};
      if (job.context <= 0) {  // nothing to attend to: a zero output, as an empty softmax-weighted sum
        for (int g = 0; g < group; ++g)
          for (int64_t d = 0; d < hd; ++d) store(static_cast<T*>(job.out) + g * job.out_head_stride + d, 0.f);
        continue;
      }
#if defined(__AVX512F__)
      if (hd == 64 && group <= 16) { attend_avx512_group<T, 4>(job, pool, group, fscale, work); continue; }
      if (hd == 128 && group <= 16) { attend_avx512_group<T, 8>(job, pool, group, fscale, work); continue; }
#endif
      attend_scalar<T>(job, pool, group, hd, fscale, work);
    }
  });
}

}  // namespace

namespace batchtop_cpu {

// out, q: (rows, heads, head_dim), last dim contiguous; k/v_cache: one contiguous pool layer;
// block_tables: (num_tables, max_blocks) int64 with contiguous rows; row_tables: (rows,) int64,
// the table each query row reads (None: row r reads table r); context_lens: (rows,) int64, the keys [0, len) each row attends to.
void paged_attention(at::Tensor out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                     const at::Tensor& block_tables, const std::optional<at::Tensor>& row_tables,
                     const at::Tensor& context_lens, double scale) {
  TORCH_CHECK(q.device().is_cpu(), "paged_attention: CPU tensors only");
  TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1 && out.stride(2) == 1 && out.sizes() == q.sizes(),
              "paged_attention: q and out are (rows, heads, head_dim)");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "paged_attention: the pool must be contiguous");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && q.scalar_type() == out.scalar_type(),
              "paged_attention: q, out and the pool must share a dtype");
  TORCH_CHECK(q.size(1) % k_cache.size(2) == 0, "paged_attention: heads must be a multiple of kv heads");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && block_tables.stride(1) == 1, "paged_attention: tables");
  TORCH_CHECK(!row_tables || (row_tables->scalar_type() == at::kLong && row_tables->is_contiguous() &&
                               row_tables->size(0) == q.size(0)), "paged_attention: row_tables");
  TORCH_CHECK(row_tables || block_tables.size(0) >= q.size(0), "paged_attention: a table per row");
  TORCH_CHECK(context_lens.scalar_type() == at::kLong && context_lens.is_contiguous() &&
              context_lens.size(0) == q.size(0), "paged_attention: context_lens");
  by_dtype(q, "paged_attention: float32 or bfloat16 only",
           [&](auto t) {
             run_all<decltype(t)>(out, q, k_cache, v_cache, block_tables, row_tables, context_lens, scale);
           });
}

}  // namespace batchtop_cpu

TORCH_LIBRARY(batchtop_cpu, m) {
  m.def("paged_attention(Tensor(a!) out, Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor? row_tables, Tensor context_lens, float scale) -> ()");
  m.impl("paged_attention", c10::DispatchKey::CPU, TORCH_FN(batchtop_cpu::paged_attention));
}
