// The register tiles of linear_quant_cpu.cpp: a call's quantized activations (quantize_row) and the kernel
// that takes TILE_ROWS rows times TILE_COLS columns of a block matrix through to fp32 sums (tile).
#pragma once

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <array>
#include <utility>
#include <cstdint>

#include "cpu_vec.h"
#include "quant_blocks.h"

#if defined(BATCHTOP_QUANT)
namespace batchtop_cpu::quant {

using bf16 = c10::BFloat16;

// A tile's accumulators (rows x columns), its columns' weights and scales, a row's x and dx fit the registers:
// 32 zmm on AVX-512, 16 ymm on AVX2. On one Zen 4 core, SmolLM2's 576 x 576 Q4_1 weight in cache: 4 x 4
// took 17.7 us at 1 row and 122 us at 16 rows, 8 rows x 2 columns 20.4 and 122 (the weight decode, once
// per column, is most of a 1-row GEMM: 4 columns share more of the rows' loads and loop overhead).
#if defined(BATCHTOP_QUANT_VNNI)
constexpr int TILE_COLS = 4;
constexpr int TILE_ROWS = 4;
#else
constexpr int TILE_COLS = 2;
constexpr int TILE_ROWS = 4;
#endif
// The weights PREFETCH_TILES tiles ahead are fetched as a tile runs: a 1-row tile of K = 576 takes ~0.12 us,
// so they are asked for ~1 us ahead, well past a DRAM latency
constexpr int64_t PREFETCH_TILES = 8;

inline int64_t pad16(int64_t n) { return (n + 15) / 16 * 16; }

// One call's activations: row r's int8 features at q + r * k, its block scales at dx + r * (k / 32), its
// offset terms (OFFSET * dx * block sum, one per GROUP features, zero-padded to a multiple of 16) at
// corr + r * corr_stride.
// dx_lanes (the AVX-512 tile's): each pair of blocks' two scales over 8 lanes each, 16 floats a pair.
struct Acts {
  const int8_t* q;
  const float* dx;
  const float* dx_lanes;
  const float* corr;
  int64_t k, blocks, pairs, corr_stride;
};

inline __m256 abs8(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.f), v); }
inline float int_sum8(__m256i v) { return reduce_add8(_mm256_cvtepi32_ps(v)); }  // small ints: exact

// Row x (k features, bf16 or float) as int8 blocks of 32: xq = round(x * 127 / max|x|), nearest even.
template <int GROUP, typename T>
void quantize_row(const T* x, int64_t k, float offset, int8_t* q, float* dx, float* corr) {
  for (int64_t b = 0; b < k / 32; ++b) {
    __m256 f[4];
    for (int i = 0; i < 4; ++i) f[i] = load8(x + 32 * b + 8 * i);
    const float amax = reduce_max8(_mm256_max_ps(_mm256_max_ps(abs8(f[0]), abs8(f[1])),
                                                 _mm256_max_ps(abs8(f[2]), abs8(f[3]))));
    const float d = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
    __m256i v[4];
    for (int i = 0; i < 4; ++i) v[i] = _mm256_cvtps_epi32(_mm256_mul_ps(f[i], _mm256_set1_ps(inv)));
    // packs interleave the 128-bit halves: 4-byte runs come out as v0 v1 v2 v3 (lows), v0 v1 v2 v3 (highs)
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 32 * b),
                        _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    dx[b] = d;
    if (offset == 0.f) continue;
    if constexpr (GROUP == 32) {
      corr[b] = offset * d * int_sum8(_mm256_add_epi32(_mm256_add_epi32(v[0], v[1]), _mm256_add_epi32(v[2], v[3])));
    } else {
      corr[2 * b] = offset * d * int_sum8(_mm256_add_epi32(v[0], v[1]));
      corr[2 * b + 1] = offset * d * int_sum8(_mm256_add_epi32(v[2], v[3]));
    }
  }
}

// Column c's sub-block blk (32 weights): its u8 weights and lane scales; reads the block's head (and writes
// its correction coefficients) when blk starts one.
template <class Q>
inline void sub_block(const uint8_t* col, int64_t blk, typename Q::Head& head, float* coef, __m256i& q, __m256& scale) {
  constexpr int SUBS = Q::SUPER / 32;
  const int64_t s = blk / SUBS;
  const int j = static_cast<int>(blk % SUBS);
  if (j == 0) head = Q::head(col + s * Q::BYTES, coef + s * (Q::SUPER / Q::GROUP));
  Q::sub(col + s * Q::BYTES, head, j, q, scale);
}

// The weights' cache lines a tile asks for ahead of the hardware prefetcher, which does not follow the
// short streams (one row_bytes each) of a tile's columns: `lines` lines from `next` every step.
struct Prefetch {
  const char* next;
  int64_t lines;
  inline void step() {
    if (next == nullptr) return;
    for (int64_t l = 0; l < lines; ++l) _mm_prefetch(next + 64 * l, _MM_HINT_T0);
    next += 64 * lines;
  }
};

#if defined(BATCHTOP_QUANT_VNNI)
constexpr int STEP_BLOCKS = 2;  // a zmm holds two sub-blocks: the weights, the activations, their lanes' scales

// Sub-blocks blk and blk + 1 (PAIR) or blk alone of R rows times the tile's columns into acc. Every loop
// here is unrolled so that acc stays in registers (GCC kept a rolled loop's array on the stack, every
// FMA then a load and a store).
template <class Q, int R, bool PAIR>
__attribute__((always_inline)) inline void pair_step(const Acts& a, int64_t r0, const uint8_t* const* col,
                                                     typename Q::Head* head, float* coef, int64_t coef_stride,
                                                     int64_t blk, __m512 (&acc)[R][TILE_COLS]) {
  constexpr int C = TILE_COLS;
  __m512i q[C];
  __m512 scale[C];
#pragma GCC unroll 8
  for (int c = 0; c < C; ++c) {
    float* coef_c = coef + c * coef_stride;
    if constexpr (Q::SUPER == 32 && PAIR) {  // both blocks at once
      Q::pair(col[c] + blk * Q::BYTES, q[c], scale[c], coef_c + blk);
    } else {
      __m256i q0, q1 = _mm256_setzero_si256();
      __m256 s0, s1 = _mm256_setzero_ps();
      sub_block<Q>(col[c], blk, head[c], coef_c, q0, s0);
      if constexpr (PAIR) sub_block<Q>(col[c], blk + 1, head[c], coef_c, q1, s1);
      q[c] = _mm512_inserti64x4(_mm512_castsi256_si512(q0), q1, 1);
      scale[c] = _mm512_insertf32x8(_mm512_castps256_ps512(s0), s1, 1);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const int8_t* xr = a.q + (r0 + r) * a.k + 32 * blk;
    const __m512i x = PAIR ? _mm512_loadu_si512(xr)  // an odd last sub-block pairs with zeros
                           : _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr)));
    const __m512 dx = _mm512_loadu_ps(a.dx_lanes + ((r0 + r) * a.pairs + blk / 2) * 16);
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[c], x);
      acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(scale[c], dx), acc[r][c]);
    }
  }
}

// R rows from r0 times the TILE_COLS columns whose blocks start at col[c]: y[r][c], fp32. Lanes 0-7 of a
// row's sums take the even sub-blocks, lanes 8-15 the odd ones, each in order.
template <class Q, int R>
void tile(const Acts& a, int64_t r0, const uint8_t* const* col, float* coef, int64_t coef_stride, Prefetch pf,
          float (*y)[TILE_COLS]) {
  constexpr int C = TILE_COLS;
  __m512 acc[R][C];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  typename Q::Head head[C];
  int64_t blk = 0;
  for (; blk + 1 < a.blocks; blk += 2) {
    pf.step();
    pair_step<Q, R, true>(a, r0, col, head, coef, coef_stride, blk, acc);
  }
  if (blk < a.blocks) pair_step<Q, R, false>(a, r0, col, head, coef, coef_stride, blk, acc);
  if constexpr (Q::OFFSET != 0.f) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const float* corr = a.corr + (r0 + r) * a.corr_stride;
      for (int64_t g = 0; g < a.corr_stride; g += 16)
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c)
          acc[r][c] = _mm512_fmadd_ps(_mm512_loadu_ps(coef + c * coef_stride + g), _mm512_loadu_ps(corr + g), acc[r][c]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) y[r][c] = _mm512_reduce_add_ps(acc[r][c]);
}
#else
constexpr int STEP_BLOCKS = 1;

// The AVX2 tile: one sub-block a step in 8 lanes, the rows' block scales broadcast.
template <class Q, int R>
void tile(const Acts& a, int64_t r0, const uint8_t* const* col, float* coef, int64_t coef_stride, Prefetch pf,
          float (*y)[TILE_COLS]) {
  constexpr int C = TILE_COLS;
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  typename Q::Head head[C];
  for (int64_t blk = 0; blk < a.blocks; ++blk) {
    pf.step();
    __m256i q[C];
    __m256 scale[C];
    for (int c = 0; c < C; ++c) sub_block<Q>(col[c], blk, head[c], coef + c * coef_stride, q[c], scale[c]);
    for (int r = 0; r < R; ++r) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + (r0 + r) * a.k + 32 * blk));
      const __m256 dx = _mm256_set1_ps(a.dx[(r0 + r) * a.blocks + blk]);
      for (int c = 0; c < C; ++c)
        acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(Q::dot(q[c], x)), _mm256_mul_ps(scale[c], dx), acc[r][c]);
    }
  }
  if constexpr (Q::OFFSET != 0.f) {
    for (int r = 0; r < R; ++r) {
      const float* corr = a.corr + (r0 + r) * a.corr_stride;
      for (int64_t g = 0; g < a.corr_stride; g += 8)
        for (int c = 0; c < C; ++c)
          acc[r][c] = _mm256_fmadd_ps(_mm256_loadu_ps(coef + c * coef_stride + g), _mm256_loadu_ps(corr + g), acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[r][c] = reduce_add8(acc[r][c]);
}
#endif

using Tile = void (*)(const Acts&, int64_t, const uint8_t* const*, float*, int64_t, Prefetch, float (*)[TILE_COLS]);
template <class Q, int... R>
constexpr std::array<Tile, TILE_ROWS + 1> tiles_by_rows(std::integer_sequence<int, R...>) {
  return {nullptr, tile<Q, R + 1>...};
}
template <class Q>  // TILES<Q>[r]: the tile of r rows
constexpr std::array<Tile, TILE_ROWS + 1> TILES = tiles_by_rows<Q>(std::make_integer_sequence<int, TILE_ROWS>{});

}  // namespace batchtop_cpu::quant
#endif
