// y = x W^T + b with W a GGUF-quantized matrix in the file's own layout (quant_blocks.h), x and y bf16 or
// float32 (the same int8 activations and integer dots either way; only x's reading and y's rounding differ). A decode
// step streams the blocks (4.5-8.5 bits a weight) instead of a bf16 copy (16): on SmolLM2's Q4_1 file,
// ~96 MB a step instead of ~270.
//
// The activations are quantized first, each row alone: per 32 features an int8 block xq, its scale
// dx = max|x| / 127 and, for the types with an offset, the block's sum (quantize_row, quant_tiles.h). Then
// every output element is  sum over sub-blocks of dx * scale * vpdpbusd(q, xq)  in fp32 lanes (on AVX-512
// two sub-blocks a zmm, even ones in lanes 0-7, odd ones in 8-15), each lane in block order, plus the offset
// correction (coef . corr), then the lanes summed in one fixed tree. A row's result depends only on its
// own features and the weight, whatever rows share the call and however the columns are split between
// threads: batch invariant, bitwise.
//
// Tiling (quant_tiles.h): TILE_COLS columns by up to TILE_ROWS rows (4 x 4 on AVX-512). A column's
// sub-block is decoded from the file's bytes once per tile and held in registers while every row of the
// tile takes its dot with it: a 1-row decode reads each weight once, and a prompt chunk decodes each
// column's blocks once per 4 rows, finding them in L1 after the first row tile. A column is one row of
// the file's matrix, a short stream the hardware prefetcher does not follow: each tile prefetches the
// tile PREFETCH_TILES ahead (that took the 30 MB Q8_0 lm_head at one row from 2 to 20-27 GB/s).

#include "linear_quant_cpu.h"

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu_vec.h"
#include "fused_rows.h"
#include "ops_cpu.h"
#include "quant_blocks.h"
#include "quant_repack.h"
#include "quant_tiles.h"

namespace batchtop_cpu {

#if defined(BATCHTOP_QUANT)
namespace {

using bf16 = c10::BFloat16;
using namespace quant;

// Where a GEMM output element goes: out (kStore, kAddInto) or the gate_up rows (in T) kSiluMul finishes.
template <typename T>
struct Sink {
  const QuantLinearArgsOf<T>& a;
  T* gate_up;  // (rows, n), kSiluMul only
  void operator()(int64_t r, int64_t n, float y) const {
    if (a.bias) y += to_float(a.bias[n]);
    if (a.epilogue == Epilogue::kSiluMul) {
      store(gate_up + r * a.n + n, y);
    } else if (a.epilogue == Epilogue::kAddInto) {  // out = dtype(out + dtype(x W^T + b)), as the torch ops
      T* o = a.out + r * a.out_stride + n;
      store(o, to_float(*o) + round_to<T>(y));
    } else {
      store(a.out + r * a.out_stride + n, y);
    }
  }
#if defined(__AVX512F__)
  void group(int64_t r, int64_t n0, __m512 y) const {  // columns [n0, n0 + 16) at once: the same bits
    if (a.bias) y = _mm512_add_ps(y, load16(a.bias + n0));
    if (a.epilogue == Epilogue::kSiluMul) {
      store16(gate_up + r * a.n + n0, y);
    } else if (a.epilogue == Epilogue::kAddInto) {
      T* o = a.out + r * a.out_stride + n0;
      store16(o, _mm512_add_ps(load16(o), round16<T>(y)));
    } else {
      store16(a.out + r * a.out_stride + n0, y);
    }
  }
#endif
};

template <class Q, typename T>
void run_columns(const QuantLinearArgsOf<T>& a, const Acts& acts, const Sink<T>& sink) {
  const int64_t row_bytes = a.k / Q::SUPER * Q::BYTES, tiles = (a.n + TILE_COLS - 1) / TILE_COLS;
  const int64_t coef_stride = acts.corr_stride;
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> coef(TILE_COLS * coef_stride, 0.f);  // the padding past the groups stays 0
    float y[TILE_ROWS][TILE_COLS];
    for (int64_t t = begin; t < end; ++t) {
      const int64_t n0 = t * TILE_COLS, cols = std::min<int64_t>(TILE_COLS, a.n - n0);
      const uint8_t* col[TILE_COLS];  // a last, partial tile repeats its last column and drops the copies
      for (int c = 0; c < TILE_COLS; ++c) col[c] = a.blocks + std::min(n0 + c, a.n - 1) * row_bytes;
      // the tile PREFETCH_TILES ahead, spread over this one's steps, by its first row tile
      const int64_t ahead = n0 + PREFETCH_TILES * TILE_COLS;
      const int64_t ahead_lines = ahead < a.n ? (std::min<int64_t>(TILE_COLS, a.n - ahead) * row_bytes + 63) / 64 : 0;
      const int64_t steps = (acts.blocks + STEP_BLOCKS - 1) / STEP_BLOCKS;
      for (int64_t r0 = 0; r0 < a.rows; r0 += TILE_ROWS) {
        const int rows = static_cast<int>(std::min<int64_t>(TILE_ROWS, a.rows - r0));
        const Prefetch pf{r0 == 0 && ahead_lines ? reinterpret_cast<const char*>(a.blocks + ahead * row_bytes) : nullptr,
                          (ahead_lines + steps - 1) / steps};
        TILES<Q>[rows](acts, r0, col, coef.data(), coef_stride, pf, y);
        for (int r = 0; r < rows; ++r)
          for (int c = 0; c < cols; ++c) sink(r0 + r, n0 + c, y[r][c]);
      }
    }
  });
}

// kSiluMul's second half: out = silu(gate) * up from the gate_up rows the GEMM stored
template <typename T>
void finish_silu_mul(const QuantLinearArgsOf<T>& a, const T* gate_up) {
  if (a.epilogue != Epilogue::kSiluMul) return;
  const int64_t half = a.n / 2;
  at::parallel_for(0, a.rows, std::max<int64_t>(1, 4096 / half), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      silu_mul_row(a.out + r * a.out_stride, gate_up + r * a.n, gate_up + r * a.n + half, half);
  });
}

template <class Q, typename T>
void run_type(const QuantLinearArgsOf<T>& a) {
  const int64_t blocks = a.k / 32, corr_stride = pad16(a.k / Q::GROUP), pairs = (blocks + 1) / 2;
  // kept between calls: a prompt chunk's activations run to megabytes, which malloc would map and unmap
  thread_local std::vector<int8_t> q_store;
  thread_local std::vector<float> dx_store, corr_store;
  thread_local std::vector<T> gate_up_store;
  q_store.resize(a.rows * a.k);
  dx_store.resize(a.rows * blocks);
  corr_store.assign(a.rows * corr_stride, 0.f);
  // plain pointers for the workers: a thread_local named inside the lambdas would be each worker's own
  int8_t* q = q_store.data();
  float* dx = dx_store.data();
  float* corr = corr_store.data();
  at::parallel_for(0, a.rows, std::max<int64_t>(1, 4096 / a.k), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      quantize_row<Q::GROUP>(a.x + r * a.x_stride, a.k, Q::OFFSET, q + r * a.k, dx + r * blocks, corr + r * corr_stride);
  });
  thread_local std::vector<float> lanes_store;
  lanes_store.assign(STEP_BLOCKS == 2 ? a.rows * pairs * 16 : 0, 0.f);
  float* lanes = lanes_store.data();
  if (STEP_BLOCKS == 2)
    for (int64_t r = 0; r < a.rows; ++r)
      for (int64_t b = 0; b < blocks; ++b) std::fill_n(lanes + (r * pairs + b / 2) * 16 + (b % 2) * 8, 8, dx[r * blocks + b]);
  const Acts acts{q, dx, lanes, corr, a.k, blocks, pairs, corr_stride};
  if (a.epilogue == Epilogue::kSiluMul) gate_up_store.resize(a.rows * a.n);
  T* gate_up = gate_up_store.data();
  run_columns<Q>(a, acts, Sink<T>{a, gate_up});
  finish_silu_mul(a, gate_up);
}

#if defined(BATCHTOP_QUANT_VNNI)
// Q4_0, Q4_1, Q8_0 from pack_linear_quant's 16-column groups (quant_repack.h), a.blocks the first group.
// The activations are quantized into the calling thread's buffers (by `rows_parallel` threads, or by it
// alone); the groups are a thread's share.
template <int64_t QT, typename T>
RepackActs repacked_acts(const QuantLinearArgsOf<T>& a, bool rows_parallel) {
  const int64_t blocks = a.k / 32;
  constexpr int32_t offset = QT == 2 ? -8 : QT == 8 ? -128 : 0;
  thread_local std::vector<int8_t> q_store;
  thread_local std::vector<float> dx_store, xsum_store;
  thread_local std::vector<int32_t> ioff_store;
  q_store.resize(a.rows * a.k);
  dx_store.resize(a.rows * blocks);
  xsum_store.resize(a.rows * blocks);
  ioff_store.resize(a.rows * blocks);
  int8_t* q = q_store.data();
  float *dx = dx_store.data(), *xsum = xsum_store.data();
  int32_t* ioff = ioff_store.data();
  const auto quantize = [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      quantize_row<32>(a.x + r * a.x_stride, a.k, 0.f, q + r * a.k, dx + r * blocks, nullptr);
      for (int64_t b = 0; b < blocks; ++b) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + r * a.k + 32 * b));
        const __m256i sums = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), v), _mm256_set1_epi16(1));
        const float s = int_sum8(sums);  // |sum| <= 32 * 127: exact
        ioff[r * blocks + b] = offset * static_cast<int32_t>(s);
        xsum[r * blocks + b] = dx[r * blocks + b] * s;
      }
    }
  };
  if (rows_parallel)
    at::parallel_for(0, a.rows, std::max<int64_t>(1, 4096 / a.k), quantize);
  else
    quantize(0, a.rows);
  return RepackActs{q, dx, ioff, xsum, a.k, blocks};
}

template <int64_t QT, typename T>
void repacked_groups(const QuantLinearArgsOf<T>& a, const RepackActs& acts, const Sink<T>& sink, int64_t begin,
                     int64_t end) {
  const int64_t group_bytes = a.k / 32 * RepackFormat<QT>::BYTES;
  __m512 y[REPACK_ROWS];
  alignas(64) float lanes[GROUP_COLS];
  for (int64_t g = begin; g < end; ++g) {
    const int64_t n0 = g * GROUP_COLS, cols = std::min<int64_t>(GROUP_COLS, a.n - n0);
    for (int64_t r0 = 0; r0 < a.rows; r0 += REPACK_ROWS) {
      const int rows = static_cast<int>(std::min<int64_t>(REPACK_ROWS, a.rows - r0));
      REPACK_TILES<QT>[rows](acts, r0, a.blocks + g * group_bytes, y);
      for (int r = 0; r < rows; ++r) {
        if (cols == GROUP_COLS) {
          sink.group(r0 + r, n0, y[r]);
          continue;
        }
        _mm512_store_ps(lanes, y[r]);
        for (int c = 0; c < cols; ++c) sink(r0 + r, n0 + c, lanes[c]);
      }
    }
  }
}

template <typename T>
T* gate_up_rows(const QuantLinearArgsOf<T>& a) {  // the calling thread's kSiluMul buffer
  thread_local std::vector<T> store;
  if (a.epilogue == Epilogue::kSiluMul) store.resize(a.rows * a.n);
  return store.data();
}

template <int64_t QT, typename T>
void run_repacked(const QuantLinearArgsOf<T>& a) {
  const RepackActs acts = repacked_acts<QT>(a, true);
  T* gate_up = gate_up_rows(a);
  const Sink<T> sink{a, gate_up};
  at::parallel_for(0, (a.n + GROUP_COLS - 1) / GROUP_COLS, 1,
                   [&](int64_t begin, int64_t end) { repacked_groups<QT>(a, acts, sink, begin, end); });
  finish_silu_mul(a, gate_up);
}

// The columns of share `part` of `parts` of n columns: about equal runs of whole units of unit_cols.
ColumnShare share_columns(int64_t n, int64_t part, int64_t parts, int64_t unit_cols) {
  TORCH_CHECK(unit_cols > 0 && unit_cols % GROUP_COLS == 0 && parts > 0 && part >= 0 && part < parts,
              "linear_quant_share: unit_cols must be a positive multiple of 16, part one of parts");
  const int64_t units = (n + unit_cols - 1) / unit_cols, chunk = (units + parts - 1) / parts;
  const int64_t begin = std::min(units, part * chunk), end = std::min(units, begin + chunk);
  return {std::min(n, begin * unit_cols), std::min(n, end * unit_cols)};
}

// Share `part` of `parts`: whole units of unit_cols columns, except that a kSiluMul share holds the same
// columns of both halves (the gate group and its up group), and finishes them. Returns its columns.
template <int64_t QT, typename T>
ColumnShare run_repacked_share(const QuantLinearArgsOf<T>& a, int64_t part, int64_t parts, int64_t unit_cols) {
  const RepackActs acts = repacked_acts<QT>(a, false);
  T* gate_up = gate_up_rows(a);
  const Sink<T> sink{a, gate_up};
  const bool silu = a.epilogue == Epilogue::kSiluMul;
  const int64_t groups = (a.n + GROUP_COLS - 1) / GROUP_COLS, span = silu ? groups / 2 : groups;
  const ColumnShare share = share_columns(silu ? a.n / 2 : a.n, part, parts, unit_cols);
  const int64_t begin = share.begin / GROUP_COLS, end = std::min(span, (share.end + GROUP_COLS - 1) / GROUP_COLS);
  repacked_groups<QT>(a, acts, sink, begin, end);
  if (!silu) return share;
  repacked_groups<QT>(a, acts, sink, span + begin, span + end);
  const int64_t half = a.n / 2, c0 = begin * GROUP_COLS, cols = (end - begin) * GROUP_COLS;
  for (int64_t r = 0; r < a.rows && cols > 0; ++r)
    silu_mul_row(a.out + r * a.out_stride + c0, gate_up + r * a.n + c0, gate_up + r * a.n + half + c0, cols);
  return share;
}
#endif

}  // namespace
#endif

int64_t quant_row_bytes(int64_t qtype, int64_t k) {
  int64_t super = 0, bytes = 0;
  switch (qtype) {
    case 2: super = 32, bytes = 18; break;
    case 3: super = 32, bytes = 20; break;
    case 8: super = 32, bytes = 34; break;
    case 12: super = 256, bytes = 144; break;
    case 14: super = 256, bytes = 210; break;
    default: return -1;
  }
  return k > 0 && k % super == 0 ? k / super * bytes : -1;
}

bool linear_quant_supported(int64_t qtype) {
#if defined(BATCHTOP_QUANT)
  return quant_row_bytes(qtype, 256) > 0;
#else
  return false;
#endif
}

namespace {
template <typename T>
void run_any(const QuantLinearArgsOf<T>& a) {
  TORCH_CHECK(linear_quant_supported(a.qtype), "linear_quant: ggml type ", a.qtype,
              " is not one of Q4_0 (2), Q4_1 (3), Q8_0 (8), Q4_K (12), Q6_K (14), or this CPU lacks AVX2, FMA and F16C");
  if (a.rows == 0 || a.n == 0) return;
#if defined(BATCHTOP_QUANT)
  switch (a.qtype) {
#if defined(BATCHTOP_QUANT_VNNI)
    case Q4_0::ID: return run_repacked<Q4_0::ID>(a);
    case Q4_1::ID: return run_repacked<Q4_1::ID>(a);
    case Q8_0::ID: return run_repacked<Q8_0::ID>(a);
#else
    case Q4_0::ID: return run_type<Q4_0>(a);
    case Q4_1::ID: return run_type<Q4_1>(a);
    case Q8_0::ID: return run_type<Q8_0>(a);
#endif
    case Q4_K::ID: return run_type<Q4_K>(a);
    case Q6_K::ID: return run_type<Q6_K>(a);
  }
#endif
}
}  // namespace

void linear_quant_run(const QuantLinearArgs& a) { run_any(a); }

void linear_quant_run(const QuantLinearArgsOf<float>& a) { run_any(a); }

bool linear_quant_shares(int64_t qtype, int64_t n, Epilogue epilogue) {
#if defined(BATCHTOP_QUANT_VNNI)
  return quant_repacked(qtype) && (epilogue != Epilogue::kSiluMul || n % (2 * quant::GROUP_COLS) == 0);
#else
  return false;
#endif
}

ColumnShare linear_quant_share(const QuantLinearArgs& a, int64_t part, int64_t parts, int64_t unit_cols) {
  TORCH_CHECK(linear_quant_shares(a.qtype, a.n, a.epilogue), "linear_quant_share: ggml type ", a.qtype,
              " is not computed from a pack in shares here");
#if defined(BATCHTOP_QUANT_VNNI)
  switch (a.qtype) {
    case Q4_0::ID: return run_repacked_share<Q4_0::ID>(a, part, parts, unit_cols);
    case Q4_1::ID: return run_repacked_share<Q4_1::ID>(a, part, parts, unit_cols);
    case Q8_0::ID: return run_repacked_share<Q8_0::ID>(a, part, parts, unit_cols);
  }
#endif
  return {0, 0};
}

// out (rows, N) = x (rows, K) W^T + bias, W the (N, row_bytes) uint8 block matrix of ggml type qtype, or its
// pack_linear_quant pack where quant_repacked(qtype);
// epilogue 1: out (rows, N / 2) = silu(gate) * up with W's rows [gate; up]; epilogue 2: out += x W^T + bias.
void linear_quant(at::Tensor& out, const at::Tensor& x, const at::Tensor& blocks, int64_t qtype,
                  const c10::optional<at::Tensor>& bias, int64_t epilogue) {
  TORCH_CHECK(linear_quant_supported(qtype), "linear_quant: qtype ", qtype,
              " is not supported here (Q4_0 = 2, Q4_1 = 3, Q8_0 = 8, Q4_K = 12, Q6_K = 14; AVX2, FMA and F16C needed)");
  TORCH_CHECK(x.dim() == 2 && (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat) &&
                  x.stride(1) == 1 && x.device().is_cpu(),
              "linear_quant: x must be a 2-D bfloat16 or float32 CPU tensor with unit column stride, got ", x.sizes(),
              " ", x.scalar_type());
  const int64_t rows = x.size(0), k = x.size(1), row_bytes = quant_row_bytes(qtype, k);
  TORCH_CHECK(row_bytes > 0, "linear_quant: x has ", k, " features, not a whole number of ggml type ", qtype,
              "'s blocks");
  int64_t n = 0;
  const uint8_t* weight = nullptr;
  if (quant_repacked(qtype)) {
    weight = repacked_groups(blocks, qtype, k, &n, "linear_quant");
  } else {
    TORCH_CHECK(blocks.dim() == 2 && blocks.scalar_type() == at::kByte && blocks.is_contiguous() &&
                    blocks.size(1) == row_bytes && blocks.device().is_cpu(),
                "linear_quant: blocks must be a contiguous (N, ", row_bytes, ") uint8 CPU tensor for ", k,
                " features of ggml type ", qtype, ", got ", blocks.sizes(), " ", blocks.scalar_type());
    n = blocks.size(0), weight = blocks.data_ptr<uint8_t>();
  }
  TORCH_CHECK(epilogue >= 0 && epilogue <= 2, "linear_quant: epilogue must be 0 (store), 1 (silu_mul) or 2 (add_into)");
  const auto ep = static_cast<Epilogue>(epilogue);
  const int64_t out_cols = ep == Epilogue::kSiluMul ? n / 2 : n;
  TORCH_CHECK(ep != Epilogue::kSiluMul || n % 2 == 0, "linear_quant: silu_mul needs an even number of weight rows");
  const auto dtype = x.scalar_type();
  TORCH_CHECK(out.dim() == 2 && out.size(0) == rows && out.size(1) == out_cols && out.stride(1) == 1 &&
                  out.scalar_type() == dtype && out.device().is_cpu(),
              "linear_quant: out must be (", rows, ", ", out_cols, ") ", dtype, " (x's dtype) with unit column stride, got ",
              out.sizes(), " ", out.scalar_type());
  const bool has_bias = bias && bias->defined();
  if (has_bias)
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == n && bias->is_contiguous() && bias->scalar_type() == dtype &&
                    bias->device().is_cpu(),
                "linear_quant: bias must be a contiguous (", n, ",) ", dtype, " (x's dtype) CPU tensor, got ",
                bias->sizes(), " ", bias->scalar_type());
  by_dtype(x, "linear_quant: x must be bfloat16 or float32", [&](auto zero) {
    using T = decltype(zero);
    linear_quant_run(QuantLinearArgsOf<T>{x.data_ptr<T>(), x.stride(0), rows, weight, k, n, qtype,
                                          has_bias ? bias->data_ptr<T>() : nullptr, out.data_ptr<T>(), out.stride(0), ep});
  });
}

}  // namespace batchtop_cpu
