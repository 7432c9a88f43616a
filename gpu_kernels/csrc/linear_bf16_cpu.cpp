// bf16 linear layers (y = x W^T + b) on AVX512_BF16, from a weight packed once so that every GEMM of a
// step, from a 1-row decode GEMV to a prompt chunk, streams it front to back.
//
// Packed layout: output columns in groups of 64 (four 16-lane blocks), and within a group the input
// features in pairs: packed[g][p][c][t] = W[64 g + c][2 p + t] (zero past N or K). One vdpbf16ps takes
// a 64-byte line (16 columns x one pair) and the pair (x[2p], x[2p+1]) broadcast, so a group is read as
// one sequential stream: the hardware prefetcher's best case, which oneDNN's GEMV (about 59% of the copy
// bandwidth here) does not reach.
//
// Each output element is accumulated in fp32 over p in order, one accumulator per element, whatever the
// number of rows and however they are tiled: a row's result is the same alone and in any batch.
#include "cpu_vec.h"

#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>

namespace batchtop_cpu {
namespace {

constexpr int64_t GROUP = 64;   // output columns per packed group
constexpr int BLOCKS = 4;       // 16-lane blocks per group
constexpr int MAX_ROWS = 6;     // rows per tile: 6 x 4 accumulators + 4 weight lines fit the 32 registers
// Lines prefetched this many pairs (4 KiB) ahead, every line of them, by the tiles after a group's first:
// prefetching only some of the lines made a 1-row GEMV slower than none (20 vs 23-26 GB/s), all of them
// 27-28 GB/s. But the first tile streams the group from DRAM, where the hardware prefetcher does better
// alone: over a step's GEMMs in turn, the first tile without it made decode steps 1-9% faster at 1-16
// rows (the same at 32-64), and the 4-6-row tiles no slower than the 3-row one. The later tiles re-read
// the group from L2, where the prefetch still pays.
constexpr int64_t PREFETCH = 16;

#if defined(__AVX512BF16__)
// R rows (x_stride apart, out_stride apart in out) times one group of `cols` columns.
template <int R>
void tile(const c10::BFloat16* x, int64_t x_stride, const c10::BFloat16* w, int64_t pairs,
          const c10::BFloat16* bias, c10::BFloat16* out, int64_t out_stride, int64_t cols, bool prefetch) {
  __m512 acc[R][BLOCKS];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < BLOCKS; ++b) acc[r][b] = _mm512_setzero_ps();
  const char* line = reinterpret_cast<const char*>(w);
  for (int64_t p = 0; p < pairs; ++p, line += 64 * BLOCKS) {
    if (prefetch)
      for (int b = 0; b < BLOCKS; ++b) _mm_prefetch(line + PREFETCH * 64 * BLOCKS + 64 * b, _MM_HINT_T0);
    __m512bh wl[BLOCKS];
    for (int b = 0; b < BLOCKS; ++b) wl[b] = (__m512bh)_mm512_loadu_si512(line + 64 * b);
    for (int r = 0; r < R; ++r) {
      int32_t pair;  // (x[2p], x[2p+1]) as one 32-bit lane
      std::memcpy(&pair, x + r * x_stride + 2 * p, sizeof pair);
      const __m512bh xp = (__m512bh)_mm512_set1_epi32(pair);
      for (int b = 0; b < BLOCKS; ++b) acc[r][b] = _mm512_dpbf16_ps(acc[r][b], xp, wl[b]);
    }
  }
  for (int b = 0; b < BLOCKS; ++b) {
    const int64_t c0 = 16 * b;
    if (c0 >= cols) break;
    const __m512 add = bias ? load16(bias + c0) : _mm512_setzero_ps();
    for (int r = 0; r < R; ++r) {
      const __m512 y = _mm512_add_ps(acc[r][b], add);
      if (c0 + 16 <= cols) {
        store16(out + r * out_stride + c0, y);
      } else {
        alignas(64) c10::BFloat16 tmp[16];
        store16(tmp, y);
        std::copy(tmp, tmp + (cols - c0), out + r * out_stride + c0);
      }
    }
  }
}

using RowsTile = void (*)(const c10::BFloat16*, int64_t, const c10::BFloat16*, int64_t, const c10::BFloat16*,
                          c10::BFloat16*, int64_t, int64_t, bool);
constexpr RowsTile TILES[MAX_ROWS + 1] = {nullptr, tile<1>, tile<2>, tile<3>, tile<4>, tile<5>, tile<6>};
#endif

at::Tensor pack_linear_bf16(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kBFloat16,
              "pack_linear_bf16: weight must be a 2-D bfloat16 tensor, got ", weight.sizes(), " ", weight.scalar_type());
  const int64_t n = weight.size(0), k = weight.size(1);
  const int64_t groups = (n + GROUP - 1) / GROUP, pairs = (k + 1) / 2;
  at::Tensor packed = at::zeros({groups, pairs, GROUP, 2}, weight.options());
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

bool linear_bf16_supported() {
#if defined(__AVX512BF16__)
  return true;
#else
  return false;
#endif
}

void linear_bf16(at::Tensor& out, const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(linear_bf16_supported(), "linear_bf16: built without AVX512_BF16");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.stride(1) == 1,
              "linear_bf16: x must be 2-D bfloat16 with unit column stride, got ", x.sizes(), " ", x.scalar_type());
  TORCH_CHECK(packed.dim() == 4 && packed.size(2) == GROUP && packed.size(3) == 2 && packed.is_contiguous() &&
                  packed.scalar_type() == at::kBFloat16, "linear_bf16: packed must come from pack_linear_bf16");
  const int64_t rows = x.size(0), pairs = packed.size(1), n = out.size(1);
  TORCH_CHECK(x.size(1) == 2 * pairs, "linear_bf16: x has ", x.size(1), " features, the weight ", 2 * pairs,
              " (an odd K is padded by the caller)");
  TORCH_CHECK(out.dim() == 2 && out.size(0) == rows && out.stride(1) == 1 && out.scalar_type() == at::kBFloat16 &&
                  n <= packed.size(0) * GROUP && n > (packed.size(0) - 1) * GROUP,
              "linear_bf16: out must be (rows, N) bfloat16 with the weight's N");
  const c10::BFloat16* b = nullptr;
  if (bias && bias->defined()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == n && bias->is_contiguous() &&
                    bias->scalar_type() == at::kBFloat16, "linear_bf16: bias must be contiguous (N,) bfloat16");
    b = bias->data_ptr<c10::BFloat16>();
  }
  if (rows == 0) return;
#if defined(__AVX512BF16__)
  const auto* xp = x.data_ptr<c10::BFloat16>();
  const auto* wp = packed.data_ptr<c10::BFloat16>();
  auto* yp = out.data_ptr<c10::BFloat16>();
  const int64_t groups = packed.size(0), xs = x.stride(0), ys = out.stride(0);
  // split the columns, never the rows, across threads: each weight group is streamed once
  at::parallel_for(0, groups, 4, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const int64_t cols = std::min(GROUP, n - g * GROUP);
      const c10::BFloat16* wg = wp + g * pairs * GROUP * 2;
      const c10::BFloat16* bg = b ? b + g * GROUP : nullptr;
      for (int64_t r = 0; r < rows; r += MAX_ROWS) {
        const int64_t take = std::min<int64_t>(MAX_ROWS, rows - r);
        TILES[take](xp + r * xs, xs, wg, pairs, bg, yp + r * ys + g * GROUP, ys, cols, r > 0);
      }
    }
  });
#endif
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(batchtop_cpu, m) {
  m.def("pack_linear_bf16(Tensor weight) -> Tensor");
  m.def("linear_bf16(Tensor(a!) out, Tensor x, Tensor packed, Tensor? bias) -> ()");
  m.def("linear_bf16_supported() -> bool", &linear_bf16_supported);
  m.impl("pack_linear_bf16", c10::DispatchKey::CPU, TORCH_FN(pack_linear_bf16));
  m.impl("linear_bf16", c10::DispatchKey::CPU, TORCH_FN(linear_bf16));
}

}  // namespace batchtop_cpu
