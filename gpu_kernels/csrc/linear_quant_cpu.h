// Linear layers on GGUF-quantized weights (linear_quant_cpu.cpp) as a C++ call, for the kernels that run a
// whole decoder layer. The weight stays in the file's layout (row n of `blocks` is output feature n's
// K / block_size blocks, row_bytes apart) or, for Q4_0, Q4_1 and Q8_0 on AVX-512 VNNI, is its 16-column
// repack (quant_repack.h).
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>

#include "linear_bf16_cpu.h"  // Epilogue

namespace batchtop_cpu {

template <typename T>  // T: the activations' and the output's element type, float or c10::BFloat16
struct QuantLinearArgsOf {
  const T* x;  // (rows, k), rows x_stride apart
  int64_t x_stride, rows;
  const uint8_t* blocks;  // (n, row_bytes) in the GGUF layout of qtype; where quant_repacked(qtype), the
                          // first 16-column group of its pack_linear_quant pack (quant_repack.h)
  int64_t k, n;           // n: the weight's rows (kSiluMul: gate rows then up rows, n / 2 of each)
  int64_t qtype;          // the ggml type id: 2 Q4_0, 3 Q4_1, 8 Q8_0, 12 Q4_K, 14 Q6_K
  const T* bias;          // (n,) or null
  T* out;                 // rows out_stride apart: n columns, or n / 2 for kSiluMul
  int64_t out_stride;
  Epilogue epilogue;
};
using QuantLinearArgs = QuantLinearArgsOf<c10::BFloat16>;

// A row's bytes for k weights of qtype: -1 when the type is not one of the five or k is not a whole
// number of its blocks.
int64_t quant_row_bytes(int64_t qtype, int64_t k);

// Splits the output columns across torch's intra-op threads. Each row's result is independent of the
// other rows (its activations are quantized alone, its sums taken in one fixed order).
// The float32 form quantizes the same int8 activations from float32 rows and takes the same integer dots;
// only the reading of x and bias and the rounding of the output differ.
void linear_quant_run(const QuantLinearArgs& args);
void linear_quant_run(const QuantLinearArgsOf<float>& args);

// Whether linear_quant_share computes this type, width and epilogue (the types read from a 16-column pack).
bool linear_quant_shares(int64_t qtype, int64_t n, Epilogue epilogue);
// Output columns [begin, end) (of each half for kSiluMul).
struct ColumnShare {
  int64_t begin, end;
};
// Share `part` of `parts` of linear_quant_run(args), by the calling thread alone, for a team of threads
// the caller runs (decoder_team_cpu.cpp): every thread quantizes the activations for itself, and the
// shares together compute every output once, each element bitwise as linear_quant_run does. A share is
// about equal runs of whole units of unit_cols columns (a multiple of 16, a pack's group); returns the
// columns this one computed.
ColumnShare linear_quant_share(const QuantLinearArgs& args, int64_t part, int64_t parts, int64_t unit_cols = 16);

}  // namespace batchtop_cpu
