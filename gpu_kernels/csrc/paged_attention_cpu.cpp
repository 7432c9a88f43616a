// Paged attention for the CPU, reading the KV pool in place. Every query row has its own block
// table row and context length, so decode rows (one new token each) and the rows of prompt chunks
// whose K/V already sit in the pool go through one call: the "varlen" batch of a whole step.
//
// The pool layer is (num_blocks, block_size, kv_heads, head_dim); token p of a row's sequence sits in
// block_tables[row_tables[r]][p / block_size] at offset p % block_size. The query heads that share a
// KV head are handled together, so each key and value is read once per KV head. Math in fp32 with a
// max-subtracted softmax, like the torch reference; each row is computed alone in a fixed order, so
// its result does not depend on which other rows share the batch.

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#include "cpu_vec.h"
#include "ops_cpu.h"

namespace {

using namespace batchtop_cpu;

struct Job {  // one (query row, KV head): where its inputs are and where its output goes
  const void* q;  // first of its `group` query heads
  int64_t q_head_stride;
  const int64_t* table;
  int64_t context;
  void* out;
  int64_t out_head_stride;
  // Tokens [next_begin, next_end) of the next row (its block table next_table), to prefetch whole while
  // this job walks: none when next_begin == next_end (see run_parts).
  const int64_t* next_table = nullptr;
  int64_t next_begin = 0, next_end = 0;
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

// One call's rows, as the jobs read them: job (row r, KV head h) takes r's query heads [h group, h group +
// group) and its table, and writes the same heads of its output row; its pool is layer's heads h.
template <typename T>
struct CallRows {
  const at::Tensor& q;
  const at::Tensor& out;
  const at::Tensor& k_cache;
  const at::Tensor& v_cache;
  const at::Tensor& block_tables;
  const int64_t* which;  // row_tables: row r reads table which[r]; none: table r
  const int64_t* lens;
  int64_t kv_heads, hd, group;

  CallRows(const at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
           const at::Tensor& block_tables, const std::optional<at::Tensor>& row_tables, const at::Tensor& context_lens)
      : q(q), out(out), k_cache(k_cache), v_cache(v_cache), block_tables(block_tables),
        which(row_tables ? row_tables->data_ptr<int64_t>() : nullptr), lens(context_lens.data_ptr<int64_t>()),
        kv_heads(k_cache.size(2)), hd(q.size(2)), group(q.size(1) / k_cache.size(2)) {}

  const int64_t* table(int64_t r) const {
    return block_tables.data_ptr<int64_t>() + (which ? which[r] : r) * block_tables.stride(0);
  }
  Job job(int64_t r, int64_t h) const {
    return Job{q.data_ptr<T>() + r * q.stride(0) + h * group * q.stride(1), q.stride(1), table(r), lens[r],
               out.data_ptr<T>() + r * out.stride(0) + h * group * out.stride(1), out.stride(1)};
  }
  Pool pool(int64_t h) const {
    return Pool{k_cache.data_ptr<T>(), v_cache.data_ptr<T>(), k_cache.size(1), kv_heads * hd, h * hd};
  }
};

// Keys a row's score buffer holds: its context rounded up to whole tiles of 16.
inline int64_t padded_keys(int64_t context) { return (std::max<int64_t>(context, 0) + 15) / 16 * 16; }

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

// A pool that has served a few hundred requests hands out blocks in no order, so every block starts a
// stream the hardware prefetchers have not seen: left to them, the walk over a cold pool read 6-7 GB/s
// of the 35 this 2-core host streams (bench/cpu_kernels.py). The walk prefetches each job's keys and
// values into L2 a block ahead through the same block table, and the first KV head's job fetches
// whole tokens (a token's heads sit side by side), so the other heads' jobs, run next on the same
// thread, find them in cache: about twice as fast on a cold pool. run_parts fetches each job's first
// PREFETCH_TOKENS while the job before it runs; the job keeps PREFETCH_TOKENS ahead of its walk. The
// other heads' jobs, which read from cache and leave memory idle, prefetch the next row's tokens
// (NextRow): 1.11-1.21x on 14 and 16 rows of a cold SmolLM2 pool, no change at 1-2 rows.
constexpr int64_t PREFETCH_TOKENS = 16;

struct Cursor {  // a token's place in a row's block table, advanced without a division per token
  int64_t block = 0, offset = 0;

  static Cursor at_token(int64_t t, const Pool& pool) { return Cursor{t / pool.block_size, t % pool.block_size}; }
  int64_t token(const int64_t* table, const Pool& pool) const {  // where the token starts in the pool layer
    return (table[block] * pool.block_size + offset) * pool.token_stride;
  }
  int64_t element(const Job& job, const Pool& pool) const {  // where the token's head starts in the pool layer
    return token(job.table, pool) + pool.head_offset;
  }
  void advance(const Pool& pool) {
    if (++offset == pool.block_size) offset = 0, ++block;
  }
};

// Prefetches into L2 the K and V of `width` elements from `element` of the pool layer.
// __builtin_prefetch(p, 0, 2) is prefetcht1 on x86 and a plain hint, or nothing, elsewhere.
template <typename T>
inline void prefetch_kv(const Pool& pool, int64_t element, int64_t width) {
  const char* kp = reinterpret_cast<const char*>(static_cast<const T*>(pool.k) + element);
  const char* vp = reinterpret_cast<const char*>(static_cast<const T*>(pool.v) + element);
  const int64_t lines = (width * static_cast<int64_t>(sizeof(T)) + 63) / 64;
  for (int64_t l = 0; l < lines; ++l) {
    __builtin_prefetch(kp + 64 * l, 0, 2);
    __builtin_prefetch(vp + 64 * l, 0, 2);
  }
}

// Prefetches `count` tokens from `at` on (head_dim elements a head, every head of the token for the
// first KV head's job); advances `at`.
template <typename T>
inline void prefetch_tokens(const Job& job, const Pool& pool, int64_t hd, Cursor& at, int64_t count) {
  const int64_t width = pool.head_offset == 0 ? pool.token_stride : hd;
  for (int64_t j = 0; j < count; ++j, at.advance(pool)) prefetch_kv<T>(pool, at.element(job, pool), width);
}

// The cursor PREFETCH_TOKENS into a job, where its own prefetching starts (run_parts fetched those before).
inline Cursor prefetch_cursor(const Job& job, const Pool& pool) {
  return Cursor::at_token(std::min(PREFETCH_TOKENS, job.context), pool);
}

// The next row's tokens a job prefetches whole (every head's K and V) as it walks its own keys, an
// even share at each tile of 16 keys, so that they arrive while this job computes, not as a burst.
struct NextRow {
  const int64_t* table;
  Cursor at;
  int64_t left, per_tile;

  NextRow(const Job& job, const Pool& pool)
      : table(job.next_table), at(Cursor::at_token(job.next_begin, pool)), left(job.next_end - job.next_begin),
        per_tile(job.context > 0 ? (left + (job.context + 15) / 16 - 1) / ((job.context + 15) / 16) : 0) {}

  template <typename T>
  void prefetch(const Pool& pool) {
    for (int64_t j = 0; j < per_tile && left > 0; ++j, --left, at.advance(pool))
      prefetch_kv<T>(pool, at.token(table, pool), pool.token_stride);
  }
};

// At the tile of keys from t0: the 16 tokens PREFETCH_TOKENS further on, as far as the context goes.
template <typename T>
inline void prefetch_ahead(const Job& job, const Pool& pool, int64_t hd, Cursor& ahead, int64_t t0) {
  if (t0 + PREFETCH_TOKENS < job.context)
    prefetch_tokens<T>(job, pool, hd, ahead, std::min<int64_t>(16, job.context - t0 - PREFETCH_TOKENS));
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
  Cursor at, ahead = prefetch_cursor(job, pool);
  NextRow next(job, pool);
  for (int64_t t0 = 0; t0 < n; t0 += 16) {
    const int64_t len = std::min<int64_t>(16, n - t0);
    prefetch_ahead<T>(job, pool, HD, ahead, t0);
    next.prefetch<T>(pool);
    for (int64_t j = 0; j < 16; ++j) {
      if (j < len) {
        const T* kp = kc + at.element(job, pool);
        for (int c = 0; c < C; ++c) _mm512_store_ps(kt + j * HD + 16 * c, load16(kp + 16 * c));
        at.advance(pool);
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

#if defined(__AVX512BF16__)
// Scores of keys [t_begin, t_end) (t_begin a multiple of 16, t_end a multiple of 16 or the context) for
// the job's query heads: scores[g * padded + t], -inf past the context. next_row: also prefetch the next
// row's keys as the job says (a whole job's walk).
template <int P, int G>
void bf16_scores(const Job& job, const Pool& pool, int runtime_group, float scale, float* scores, int64_t padded,
                 int64_t t_begin, int64_t t_end, bool next_row) {
  using bf16 = c10::BFloat16;
  constexpr int AG = G > 0 ? G : 16;
  const int group = G > 0 ? G : runtime_group;
  const bf16* q = static_cast<const bf16*>(job.q);
  const bf16* kc = static_cast<const bf16*>(pool.k);
  __m512bh qv[AG][P];
  for (int g = 0; g < group; ++g)
    for (int c = 0; c < P; ++c)
      qv[g][c] = (__m512bh)_mm512_loadu_si512(q + g * job.q_head_stride + 32 * c);
  const __m512 vscale = _mm512_set1_ps(scale);
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  Cursor at = Cursor::at_token(t_begin, pool);
  Cursor ahead = Cursor::at_token(std::min(t_begin + PREFETCH_TOKENS, t_end), pool);
  NextRow next(job, pool);
  const bf16* key[16];
  for (int64_t t0 = t_begin; t0 < t_end; t0 += 16) {
    const int len = static_cast<int>(std::min<int64_t>(16, t_end - t0));
    if (t0 + PREFETCH_TOKENS < t_end)
      prefetch_tokens<bf16>(job, pool, 32 * P, ahead, std::min<int64_t>(16, t_end - t0 - PREFETCH_TOKENS));
    if (next_row) next.prefetch<bf16>(pool);
    for (int j = 0; j < 16; ++j) {  // past the context: the last key again, its score -inf
      if (j < len) {
        key[j] = kc + at.element(job, pool);
        at.advance(pool);
      } else {
        key[j] = key[len - 1];
      }
    }
    const __mmask16 valid = static_cast<__mmask16>((1u << len) - 1);
    for (int g = 0; g < group; ++g) {
      __m512 a[16];
      for (int j = 0; j < 16; ++j) {
        a[j] = _mm512_dpbf16_ps(_mm512_setzero_ps(), qv[g][0], (__m512bh)_mm512_loadu_si512(key[j]));
        for (int c = 1; c < P; ++c)
          a[j] = _mm512_dpbf16_ps(a[j], qv[g][c], (__m512bh)_mm512_loadu_si512(key[j] + 32 * c));
      }
      _mm512_storeu_ps(scores + g * padded + t0, _mm512_mask_blend_ps(valid, ninf, _mm512_mul_ps(reduce16(a), vscale)));
    }
  }
}

// Each head's softmax over its padded scores: exp(s - max) in fp32, summed lane-wise in key order, rounded
// to bf16 into probs (the same layout); inv_sum[g] = 1 / the sum.
inline void bf16_softmax(const float* scores, int64_t padded, int group, c10::BFloat16* probs, float* inv_sum) {
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int g = 0; g < group; ++g) {
    const float* sg = scores + g * padded;
    __m512 m = ninf;
    for (int64_t t = 0; t < padded; t += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(sg + t));
    const __m512 vmax = _mm512_set1_ps(_mm512_reduce_max_ps(m));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t t = 0; t < padded; t += 16) {
      const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(sg + t), vmax));
      sum = _mm512_add_ps(sum, e);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(probs + g * padded + t), (__m256i)_mm512_cvtneps_pbh(e));
    }
    inv_sum[g] = 1.f / _mm512_reduce_add_ps(sum);
  }
}

// out for vectors [c0, c0 + NC) (32 dims each) of every query head: each pair of keys' values read once
// for all the heads (an odd context's last pair repeats its key, with probability 0), times inv_sum. NC
// is fixed so that the sums stay in registers (a runtime count of vectors left them on the stack).
template <int P, int G, int NC>
void bf16_value_walk(const Job& job, const Pool& pool, int runtime_group, const c10::BFloat16* probs, int64_t padded,
                     const float* inv_sum, int c0) {
  using bf16 = c10::BFloat16;
  constexpr int AG = G > 0 ? G : 16;
  const int group = G > 0 ? G : runtime_group;
  const bf16* vc = static_cast<const bf16*>(pool.v) + 32 * c0;
  const int64_t n = job.context;
  __m512 acc[AG][2 * NC];  // [2c]: the lo dims of vector c0 + c, [2c + 1]: its hi dims
  for (int g = 0; g < group; ++g)
    for (int c = 0; c < 2 * NC; ++c) acc[g][c] = _mm512_setzero_ps();
  const auto* pairs = reinterpret_cast<const uint32_t*>(probs);
  Cursor at;
  for (int64_t j = 0; j < n; j += 2) {
    const bf16* v0 = vc + at.element(job, pool);
    at.advance(pool);
    const bf16* v1 = v0;
    if (j + 1 < n) {
      v1 = vc + at.element(job, pool);
      at.advance(pool);
    }
    __m512bh lo[NC], hi[NC];
    for (int c = 0; c < NC; ++c) {
      const __m512i x = _mm512_loadu_si512(v0 + 32 * c), y = _mm512_loadu_si512(v1 + 32 * c);
      lo[c] = (__m512bh)_mm512_unpacklo_epi16(x, y);
      hi[c] = (__m512bh)_mm512_unpackhi_epi16(x, y);
    }
    for (int g = 0; g < group; ++g) {
      const __m512bh w = (__m512bh)_mm512_set1_epi32(static_cast<int>(pairs[(g * padded + j) / 2]));
      for (int c = 0; c < NC; ++c) {
        acc[g][2 * c] = _mm512_dpbf16_ps(acc[g][2 * c], w, lo[c]);
        acc[g][2 * c + 1] = _mm512_dpbf16_ps(acc[g][2 * c + 1], w, hi[c]);
      }
    }
  }
  // Lane i of lo is dim 8 (i / 4) + i % 4 of its 32; of hi, that + 4. Dims 0-15 are lo 0-3, hi 0-3,
  // lo 4-7, hi 4-7; dims 16-31 the same from lanes 8-15.
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  bf16* out = static_cast<bf16*>(job.out) + 32 * c0;
  for (int g = 0; g < group; ++g) {
    const __m512 inv = _mm512_set1_ps(inv_sum[g]);
    for (int c = 0; c < NC; ++c) {
      const __m512 lo = acc[g][2 * c], hi = acc[g][2 * c + 1];
      store16(out + g * job.out_head_stride + 32 * c, _mm512_mul_ps(_mm512_permutex2var_ps(lo, first, hi), inv));
      store16(out + g * job.out_head_stride + 32 * c + 16, _mm512_mul_ps(_mm512_permutex2var_ps(lo, second, hi), inv));
    }
  }
}

// Vectors [c_begin, c_end) of the values: all of them in one walk, or each part of a share in its own.
template <int P, int G>
void bf16_values(const Job& job, const Pool& pool, int group, const c10::BFloat16* probs, int64_t padded,
                 const float* inv_sum, int c_begin, int c_end) {
  if (c_begin == 0 && c_end == P) return bf16_value_walk<P, G, P>(job, pool, group, probs, padded, inv_sum, 0);
  for (int c = c_begin; c < c_end; ++c) bf16_value_walk<P, G, 1>(job, pool, group, probs, padded, inv_sum, c);
}

// bf16 pools on AVX512_BF16, in two passes over the keys, as attend_avx512: every score first, then each
// head's softmax over the whole row, then the values. A tile's scores depend on no other tile, so the
// core overlaps them; a one-pass (online) softmax chains every tile to the one before through its running
// max (a reduction, an exp and a rescale of the sums): two passes ran a SmolLM2 layer's 3 jobs 1.29x
// (256 keys) and 1.35x (1024) as fast on one thread, from cache. Scores are vdpbf16ps over the bf16 query and keys
// (the products are exact, summed in fp32); the unnormalised probabilities are rounded to bf16 for the
// value sum, as torch's CPU flash attention rounds them, and the values are summed as bf16 pairs of keys
// (j, j+1) by vdpbf16ps, in fp32. The values, prefetched with the keys, are read from cache.
//
// P = head_dim / 32 bf16 vectors per head (2 for head_dim 64, 4 for 128), G query heads per KV head.
// unpacklo/hi_epi16 of two keys' value vectors interleave their dims by pairs within each 128-bit
// lane: the lo half holds dims 8k..8k+3 of lane k, the hi half 8k+4..8k+7, put back in order at the end.
template <int P, int G>
void attend_bf16_twopass(const Job& job, const Pool& pool, int runtime_group, float scale, std::vector<float>& work) {
  const int group = G > 0 ? G : runtime_group;
  const int64_t padded = padded_keys(job.context);
  work.resize(group * padded + group * padded / 2);  // fp32 scores, then the bf16 probabilities
  float* scores = work.data();
  auto* probs = reinterpret_cast<c10::BFloat16*>(scores + group * padded);
  float inv_sum[16];
  bf16_scores<P, G>(job, pool, group, scale, scores, padded, 0, job.context, true);
  bf16_softmax(scores, padded, group, probs, inv_sum);
  bf16_values<P, G>(job, pool, group, probs, padded, inv_sum, 0, P);
}

template <int P>
void attend_bf16_group(const Job& job, const Pool& pool, int group, float scale, std::vector<float>& work) {
  switch (group) {
    case 1: return attend_bf16_twopass<P, 1>(job, pool, group, scale, work);
    case 2: return attend_bf16_twopass<P, 2>(job, pool, group, scale, work);
    case 3: return attend_bf16_twopass<P, 3>(job, pool, group, scale, work);
    case 4: return attend_bf16_twopass<P, 4>(job, pool, group, scale, work);
    case 8: return attend_bf16_twopass<P, 8>(job, pool, group, scale, work);
    default: return attend_bf16_twopass<P, 0>(job, pool, group, scale, work);
  }
}
#endif

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

#if defined(BATCHTOP_AVX2)
// Lane sums of 8 vectors as one vector: out[j] = sum of a[j]'s 8 lanes.
inline __m256 reduce8(const __m256 (&a)[8]) {
  // hadd(x, y) = [x0+x1, x2+x3, y0+y1, y2+y3 | the same of lanes 4-7]: two rounds leave each vector's
  // sums of lanes 0-3 in the low half and of lanes 4-7 in the high half.
  const __m256 s0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 s1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(s0, s1, 0x20), _mm256_permute2f128_ps(s0, s1, 0x31));
}

// attend_avx512's two passes on 8 lanes: C = head_dim / 8 vectors per head, G query heads per KV head
// (0: a runtime group). AVX2 has 16 vector registers, so the tile is 8 keys, and the value sums are
// kept in memory and taken up CV vectors at a time, a tile of 8 values at once, in registers.
template <typename T, int C, int G>
void attend_avx2(const Job& job, const Pool& pool, int runtime_group, float scale, std::vector<float>& work) {
  constexpr int HD = 8 * C, CV = 4;
  static_assert(C % CV == 0);
  const int group = G > 0 ? G : runtime_group;
  const T* q = static_cast<const T*>(job.q);
  const T* kc = static_cast<const T*>(pool.k);
  const T* vc = static_cast<const T*>(pool.v);
  const int64_t n = job.context, padded = (n + 7) / 8 * 8;
  work.assign(group * (padded + 2 * HD) + group, 0.f);
  float* scores = work.data();
  float* qf = scores + group * padded;
  float* acc = qf + group * HD;
  float* inv_sum = acc + group * HD;
  const __m256 vscale = _mm256_set1_ps(scale);
  for (int g = 0; g < group; ++g)
    for (int c = 0; c < C; ++c)
      _mm256_storeu_ps(qf + g * HD + 8 * c, _mm256_mul_ps(load8(q + g * job.q_head_stride + 8 * c), vscale));

  // Scores: a tile's 8 keys in fp32 once, then per query head 8 dot products reduced together.
  alignas(32) float tile[8 * HD];
  Cursor at, ahead = prefetch_cursor(job, pool);
  NextRow next(job, pool);
  const auto load_tile = [&](const T* base, Cursor& cursor, int64_t len) {
    for (int64_t j = 0; j < 8; ++j) {
      if (j < len) {
        const T* p = base + cursor.element(job, pool);
        for (int c = 0; c < C; ++c) _mm256_store_ps(tile + j * HD + 8 * c, load8(p + 8 * c));
        cursor.advance(pool);
      } else {
        for (int c = 0; c < C; ++c) _mm256_store_ps(tile + j * HD + 8 * c, _mm256_setzero_ps());
      }
    }
  };
  for (int64_t t0 = 0; t0 < n; t0 += 8) {
    if (t0 % 16 == 0) {  // the prefetch schedule is per 16 keys
      prefetch_ahead<T>(job, pool, HD, ahead, t0);
      next.prefetch<T>(pool);
    }
    load_tile(kc, at, std::min<int64_t>(8, n - t0));
    for (int g = 0; g < group; ++g) {
      const float* qg = qf + g * HD;
      __m256 a[8];
      for (int j = 0; j < 8; ++j) a[j] = _mm256_mul_ps(_mm256_loadu_ps(qg), _mm256_load_ps(tile + j * HD));
      for (int c = 1; c < C; ++c) {
        const __m256 qc = _mm256_loadu_ps(qg + 8 * c);
        for (int j = 0; j < 8; ++j) a[j] = _mm256_fmadd_ps(qc, _mm256_load_ps(tile + j * HD + 8 * c), a[j]);
      }
      _mm256_storeu_ps(scores + g * padded + t0, reduce8(a));
    }
  }
  for (int g = 0; g < group; ++g) {
    float* sg = scores + g * padded;
    for (int64_t t = n; t < padded; ++t) sg[t] = -std::numeric_limits<float>::infinity();
    __m256 m = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t t = 0; t < padded; t += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(sg + t));
    const __m256 vmax = _mm256_set1_ps(reduce_max8(m));
    __m256 sum = _mm256_setzero_ps();
    for (int64_t t = 0; t < padded; t += 8) {
      const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sg + t), vmax));
      _mm256_storeu_ps(sg + t, e);
      sum = _mm256_add_ps(sum, e);
    }
    inv_sum[g] = 1.f / reduce_add8(sum);
  }

  // Values: the tile's 8 in fp32 once, then per query head and run of CV vectors, the 8 weighted adds
  // in registers (past the context the weights are 0 and the values 0).
  at = Cursor{};
  for (int64_t t0 = 0; t0 < n; t0 += 8) {
    load_tile(vc, at, std::min<int64_t>(8, n - t0));
    for (int g = 0; g < group; ++g) {
      const float* pg = scores + g * padded + t0;
      for (int c0 = 0; c0 < C; c0 += CV) {
        float* ag = acc + g * HD + 8 * c0;
        __m256 a[CV];
        for (int c = 0; c < CV; ++c) a[c] = _mm256_loadu_ps(ag + 8 * c);
        for (int j = 0; j < 8; ++j) {
          const __m256 p = _mm256_broadcast_ss(pg + j);
          for (int c = 0; c < CV; ++c) a[c] = _mm256_fmadd_ps(p, _mm256_load_ps(tile + j * HD + 8 * (c0 + c)), a[c]);
        }
        for (int c = 0; c < CV; ++c) _mm256_storeu_ps(ag + 8 * c, a[c]);
      }
    }
  }
  T* out = static_cast<T*>(job.out);
  for (int g = 0; g < group; ++g) {
    const __m256 inv = _mm256_set1_ps(inv_sum[g]);
    for (int c = 0; c < C; ++c)
      store8(out + g * job.out_head_stride + 8 * c, _mm256_mul_ps(_mm256_loadu_ps(acc + g * HD + 8 * c), inv));
  }
}

template <typename T, int C>
void attend_avx2_group(const Job& job, const Pool& pool, int group, float scale, std::vector<float>& work) {
  switch (group) {
    case 1: return attend_avx2<T, C, 1>(job, pool, group, scale, work);
    case 2: return attend_avx2<T, C, 2>(job, pool, group, scale, work);
    case 3: return attend_avx2<T, C, 3>(job, pool, group, scale, work);  // SmolLM2: 9 heads on 3
    case 4: return attend_avx2<T, C, 4>(job, pool, group, scale, work);
    case 8: return attend_avx2<T, C, 8>(job, pool, group, scale, work);
    default: return attend_avx2<T, C, 0>(job, pool, group, scale, work);
  }
}
#endif

#if defined(__AVX512BF16__)
// A team's attention over a few rows of a bf16 pool (paged_attention_team): every thread scores its share
// of each row's key tiles for every KV head (the keys of a token read once, by one thread), then, past a
// barrier, takes its share of the (row, KV head, 32-dim vector) value sums, each head's softmax computed
// by whichever thread needs it. The pieces are attend_bf16_twopass's, over the same elements in the same
// order: the same bits as a job alone.
template <int P, int G>
void attend_bf16_team(const at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                      const at::Tensor& block_tables, const std::optional<at::Tensor>& row_tables,
                      const at::Tensor& context_lens, float scale, int64_t part, int64_t parts, float* scores,
                      TeamBarrier& barrier) {
  using bf16 = c10::BFloat16;
  const CallRows<bf16> call(out, q, k_cache, v_cache, block_tables, row_tables, context_lens);
  const int64_t rows = q.size(0), heads = q.size(1), kv_heads = call.kv_heads;
  const int group = static_cast<int>(call.group);
  std::vector<int64_t> base(rows + 1, 0);  // row r's scores from scores + base[r], (KV head, query head, key)
  for (int64_t r = 0; r < rows; ++r) base[r + 1] = base[r] + heads * padded_keys(call.lens[r]);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = call.lens[r], padded = padded_keys(n), tiles = padded / 16;
    const int64_t t_begin = tiles * part / parts * 16, t_end = std::min(n, tiles * (part + 1) / parts * 16);
    for (int64_t h = 0; h < kv_heads && t_begin < t_end; ++h)  // head 0 prefetches whole tokens for the others
      bf16_scores<P, G>(call.job(r, h), call.pool(h), group, scale, scores + base[r] + h * group * padded, padded,
                        t_begin, t_end, false);
  }
  barrier.wait(static_cast<int>(parts));
  thread_local std::vector<bf16> probs;
  float inv_sum[16];
  const int64_t units = rows * kv_heads * P;
  int64_t u = units * part / parts;
  const int64_t u_end = units * (part + 1) / parts;
  while (u < u_end) {
    const int64_t r = u / (kv_heads * P), h = u / P % kv_heads, c0 = u % P;
    const int64_t c1 = std::min<int64_t>(P, c0 + (u_end - u));  // this (row, KV head)'s vectors in the share
    u += c1 - c0;
    const Job job = call.job(r, h);
    if (job.context <= 0) {  // nothing to attend to: zeros, as a job alone
      for (int g = 0; g < group; ++g)
        for (int64_t d = 32 * c0; d < 32 * c1; ++d)
          static_cast<bf16*>(job.out)[g * job.out_head_stride + d] = bf16(0.f);
      continue;
    }
    const int64_t padded = padded_keys(job.context);
    probs.resize(group * padded);
    bf16_softmax(scores + base[r] + h * group * padded, padded, group, probs.data(), inv_sum);
    bf16_values<P, G>(job, call.pool(h), group, probs.data(), padded, inv_sum, static_cast<int>(c0),
                      static_cast<int>(c1));
  }
}

template <int P>
void attend_bf16_team_group(int group, const at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache,
                            const at::Tensor& v_cache, const at::Tensor& block_tables,
                            const std::optional<at::Tensor>& row_tables, const at::Tensor& context_lens, float scale,
                            int64_t part, int64_t parts, float* scores, TeamBarrier& barrier) {
  switch (group) {
#define TEAM_CASE(G)                                                                                      \
  case G:                                                                                                 \
    return attend_bf16_team<P, G>(out, q, k_cache, v_cache, block_tables, row_tables, context_lens, scale, \
                                  part, parts, scores, barrier);
    TEAM_CASE(1) TEAM_CASE(2) TEAM_CASE(3) TEAM_CASE(4) TEAM_CASE(8)
#undef TEAM_CASE
    default: return attend_bf16_team<P, 0>(out, q, k_cache, v_cache, block_tables, row_tables, context_lens, scale,
                                           part, parts, scores, barrier);
  }
}
#endif

// Which (row, KV head) jobs, i = row * kv_heads + head, each of `threads` threads takes: a run of about
// equal cost (keys to read, plus a tile's worth for the setup), not of equal count: a mixed step's decode
// rows see hundreds of keys, its prompt rows a few dozen. Which thread computes a job changes none of its bits.
struct JobSplit {
  int64_t jobs, parts;
  std::vector<int64_t> cost_before;

  JobSplit(const int64_t* lens, int64_t rows, int64_t kv_heads, int64_t threads)
      : jobs(rows * kv_heads), parts(std::min<int64_t>(threads, rows * kv_heads)), cost_before(jobs + 1, 0) {
    for (int64_t i = 0; i < jobs; ++i) cost_before[i + 1] = cost_before[i] + std::max<int64_t>(lens[i / kv_heads], 0) + 16;
  }
  int64_t first_job(int64_t part) const {  // where part's share starts; jobs for part == parts
    const int64_t share = cost_before[jobs] * part / parts;
    return static_cast<int64_t>(std::lower_bound(cost_before.begin(), cost_before.end() - 1, share) - cost_before.begin());
  }
};

// Parts [first_part, end_part) of the call's job split, on the calling thread.
template <typename T>
void run_parts(const at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
               const at::Tensor& block_tables, const std::optional<at::Tensor>& row_tables,
               const at::Tensor& context_lens, double scale, const JobSplit& split, int64_t first_part,
               int64_t end_part) {
  const CallRows<T> call(out, q, k_cache, v_cache, block_tables, row_tables, context_lens);
  const int64_t hd = call.hd, kv_heads = call.kv_heads;
  const int group = static_cast<int>(call.group);
  const int64_t* lens = call.lens;
  const float fscale = static_cast<float>(scale);
  // Job (r, h) of thread range [.., end): the first KV head's job reads whole tokens from memory and
  // leaves them in L2 for the other heads' jobs, which then leave memory idle. Those (h >= 1) prefetch
  // the next row's tokens, a share each, so that its first head's job finds them in L2 too, unless that
  // row is another thread's or reads the same table (a prompt chunk's rows: its keys are in cache).
  const auto job_at = [&](int64_t i, int64_t end) {
    const int64_t r = i / kv_heads, h = i % kv_heads;
    Job job = call.job(r, h);
    if (h > 0 && (r + 1) * kv_heads < end && call.table(r + 1) != job.table && lens[r + 1] > 0) {
      const int64_t share = (lens[r + 1] + kv_heads - 2) / (kv_heads - 1);
      job.next_table = call.table(r + 1);
      job.next_begin = std::min(lens[r + 1], (h - 1) * share);
      job.next_end = std::min(lens[r + 1], h * share);
    }
    return job;
  };
  const auto pool_at = [&](int64_t i) { return call.pool(i % kv_heads); };
  const auto prefetch_start = [&](int64_t i) {  // a job's first keys and values, while the one before runs
    const Job job = job_at(i, i + 1);
    Cursor at;
    if (job.context > 0) prefetch_tokens<T>(job, pool_at(i), hd, at, std::min(PREFETCH_TOKENS, job.context));
  };
  const int64_t begin = split.first_job(first_part), end = split.first_job(end_part);
  if (begin < end) {
    std::vector<float> work;
    prefetch_start(begin);
    for (int64_t i = begin; i < end; ++i) {
      if (i + 1 < end) prefetch_start(i + 1);
      const Job job = job_at(i, end);
      const Pool pool = pool_at(i);
      if (job.context <= 0) {  // nothing to attend to: a zero output, as an empty softmax-weighted sum
        for (int g = 0; g < group; ++g)
          for (int64_t d = 0; d < hd; ++d) store(static_cast<T*>(job.out) + g * job.out_head_stride + d, 0.f);
        continue;
      }
#if defined(__AVX512BF16__)
      if constexpr (std::is_same_v<T, c10::BFloat16>) {
        if (hd == 64 && group <= 16) { attend_bf16_group<2>(job, pool, group, fscale, work); continue; }
        if (hd == 128 && group <= 16) { attend_bf16_group<4>(job, pool, group, fscale, work); continue; }
      }
#endif
#if defined(__AVX512F__)
      if (hd == 64 && group <= 16) { attend_avx512_group<T, 4>(job, pool, group, fscale, work); continue; }
      if (hd == 128 && group <= 16) { attend_avx512_group<T, 8>(job, pool, group, fscale, work); continue; }
#elif defined(BATCHTOP_AVX2)
      if (hd == 64) { attend_avx2_group<T, 8>(job, pool, group, fscale, work); continue; }
      if (hd == 128) { attend_avx2_group<T, 16>(job, pool, group, fscale, work); continue; }
#endif
      attend_scalar<T>(job, pool, group, hd, fscale, work);
    }
  }
}

}  // namespace

namespace batchtop_cpu {

int64_t paged_attention_team_scores(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& context_lens) {
#if defined(__AVX512BF16__)
  const int64_t hd = q.size(2), group = q.size(1) / k_cache.size(2);
  if (q.scalar_type() == at::kBFloat16 && (hd == 64 || hd == 128) && group <= 16) {
    int64_t floats = 0;
    for (int64_t r = 0; r < context_lens.size(0); ++r)
      floats += q.size(1) * padded_keys(context_lens.data_ptr<int64_t>()[r]);
    return floats;
  }
#endif
  return -1;
}

void paged_attention_team(at::Tensor out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                          const at::Tensor& block_tables, const std::optional<at::Tensor>& row_tables,
                          const at::Tensor& context_lens, double scale, int64_t part, int64_t parts, float* scores,
                          TeamBarrier& barrier) {
#if defined(__AVX512BF16__)
  if (scores != nullptr) {
    const int group = static_cast<int>(q.size(1) / k_cache.size(2));
    if (q.size(2) == 64)
      return attend_bf16_team_group<2>(group, out, q, k_cache, v_cache, block_tables, row_tables, context_lens,
                                       static_cast<float>(scale), part, parts, scores, barrier);
    return attend_bf16_team_group<4>(group, out, q, k_cache, v_cache, block_tables, row_tables, context_lens,
                                     static_cast<float>(scale), part, parts, scores, barrier);
  }
#endif
  paged_attention_parts(out, q, k_cache, v_cache, block_tables, row_tables, context_lens, scale, part, parts);
}

// out, q: (rows, heads, head_dim), last dim contiguous; k/v_cache: one contiguous pool layer;
// block_tables: (num_tables, max_blocks) int64 with contiguous rows; row_tables: (rows,) int64,
// the table each query row reads (None: row r reads table r); context_lens: (rows,) int64, the keys [0, len) each row attends to.
void paged_attention(at::Tensor out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                     const at::Tensor& block_tables, const std::optional<at::Tensor>& row_tables,
                     const at::Tensor& context_lens, double scale) {
  paged_attention_parts(out, q, k_cache, v_cache, block_tables, row_tables, context_lens, scale, -1, 0);
}

void paged_attention_parts(at::Tensor out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& block_tables, const std::optional<at::Tensor>& row_tables,
                           const at::Tensor& context_lens, double scale, int64_t part, int64_t parts) {
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
             using T = decltype(t);
             const JobSplit split(context_lens.data_ptr<int64_t>(), q.size(0), k_cache.size(2),
                                  part < 0 ? at::get_num_threads() : parts);
             if (part >= 0) {  // one thread of the caller's team: its part, if the split has one for it
               if (part < split.parts)
                 run_parts<T>(out, q, k_cache, v_cache, block_tables, row_tables, context_lens, scale, split, part,
                              part + 1);
               return;
             }
             at::parallel_for(0, split.parts, 1, [&](int64_t first_part, int64_t end_part) {
               run_parts<T>(out, q, k_cache, v_cache, block_tables, row_tables, context_lens, scale, split, first_part,
                            end_part);
             });
           });
}

}  // namespace batchtop_cpu
