// Q4_0, Q4_1 and Q8_0 repacked 16 columns wide (pack_linear_quant) and the register tile that reads them.
//
// The file's layout keeps one column's 32 weights together, so a VNNI dot leaves each column's block spread
// over lanes that must be scaled and summed apart. The pack instead interleaves 16 columns: for a group of
// 16 output columns and one 32-weight block, step s (weights 4s..4s+3) of all 16 columns is one 64-byte
// operand, column c's 4 weights in lane c, so that  vpdpbusd(acc, w_s, broadcast(x[4s..4s+3]))  over s = 0..7
// leaves every column's whole-block integer dot in its own int32 lane. A block record:
//   Q4_0: fp16 d[16] (32 B), 256 B of nibbles     w = d (q - 8)
//   Q4_1: fp16 d[16], fp16 m[16], 256 B of nibbles w = d q + m
//   Q8_0: fp16 d[16], 512 B of q + 128 as u8     w = d q
// Nibbles: byte 64 j + 4 c + p holds step j (low nibble) and step j + 4 (high) of column c, p of its 4
// weights: exactly byte 4 j + p of the column's block in the file, so one load gives two steps.
// The offsets -8 / -128 start the int32 dot at OFFSET * sum(xq) (exact). Per block, every (row, column)
// then takes  acc = fma(float(idot), d * dx, acc)  and for Q4_1  acc = fma(m, dx * sum(xq), acc) , the same
// operations in the same order whatever tile or thread it falls in: batch invariant, bitwise; and a lane
// is one column's result, with no reduction at the end.
//
// A pack is uint8 (1 + groups, group_bytes): row 0 a header (RepackHeader), then each group's records in
// block order, so a thread streams its groups front to back. Columns past N in the last group are zeros.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "quant_blocks.h"

namespace batchtop_cpu {

struct RepackHeader {
  char magic[8];  // "btq16\0\0\0"
  int64_t qtype, n, k;
};

// Whether linear_quant reads qtype from a pack here (Q4_0, Q4_1, Q8_0 on an AVX-512 VNNI CPU).
bool quant_repacked(int64_t qtype);
// Bytes of one group's record for one 32-weight block; 0 for the types not repacked.
int64_t repack_record_bytes(int64_t qtype);
// The repacked matrix of blocks (N, row_bytes) of qtype, or blocks itself where qtype is not repacked.
at::Tensor pack_linear_quant(const at::Tensor& blocks, int64_t qtype);
// pack's first group after checking it is pack_linear_quant's pack of qtype over k features (`who` names
// the caller in the message); its n into *n.
const uint8_t* repacked_groups(const at::Tensor& pack, int64_t qtype, int64_t k, int64_t* n, const char* who);

}  // namespace batchtop_cpu

#if defined(BATCHTOP_QUANT_VNNI)
namespace batchtop_cpu::quant {

constexpr int GROUP_COLS = 16;
constexpr int REPACK_ROWS = 6;  // a tile's rows: 8 weight zmm + 6 accumulators + scales and temporaries

// One call's activations for the repacked tile: row r's int8 features at q + r * k; per block its scale dx,
// its int offset term (OFFSET * sum(xq), Q4_0 / Q8_0) and dx * sum(xq) (Q4_1), at r * blocks + b.
struct RepackActs {
  const int8_t* q;
  const float* dx;
  const int32_t* ioff;
  const float* xsum;
  int64_t k, blocks;
};

template <int64_t QT>
struct RepackFormat {
  static constexpr bool NIBBLES = QT != 8, MIN = QT == 3, IOFF = QT != 3;
  static constexpr int64_t HEAD = MIN ? 64 : 32, BYTES = HEAD + (NIBBLES ? 256 : 512);
};

// R rows from r0 times one group of 16 columns (its records from g): y[r], the 16 columns' fp32 sums.
template <int64_t QT, int R>
__attribute__((always_inline)) inline void repacked_tile(const RepackActs& a, int64_t r0, const uint8_t* g,
                                                         __m512 (&y)[REPACK_ROWS]) {
  using F = RepackFormat<QT>;
  __m512 acc[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int64_t b = 0; b < a.blocks; ++b) {
    const uint8_t* rec = g + b * F::BYTES;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec)));
    __m512 m = _mm512_setzero_ps();
    if constexpr (F::MIN) m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 32)));
    __m512i w[8];
#pragma GCC unroll 8
    for (int j = 0; j < (F::NIBBLES ? 4 : 8); ++j) {
      const __m512i v = _mm512_loadu_si512(rec + F::HEAD + 64 * j);
      if constexpr (F::NIBBLES) {
        w[j] = _mm512_and_si512(v, low);
        w[j + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      } else {
        w[j] = v;
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const int64_t rb = (r0 + r) * a.blocks + b;
      const int32_t* x = reinterpret_cast<const int32_t*>(a.q + (r0 + r) * a.k + 32 * b);
      // two chains of 4 dots: integers, so the split does not change the sum
      __m512i d0 = F::IOFF ? _mm512_set1_epi32(a.ioff[rb]) : _mm512_setzero_si512(), d1 = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int s = 0; s < 8; s += 2) {
        d0 = _mm512_dpbusd_epi32(d0, w[s], _mm512_set1_epi32(x[s]));
        d1 = _mm512_dpbusd_epi32(d1, w[s + 1], _mm512_set1_epi32(x[s + 1]));
      }
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(d0, d1)), _mm512_mul_ps(d, _mm512_set1_ps(a.dx[rb])),
                               acc[r]);
      if constexpr (F::MIN) acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(a.xsum[rb]), acc[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) y[r] = acc[r];
}

using RepackTile = void (*)(const RepackActs&, int64_t, const uint8_t*, __m512 (&)[REPACK_ROWS]);
template <int64_t QT, int R>
void repacked_tile_fn(const RepackActs& a, int64_t r0, const uint8_t* g, __m512 (&y)[REPACK_ROWS]) {
  repacked_tile<QT, R>(a, r0, g, y);
}
template <int64_t QT>  // REPACK_TILES<QT>[r]: the tile of r rows
constexpr RepackTile REPACK_TILES[REPACK_ROWS + 1] = {nullptr,
                                                      repacked_tile_fn<QT, 1>, repacked_tile_fn<QT, 2>,
                                                      repacked_tile_fn<QT, 3>, repacked_tile_fn<QT, 4>,
                                                      repacked_tile_fn<QT, 5>, repacked_tile_fn<QT, 6>};

}  // namespace batchtop_cpu::quant
#endif
