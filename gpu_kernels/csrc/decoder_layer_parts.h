// The pieces of a step's decoder layers that decoder_layer_cpu.cpp (layer by layer) and
// decoder_team_cpu.cpp (a team of threads over every layer) share: a layer's weights as the kernels take
// them, what every layer of a step shares, and the row helpers both run.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "linear_quant_cpu.h"

namespace batchtop_cpu::layer {

using bf16 = c10::BFloat16;

struct Packed {  // a PackedLinear's pack (type -1) or a GGUF block matrix (its ggml type), and its bias
  const at::Tensor& packed;
  const c10::optional<at::Tensor>& bias;
  const char* name;
  int64_t type;
};

// One layer's weights as decoder_layers_bf16 takes them: entries [10 i, 10 i + 10) of its list.
struct LayerWeights {
  const at::Tensor& input_norm;
  const at::Tensor& post_norm;
  Packed qkv, o, gate_up, down;
};

struct StepRows {  // what every layer of the step shares
  int64_t rows, hidden, num_heads;
  const bf16* cos;
  const bf16* sin;
  const int64_t* table_rows;  // row r's cos and sin: row table_rows[r] of the tables (null: row r)
  const int64_t* slots;
  const at::Tensor& block_tables;
  const std::optional<at::Tensor>& row_tables;
  const at::Tensor& context_lens;
  double eps, scale;
};

struct Scratch {  // one step's intermediates, reused by every layer
  at::Tensor h, qkv, attn, act;
};

// gate_up's intermediate size (one half of its columns)
int64_t gate_up_half(const Packed& w);
// linear_quant's arguments for a block-matrix linear (from its pack's first group where it is repacked);
// n: the output features (both halves for kSiluMul), k the input features
QuantLinearArgs quant_args(const bf16* x, int64_t x_stride, int64_t rows, int64_t k, const Packed& w, int64_t n,
                           bf16* out, int64_t out_stride, Epilogue epilogue);
// RMSNorm of each of rows rows of h features
void norm_rows(bf16* out, const bf16* x, const at::Tensor& weight, int64_t rows, int64_t h, double eps);
// RoPE on each row's q and k heads in place, then its k and v heads into the pool at its slot: of the
// row's heads [h_begin, h_end) (q heads, then k, then v; all of them by default). Row r's cos and sin are
// row table_rows[r] of the tables (row r where table_rows is null).
void rope_and_store(bf16* qkv, int64_t rows, int64_t width, int64_t heads, int64_t kv_heads, int64_t hd,
                    const bf16* cos, const bf16* sin, const int64_t* table_rows, bf16* k_cache, bf16* v_cache,
                    const int64_t* slots, int64_t h_begin = 0, int64_t h_end = -1);

// decoder_team_cpu.cpp: whether run_team computes this step, and every layer of it as one team of threads
bool team_runs(const std::vector<LayerWeights>& stack, int64_t rows, int64_t hidden, int64_t width, int64_t hd);
void run_team(bf16* xp, const std::vector<LayerWeights>& stack, at::TensorList k_caches, at::TensorList v_caches,
              const StepRows& s, Scratch& scratch);

}  // namespace batchtop_cpu::layer
