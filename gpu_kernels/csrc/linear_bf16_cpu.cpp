// bf16 linear layers (y = x W^T + b) on AVX512_BF16, or on AVX2 and FMA (below), from a weight packed once
// so that every GEMM of a step, from a 1-row decode GEMV to a prompt chunk, streams it front to back.
//
// Packed layout: output columns in groups of 64 (four 16-lane blocks), and within a group the input
// features in pairs: packed[g][p][c][t] = W[64 g + c][2 p + t] (zero past N or K). One vdpbf16ps takes
// a 64-byte line (16 columns x one pair) and the pair (x[2p], x[2p+1]) broadcast, so a group is read as
// one sequential stream: the hardware prefetcher's best case, which oneDNN's GEMV (about 59% of the copy
// bandwidth here) does not reach.
//
// Up to 6 rows are one register tile over the whole of K. More rows go through K in chunks of CHUNK
// pairs: every row tile runs over a chunk (the first reads it from memory, the others find it in L1)
// before the next chunk, and the first two tiles prefetch the next chunk into L2 as they go, so that
// streaming the weights from DRAM overlaps the arithmetic instead of coming before it. Without that
// prefetch the GEMMs of a SmolLM2 step took about the DRAM time plus the compute time: 203 GFLOP/s at
// 16 rows on two cores, 241 with the second tile prefetching; at 8 rows (a tile of 6 and one of 2)
// 132 with the second tile alone, 162 with both (builds alternating in one process;
// bench/cpu_kernels.py sets the kernel against torch's F.linear). The tiles' fp32 sums wait in a
// per-thread buffer between chunks (stored and loaded exactly), so each output element is still
// accumulated in fp32 over p in order, one accumulator per element, whatever the number of rows and
// however they are tiled: a row's result is the same alone and in any batch, and the same as with one
// tile over the whole of K.
//
// The threads split the output columns at 16-column blocks (not 64-column groups), so that N = 576 (9
// groups) splits evenly; a thread's range may start or end inside a group.
//
// Epilogues (linear_bf16_cpu.h): store y; y = silu(gate) * up (kSiluMul) from a weight packed with
// gate and up interleaved by halves (below); or x += y in place (kAddInto, a residual add). Each rounds
// where the torch ops it replaces round.
#include "linear_bf16_cpu.h"

#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>
#include <vector>

#include "cpu_vec.h"
#include "ops_cpu.h"

#if defined(__AVX512BF16__) || (defined(__AVX2__) && defined(__FMA__))
#define BATCHTOP_LINEAR_BF16 1
#endif

namespace batchtop_cpu {
namespace {

constexpr int64_t GROUP = 64;   // output columns per packed group
constexpr int BLOCKS = 4;       // 16-lane blocks per group
constexpr int64_t LINE = 64 * BLOCKS;  // bytes of one pair across a group
// Pairs per K chunk when the rows take several tiles: 64 pairs are 16 KiB of a group's weights, which
// the later tiles re-read from L1 (32 KiB) beside their rows' features and sums.
constexpr int64_t CHUNK = 64;
// Lines prefetched this many pairs (4 KiB) ahead, every line of them, by the tiles after a chunk's
// first: they re-read it from L1/L2, where the prefetch still pays. The first tile streams the chunk
// from DRAM, where the hardware prefetcher does better alone.
constexpr int64_t PREFETCH = 16;

// Block b of group g in out: its first column (a weight packed by halves alternates them by block) and
// how many of its 16 columns there are (the last group's may run past N).
inline std::pair<int64_t, int64_t> block_columns(const LinearArgs& a, int64_t g, int64_t b) {
  const int64_t col = a.half ? (b & 1) * a.half + GROUP / 2 * g + 16 * (b >> 1) : GROUP * g + 16 * b;
  return {col, a.half ? 16 : std::min<int64_t>(16, a.n - col)};
}

#if defined(__AVX512BF16__)
constexpr int MAX_ROWS = 6;  // rows per tile: 6 x 4 accumulators + 4 weight lines fit the 32 registers
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int MAX_ROWS = 2;  // a tile's accumulators, its x pairs and a line's two halves fit 16 registers
#endif

#if defined(BATCHTOP_LINEAR_BF16)
// Where row r's sums of a group's nb blocks start in the accumulator buffer: a tile of MAX_ROWS rows
// takes MAX_ROWS * GROUP floats, a row within it nb * 16 (accumulate's acc[(r * NB + b) * 16 + lane]).
template <typename F>  // float, or const float for the epilogue
inline F* row_sums(F* acc, int64_t r, int nb) {
  return acc + (r / MAX_ROWS) * MAX_ROWS * GROUP + (r % MAX_ROWS) * nb * 16;
}
#endif

// f(g, lo, nb, lines) for each group g that blocks [begin, end) of the packed weight's 16-column blocks
// touch: its blocks [lo, lo + nb), their lines from `lines` (LINE bytes a pair).
template <typename F>
void each_group(const LinearArgs& a, int64_t begin, int64_t end, F&& f) {
  const char* weights = reinterpret_cast<const char*>(a.packed);
  for (int64_t blk = begin; blk < end;) {
    const int64_t g = blk / BLOCKS, lo = blk % BLOCKS, hi = std::min<int64_t>(BLOCKS, end - g * BLOCKS);
    f(g, lo, static_cast<int>(hi - lo), weights + g * a.pairs * LINE + lo * 64);
    blk = g * BLOCKS + hi;
  }
}

#if defined(__AVX512BF16__)
// R rows (x_stride apart) times NB blocks of the group's lines, over np pairs from `line`; the sums start
// at zero (fresh) or from acc, and end in acc: acc[(r * NB + b) * 16 + lane]. `next`, when given: lines
// to prefetch into L2, one pair's worth per pair walked.
template <int R, int NB>
void accumulate(const c10::BFloat16* x, int64_t x_stride, const char* line, int64_t np, float* acc_io, bool fresh,
                bool prefetch, const char* next) {
  __m512 acc[R][NB];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < NB; ++b)
      acc[r][b] = fresh ? _mm512_setzero_ps() : _mm512_loadu_ps(acc_io + (r * NB + b) * 16);
  for (int64_t p = 0; p < np; ++p, line += LINE) {
    if (prefetch)
      for (int b = 0; b < NB; ++b) _mm_prefetch(line + PREFETCH * LINE + 64 * b, _MM_HINT_T0);
    if (next != nullptr) {
      for (int b = 0; b < NB; ++b) _mm_prefetch(next + 64 * b, _MM_HINT_T1);
      next += LINE;
    }
    __m512bh wl[NB];
    for (int b = 0; b < NB; ++b) wl[b] = (__m512bh)_mm512_loadu_si512(line + 64 * b);
    for (int r = 0; r < R; ++r) {
      int32_t pair;  // (x[2p], x[2p+1]) as one 32-bit lane
      std::memcpy(&pair, x + r * x_stride + 2 * p, sizeof pair);
      const __m512bh xp = (__m512bh)_mm512_set1_epi32(pair);
      for (int b = 0; b < NB; ++b) acc[r][b] = _mm512_dpbf16_ps(acc[r][b], xp, wl[b]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < NB; ++b) _mm512_storeu_ps(acc_io + (r * NB + b) * 16, acc[r][b]);
}

inline void store_cols(c10::BFloat16* dst, __m512 y, int64_t cols) {
  if (cols >= 16) {
    store16(dst, y);
  } else {
    alignas(64) c10::BFloat16 tmp[16];
    store16(tmp, y);
    std::copy(tmp, tmp + cols, dst);
  }
}

inline __m512 silu16(__m512 x) {  // x / (1 + exp(-x)), as fused_ops' silu_and_mul
  return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.f), exp16(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}

// The rows' sums of group g's blocks [lo, lo + nb) (acc, as run_blocks lays them out) through the
// epilogue into out.
void finish_rows(const LinearArgs& a, const float* acc, int64_t g, int64_t lo, int nb) {
  const int64_t rows = a.rows;
  for (int64_t r = 0; r < rows; ++r) {
    const float* sums = row_sums(acc, r, nb);
    c10::BFloat16* y = a.out + r * a.out_stride;
    if (a.epilogue == Epilogue::kSiluMul) {  // blocks (2j, 2j+1) of group g: gate and up of 16 columns
      for (int bb = 0; bb + 1 < nb; bb += 2) {
        const int64_t col = GROUP / 2 * g + 16 * ((lo + bb) / 2), up_col = a.half + col;
        __m512 gate = _mm512_loadu_ps(sums + bb * 16), up = _mm512_loadu_ps(sums + (bb + 1) * 16);
        if (a.bias) gate = _mm512_add_ps(gate, load16(a.bias + col)), up = _mm512_add_ps(up, load16(a.bias + up_col));
        const __m512 act = round16<c10::BFloat16>(silu16(round16<c10::BFloat16>(gate)));
        store16(y + col, _mm512_mul_ps(act, round16<c10::BFloat16>(up)));
      }
      continue;
    }
    for (int bb = 0; bb < nb; ++bb) {
      const auto [col, cols] = block_columns(a, g, lo + bb);
      if (cols <= 0) break;
      __m512 v = _mm512_loadu_ps(sums + bb * 16);
      if (a.bias) {
        if (cols >= 16) {
          v = _mm512_add_ps(v, load16(a.bias + col));
        } else {
          alignas(64) c10::BFloat16 tmp[16] = {};
          std::copy(a.bias + col, a.bias + col + cols, tmp);
          v = _mm512_add_ps(v, load16(tmp));
        }
      }
      if (a.epilogue == Epilogue::kAddInto) {  // y = dtype(y + dtype(x W^T + b))
        alignas(64) c10::BFloat16 tmp[16] = {};
        std::copy(y + col, y + col + cols, tmp);
        v = _mm512_add_ps(load16(tmp), round16<c10::BFloat16>(v));
      }
      store_cols(y + col, v, cols);
    }
  }
}
#elif defined(__AVX2__) && defined(__FMA__)
// AVX2 and FMA without AVX-512 (Zen 2/3, Intel before Ice Lake): the same packed weights, summed in the
// same order in 8-lane fp32. A 32-bit lane of a line holds the pair (W[c][2p], W[c][2p+1]): shifted left
// by 16 it is the first as fp32, with its low half masked off the second. A bf16 x bf16 product is exact
// in fp32, so acc = fma(x[2p+1], w_odd, acc) then fma(x[2p], w_even, acc) rounds as vdpbf16ps does.
inline __m256 even_bf16(__m256i pairs) { return _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16)); }
inline __m256 odd_bf16(__m256i pairs) {
  return _mm256_castsi256_ps(_mm256_and_si256(pairs, _mm256_set1_epi32(static_cast<int32_t>(0xFFFF0000u))));
}

// R rows times V 8-column vectors of the lines from `line`, over np pairs; acc rows acc_stride floats
// apart. The first `lines` 64-byte lines of each pair are prefetched PREFETCH pairs ahead (prefetch), and
// as many of `next` into L2, one pair's worth per pair walked; lines [own, lines) of the pair walked,
// which a later sweep reads, are fetched into L1 with it (a second pass then finds them there, not in DRAM).
template <int R, int V>
void sweep(const c10::BFloat16* x, int64_t x_stride, const char* line, int64_t np, float* acc_io, int64_t acc_stride,
           bool fresh, int lines, bool prefetch, const char* next, int own) {
  __m256 acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = fresh ? _mm256_setzero_ps() : _mm256_loadu_ps(acc_io + r * acc_stride + 8 * v);
  for (int64_t p = 0; p < np; ++p, line += LINE) {
    if (prefetch)
      for (int l = 0; l < lines; ++l) _mm_prefetch(line + PREFETCH * LINE + 64 * l, _MM_HINT_T0);
    if (next != nullptr) {
      for (int l = 0; l < lines; ++l) _mm_prefetch(next + 64 * l, _MM_HINT_T1);
      next += LINE;
    }
    for (int l = own; l < lines; ++l) _mm_prefetch(line + 64 * l, _MM_HINT_T0);
    __m256 xe[R], xo[R];
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      std::memcpy(&pair, x + r * x_stride + 2 * p, sizeof pair);
      const __m256i xp = _mm256_set1_epi32(pair);
      xe[r] = even_bf16(xp), xo[r] = odd_bf16(xp);
    }
    for (int v = 0; v < V; ++v) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(line + 32 * v));
      const __m256 we = even_bf16(w), wo = odd_bf16(w);
      for (int r = 0; r < R; ++r) acc[r][v] = _mm256_fmadd_ps(xe[r], we, _mm256_fmadd_ps(xo[r], wo, acc[r][v]));
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) _mm256_storeu_ps(acc_io + r * acc_stride + 8 * v, acc[r][v]);
}

// accumulate's contract (above, for AVX-512) on 16 registers: one row takes the NB blocks in one sweep,
// two rows take them four vectors (two blocks) at a time, the second sweep re-reading the lines from L1/L2.
template <int R, int NB>
void accumulate(const c10::BFloat16* x, int64_t x_stride, const char* line, int64_t np, float* acc_io, bool fresh,
                bool prefetch, const char* next) {
  constexpr int V = 2 * NB, STEP = R == 1 ? V : 4;
  sweep<R, (V < STEP ? V : STEP)>(x, x_stride, line, np, acc_io, NB * 16, fresh, NB, prefetch, next, STEP / 2);
  if constexpr (V > STEP)
    sweep<R, V - STEP>(x, x_stride, line + 32 * STEP, np, acc_io + 8 * STEP, NB * 16, fresh, 0, false, nullptr, 0);
}

// The same columns as AVX-512's store_cols: a block's first `cols` of 8-lane halves lo and hi.
inline void store_cols8(c10::BFloat16* dst, __m256 lo, __m256 hi, int64_t cols) {
  alignas(32) c10::BFloat16 tmp[16];
  store8(tmp, lo);
  store8(tmp + 8, hi);
  std::copy(tmp, tmp + std::min<int64_t>(cols, 16), dst);
}

inline __m256 load_cols8(const c10::BFloat16* src, int64_t from, int64_t cols) {  // 8 lanes from `from`, 0 past cols
  if (from + 8 <= cols) return load8(src + from);
  alignas(32) c10::BFloat16 tmp[8] = {};
  if (from < cols) std::copy(src + from, src + cols, tmp);
  return load8(tmp);
}

inline __m256 silu8(__m256 x) {  // x / (1 + exp(-x)), as fused_ops' silu_and_mul
  return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}

// finish_rows (above, for AVX-512) on 8-lane halves of each block.
void finish_rows(const LinearArgs& a, const float* acc, int64_t g, int64_t lo, int nb) {
  using bf16 = c10::BFloat16;
  for (int64_t r = 0; r < a.rows; ++r) {
    const float* sums = row_sums(acc, r, nb);
    bf16* y = a.out + r * a.out_stride;
    if (a.epilogue == Epilogue::kSiluMul) {
      for (int bb = 0; bb + 1 < nb; bb += 2) {
        const int64_t col = GROUP / 2 * g + 16 * ((lo + bb) / 2), up_col = a.half + col;
        for (int h = 0; h < 16; h += 8) {
          __m256 gate = _mm256_loadu_ps(sums + bb * 16 + h), up = _mm256_loadu_ps(sums + (bb + 1) * 16 + h);
          if (a.bias)
            gate = _mm256_add_ps(gate, load8(a.bias + col + h)), up = _mm256_add_ps(up, load8(a.bias + up_col + h));
          const __m256 act = round8<bf16>(silu8(round8<bf16>(gate)));
          store8(y + col + h, _mm256_mul_ps(act, round8<bf16>(up)));
        }
      }
      continue;
    }
    for (int bb = 0; bb < nb; ++bb) {
      const auto [col, cols] = block_columns(a, g, lo + bb);
      if (cols <= 0) break;
      __m256 v[2];
      for (int h = 0; h < 2; ++h) {
        v[h] = _mm256_loadu_ps(sums + bb * 16 + 8 * h);
        if (a.bias) v[h] = _mm256_add_ps(v[h], load_cols8(a.bias + col, 8 * h, cols));
        if (a.epilogue == Epilogue::kAddInto)  // y = dtype(y + dtype(x W^T + b))
          v[h] = _mm256_add_ps(load_cols8(y + col, 8 * h, cols), round8<bf16>(v[h]));
      }
      store_cols8(y + col, v[0], v[1], cols);
    }
  }
}

// From PANEL_FROM rows on, the lines do not feed the FMAs directly: each chunk of PANEL_PAIRS pairs is
// unpacked once into an fp32 panel in L1 (the two features of a pair side by side, 16 KiB for a whole
// group) and the tiles of the rows run over the panel, PANEL_ROWS rows by one 16-column block at a
// time (8 accumulators, 4 weight vectors, 2 features: 14 registers). Unpacked per tile of 2 rows, a
// line costs as many shifts and masks as FMAs, on the same ports. On one Zen 3 core with the weight in
// cache: 60-65 GFLOP/s at 64 rows against the tiles of 2's 40-44, 42 against 37 at 16; below 16 rows
// the tiles of 2 win (at 4, 29 against 25). The sums are the same FMAs in the same order on the same
// exact fp32 values (a bf16 widened is exact), so a row's result is bitwise the one it gets alone.
constexpr int64_t PANEL_FROM = 16;
constexpr int PANEL_ROWS = 4;
constexpr int64_t PANEL_PAIRS = 32;

// panel[(2 p + 0) * width + c]: column c's second feature of pair p, [(2 p + 1) * width + c] its first,
// for the nb blocks from `line` (width = 16 nb).
void unpack_panel(const char* line, int64_t np, int nb, float* panel) {
  const int64_t width = 16 * nb;
  for (int64_t p = 0; p < np; ++p, line += LINE)
    for (int v = 0; v < 2 * nb; ++v) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(line + 32 * v));
      _mm256_store_ps(panel + 2 * p * width + 8 * v, odd_bf16(w));
      _mm256_store_ps(panel + (2 * p + 1) * width + 8 * v, even_bf16(w));
    }
}

// The rows' features as fp32, once per call: odd[r * pairs + p] = x[r][2p + 1], even[r * pairs + p] = x[r][2p].
void unpack_rows(const c10::BFloat16* x, int64_t x_stride, int64_t rows, int64_t pairs, float* odd, float* even) {
  for (int64_t r = 0; r < rows; ++r) {
    const c10::BFloat16* row = x + r * x_stride;
    int64_t p = 0;
    for (; p + 8 <= pairs; p += 8) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * p));
      _mm256_storeu_ps(odd + r * pairs + p, odd_bf16(w));
      _mm256_storeu_ps(even + r * pairs + p, even_bf16(w));
    }
    for (; p < pairs; ++p) odd[r * pairs + p] = to_float(row[2 * p + 1]), even[r * pairs + p] = to_float(row[2 * p]);
  }
}

// R rows (1-4) times one 16-column block of the panel (w: its first column, width floats a panel line);
// the rows' features from odd and even, rows x_stride apart. The sums are named variables, not an array:
// GCC kept an array's vectors on the stack and stored them at every pair.
template <int R>
void panel_block(const float* odd, const float* even, int64_t x_stride, int64_t np, const float* w, int64_t width,
                 float* const* sums, bool fresh) {
  __m256 lo0, hi0, lo1, hi1, lo2, hi2, lo3, hi3;  // row r's columns 0-7 and 8-15
  const auto start = [&](int r, __m256& lo, __m256& hi) {
    lo = fresh ? _mm256_setzero_ps() : _mm256_loadu_ps(sums[r]);
    hi = fresh ? _mm256_setzero_ps() : _mm256_loadu_ps(sums[r] + 8);
  };
  start(0, lo0, hi0);
  if constexpr (R > 1) start(1, lo1, hi1);
  if constexpr (R > 2) start(2, lo2, hi2);
  if constexpr (R > 3) start(3, lo3, hi3);
  for (int64_t p = 0; p < np; ++p, w += 2 * width) {
    __m256 wo0 = _mm256_load_ps(w), wo1 = _mm256_load_ps(w + 8);
    __m256 we0 = _mm256_load_ps(w + width), we1 = _mm256_load_ps(w + width + 8);
    // Held in registers: folded into each row's FMAs as memory operands (GCC's choice), the loads
    // outnumber the FMAs and the load ports, not the FMA ones, set the pace.
    asm("" : "+x"(wo0), "+x"(wo1), "+x"(we0), "+x"(we1));
    const auto row = [&](int r, __m256& lo, __m256& hi) {
      const __m256 xo = _mm256_broadcast_ss(odd + r * x_stride + p), xe = _mm256_broadcast_ss(even + r * x_stride + p);
      lo = _mm256_fmadd_ps(xe, we0, _mm256_fmadd_ps(xo, wo0, lo));
      hi = _mm256_fmadd_ps(xe, we1, _mm256_fmadd_ps(xo, wo1, hi));
    };
    row(0, lo0, hi0);
    if constexpr (R > 1) row(1, lo1, hi1);
    if constexpr (R > 2) row(2, lo2, hi2);
    if constexpr (R > 3) row(3, lo3, hi3);
  }
  const auto finish = [&](int r, __m256 lo, __m256 hi) {
    _mm256_storeu_ps(sums[r], lo);
    _mm256_storeu_ps(sums[r] + 8, hi);
  };
  finish(0, lo0, hi0);
  if constexpr (R > 1) finish(1, lo1, hi1);
  if constexpr (R > 2) finish(2, lo2, hi2);
  if constexpr (R > 3) finish(3, lo3, hi3);
}

using PanelBlock = void (*)(const float*, const float*, int64_t, int64_t, const float*, int64_t, float* const*, bool);
constexpr PanelBlock PANEL_BLOCKS[PANEL_ROWS + 1] = {nullptr, panel_block<1>, panel_block<2>, panel_block<3>,
                                                     panel_block<4>};

// run_blocks (below) for PANEL_FROM rows or more. While the tiles compute on a panel, they prefetch
// the next chunk's lines into L2 (an even share each), so that DRAM streams under the arithmetic.
void run_panels(const LinearArgs& a, int64_t begin, int64_t end) {
  const int64_t pairs = a.pairs, rows = a.rows, tiles = (rows + PANEL_ROWS - 1) / PANEL_ROWS;
  // kept between calls: a prompt chunk's features run to megabytes, which malloc would map and unmap
  thread_local std::vector<float> acc, features;
  acc.resize(((rows + MAX_ROWS - 1) / MAX_ROWS) * MAX_ROWS * GROUP);
  features.resize(2 * rows * pairs);
  float* odd = features.data();
  float* even = odd + rows * pairs;
  unpack_rows(a.x, a.x_stride, rows, pairs, odd, even);
  alignas(32) float panel[PANEL_PAIRS * 2 * GROUP];
  const char* weights = reinterpret_cast<const char*>(a.packed);
  each_group(a, begin, end, [&](int64_t g, int64_t lo, int nb, const char* wg) {
    for (int64_t p0 = 0; p0 < pairs; p0 += PANEL_PAIRS) {
      const int64_t np = std::min(PANEL_PAIRS, pairs - p0);
      unpack_panel(wg + p0 * LINE, np, nb, panel);
      // the next chunk: this group's, else the next group's first, with every block of it this thread owns
      const char* next = nullptr;
      int64_t next_pairs = 0;
      int next_lines = 0;
      if (p0 + PANEL_PAIRS < pairs) {
        next = wg + (p0 + PANEL_PAIRS) * LINE, next_lines = nb;
        next_pairs = std::min(PANEL_PAIRS, pairs - p0 - PANEL_PAIRS);
      } else if ((g + 1) * BLOCKS < end) {
        next = weights + (g + 1) * pairs * LINE, next_pairs = std::min(PANEL_PAIRS, pairs);
        next_lines = static_cast<int>(std::min<int64_t>(BLOCKS, end - (g + 1) * BLOCKS));
      }
      for (int64_t t = 0; t < tiles; ++t) {
        const int take = static_cast<int>(std::min<int64_t>(PANEL_ROWS, rows - t * PANEL_ROWS));
        for (int64_t p = t * next_pairs / tiles; p < (t + 1) * next_pairs / tiles; ++p)
          for (int l = 0; l < next_lines; ++l) _mm_prefetch(next + p * LINE + 64 * l, _MM_HINT_T1);
        const int64_t first = t * PANEL_ROWS * pairs + p0;
        for (int b = 0; b < nb; ++b) {
          float* sums[PANEL_ROWS];
          for (int r = 0; r < take; ++r) sums[r] = row_sums(acc.data(), t * PANEL_ROWS + r, nb) + 16 * b;
          PANEL_BLOCKS[take](odd + first, even + first, pairs, np, panel + 16 * b, 16 * nb, sums, p0 == 0);
        }
      }
    }
    finish_rows(a, acc.data(), g, lo, nb);
  });
}
#endif

#if defined(BATCHTOP_LINEAR_BF16)
using Accumulate = void (*)(const c10::BFloat16*, int64_t, const char*, int64_t, float*, bool, bool, const char*);
template <int NB, int... R>
constexpr std::array<Accumulate, MAX_ROWS + 1> by_rows(std::integer_sequence<int, R...>) {
  return {nullptr, accumulate<R + 1, NB>...};
}
template <int NB>
constexpr std::array<Accumulate, MAX_ROWS + 1> BY_ROWS = by_rows<NB>(std::make_integer_sequence<int, MAX_ROWS>{});
constexpr const Accumulate* KERNELS[BLOCKS + 1] = {nullptr, BY_ROWS<1>.data(), BY_ROWS<2>.data(), BY_ROWS<3>.data(),
                                                   BY_ROWS<4>.data()};

// One thread's share: blocks [begin, end) of the packed weight's 16-column blocks.
void run_blocks(const LinearArgs& a, int64_t begin, int64_t end) {
#if !defined(__AVX512BF16__)
  if (a.rows >= PANEL_FROM) return run_panels(a, begin, end);
#endif
  const int64_t pairs = a.pairs, rows = a.rows;
  const int64_t chunk = rows <= MAX_ROWS ? pairs : CHUNK;
  const int64_t tiles = (rows + MAX_ROWS - 1) / MAX_ROWS;
  std::vector<float> acc(tiles * MAX_ROWS * GROUP);
  const char* weights = reinterpret_cast<const char*>(a.packed);
  each_group(a, begin, end, [&](int64_t g, int64_t lo, int nb, const char* wg) {
    for (int64_t p0 = 0; p0 < pairs; p0 += chunk) {
      const int64_t np = std::min(chunk, pairs - p0);
      // What the first tile reads next: this group's next chunk, else the next group's first.
      const char* next = p0 + chunk < pairs ? wg + (p0 + chunk) * LINE
                         : (g + 1) * BLOCKS < end ? weights + (g + 1) * pairs * LINE : nullptr;
      for (int64_t t = 0; t < tiles; ++t) {
        const int64_t take = std::min<int64_t>(MAX_ROWS, rows - t * MAX_ROWS);
        KERNELS[nb][take](a.x + t * MAX_ROWS * a.x_stride + 2 * p0, a.x_stride, wg + p0 * LINE, np,
                          acc.data() + t * MAX_ROWS * GROUP, p0 == 0, t > 0, tiles > 1 && t <= 1 ? next : nullptr);
      }
    }
    finish_rows(a, acc.data(), g, lo, nb);
  });
}
#endif

}  // namespace

bool linear_bf16_supported() {
#if defined(BATCHTOP_LINEAR_BF16)
  return true;
#else
  return false;
#endif
}

void linear_bf16_run(const LinearArgs& a) {
  TORCH_CHECK(linear_bf16_supported(), "linear_bf16: built without AVX512_BF16 or AVX2 and FMA");
  if (a.rows == 0) return;
#if defined(BATCHTOP_LINEAR_BF16)
  // a kSiluMul output column needs its gate and up blocks on one thread: split at block pairs then
  const int64_t unit = a.half ? 2 : 1, units = a.groups * BLOCKS / unit;
  at::parallel_for(0, units, 1, [&](int64_t begin, int64_t end) {
    run_blocks(a, begin * unit, std::min(a.groups * BLOCKS, end * unit));
  });
#endif
}

at::Tensor pack_linear_bf16(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kBFloat16,
              "pack_linear_bf16: weight must be a 2-D bfloat16 tensor, got ", weight.sizes(), " ", weight.scalar_type());
  const int64_t n = weight.size(0), k = weight.size(1);
  const int64_t groups = (n + GROUP - 1) / GROUP, pairs = (k + 1) / 2;
  at::Tensor packed = at::detail::empty_cpu({groups, pairs, GROUP, 2}, weight.options());
  packed.zero_();
  const at::Tensor w = weight.contiguous();
  const auto* src = w.data_ptr<c10::BFloat16>();
  auto* dst = packed.data_ptr<c10::BFloat16>();
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const int64_t cols = std::min(GROUP, n - g * GROUP);
      for (int64_t p = 0; p < pairs; ++p) {  // written in order; the group's rows are read 2 features at a time
        c10::BFloat16* line = dst + (g * pairs + p) * GROUP * 2;
        for (int64_t c = 0; c < cols; ++c) {
          const c10::BFloat16* row = src + (g * GROUP + c) * k + 2 * p;
          line[2 * c] = row[0];
          if (2 * p + 1 < k) line[2 * c + 1] = row[1];
        }
      }
    }
  });
  return packed;
}

// out (rows, N) = x (rows, K) W^T + bias, or with epilogue 1 out (rows, half) = silu(gate) * up, or with
// epilogue 2 out += x W^T + bias. half > 0: the weight was packed with its two halves (rows [0, half) and
// [half, 2 half)) interleaved by 16 rows, 32 of each to a group (cpu_kernels.interleave_halves); bias
// and out stay in the plain order.
void linear_bf16(at::Tensor& out, const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                 int64_t half, int64_t epilogue) {
  TORCH_CHECK(linear_bf16_supported(), "linear_bf16: built without AVX512_BF16 or AVX2 and FMA");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.stride(1) == 1,
              "linear_bf16: x must be 2-D bfloat16 with unit column stride, got ", x.sizes(), " ", x.scalar_type());
  TORCH_CHECK(packed.dim() == 4 && packed.size(2) == GROUP && packed.size(3) == 2 && packed.is_contiguous() &&
                  packed.scalar_type() == at::kBFloat16, "linear_bf16: packed must come from pack_linear_bf16");
  TORCH_CHECK(epilogue >= 0 && epilogue <= 2, "linear_bf16: epilogue must be 0 (store), 1 (silu_mul) or 2 (add_into)");
  const auto ep = static_cast<Epilogue>(epilogue);
  const int64_t rows = x.size(0), groups = packed.size(0), pairs = packed.size(1);
  const int64_t n = groups * GROUP;  // the weight's output features (exact when half > 0)
  TORCH_CHECK(x.size(1) == 2 * pairs, "linear_bf16: x has ", x.size(1), " features, the weight ", 2 * pairs,
              " (an odd K is padded by the caller)");
  TORCH_CHECK(half == 0 || (half > 0 && 2 * half == n && half % (GROUP / 2) == 0),
              "linear_bf16: half must be 0 or half of the weight's rows, a multiple of 32");
  TORCH_CHECK(ep != Epilogue::kSiluMul || half > 0, "linear_bf16: silu_mul needs a weight packed by halves");
  const int64_t out_cols = ep == Epilogue::kSiluMul ? half : out.size(1);
  TORCH_CHECK(out.dim() == 2 && out.size(0) == rows && out.stride(1) == 1 && out.scalar_type() == at::kBFloat16 &&
                  (ep == Epilogue::kSiluMul ? out.size(1) == half
                                            : out_cols <= n && out_cols > n - GROUP && (half == 0 || out_cols == n)),
              "linear_bf16: out must be (rows, N) bfloat16 with the weight's N (N / 2 for silu_mul)");
  const c10::BFloat16* b = nullptr;
  if (bias && bias->defined()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == (ep == Epilogue::kSiluMul ? n : out_cols) &&
                    bias->is_contiguous() && bias->scalar_type() == at::kBFloat16,
                "linear_bf16: bias must be contiguous (N,) bfloat16");
    b = bias->data_ptr<c10::BFloat16>();
  }
  linear_bf16_run(LinearArgs{x.data_ptr<c10::BFloat16>(), x.stride(0), rows, packed.data_ptr<c10::BFloat16>(), groups,
                             pairs, ep == Epilogue::kSiluMul ? n : out_cols, half, b, out.data_ptr<c10::BFloat16>(),
                             out.stride(0), ep});
}

}  // namespace batchtop_cpu
