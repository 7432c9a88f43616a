// Every op batchtop's CPU kernel library registers, as C++ calls (register_ops_cpu.cpp gives them their
// torch schemas). Each kernel source includes only ATen's Tensor, not ATen.h or torch/library.h: those
// two headers took three quarters of the library's build time, once per source.
#pragma once

#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

#include "team_barrier.h"

namespace batchtop_cpu {

// paged_attention_cpu.cpp. out, q: (rows, heads, head_dim), last dim contiguous; k/v_cache: one
// contiguous pool layer; row r attends to keys [0, context_lens[r]) of the sequence whose table is
// block_tables[row_tables[r]] (block_tables[r] without row_tables).
void paged_attention(at::Tensor out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                     const at::Tensor& block_tables, const std::optional<at::Tensor>& row_tables,
                     const at::Tensor& context_lens, double scale);
// The same call's part `part` of `parts` (its (row, KV head) jobs split as paged_attention splits them
// between that many threads), on the calling thread: for a team of threads the caller runs. part -1: the
// whole call, on torch's threads.
void paged_attention_parts(at::Tensor out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& block_tables, const std::optional<at::Tensor>& row_tables,
                           const at::Tensor& context_lens, double scale, int64_t part, int64_t parts);
// For a team whose every thread calls paged_attention_team(..., part, parts, scores) at once (it holds a
// barrier): the floats of the shared scores buffer it takes, or -1 where the team computes the call as
// paged_attention_parts does (scores null).
int64_t paged_attention_team_scores(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& context_lens);
void paged_attention_team(at::Tensor out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                          const at::Tensor& block_tables, const std::optional<at::Tensor>& row_tables,
                          const at::Tensor& context_lens, double scale, int64_t part, int64_t parts, float* scores,
                          TeamBarrier& barrier);

// fused_ops_cpu.cpp
void rms_norm(at::Tensor out, at::Tensor x, const at::Tensor& weight, double eps);
void add_rms_norm(at::Tensor residual, const at::Tensor& x, at::Tensor out, const at::Tensor& weight, double eps);
void silu_and_mul(at::Tensor out, const at::Tensor& gate_up);
void rope(at::Tensor x, const at::Tensor& cos, const at::Tensor& signed_sin);
// logits = rms_norm(x[rows]) W^T, W a GGUF lm_head (linear_quant's blocks or pack of qtype)
void norm_head_quant(at::Tensor& logits, const at::Tensor& x, const at::Tensor& rows, const at::Tensor& norm_weight,
                     double eps, const at::Tensor& head, int64_t qtype);

// sampling_cpu.cpp
void sample(at::Tensor tokens, const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& top_p,
            const at::Tensor& seed_lo, const at::Tensor& seed_hi, const at::Tensor& counter);
void argmax(at::Tensor tokens, const at::Tensor& logits);

// linear_bf16_cpu.cpp
at::Tensor pack_linear_bf16(const at::Tensor& weight);
void linear_bf16(at::Tensor& out, const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                 int64_t half, int64_t epilogue);
bool linear_bf16_supported();

// linear_quant_cpu.cpp
void linear_quant(at::Tensor& out, const at::Tensor& x, const at::Tensor& blocks, int64_t qtype,
                  const c10::optional<at::Tensor>& bias, int64_t epilogue);
bool linear_quant_supported(int64_t qtype);
// quant_repack.cpp: the 16-column pack linear_quant reads Q4_0, Q4_1 and Q8_0 from on AVX-512 VNNI (other
// types, other CPUs: the blocks themselves)
at::Tensor pack_linear_quant(const at::Tensor& blocks, int64_t qtype);
// quant_repack.cpp: rows ids of a Q4_0, Q4_1 or Q8_0 block matrix (the file's layout), dequantized into out
void quant_embedding(at::Tensor& out, const at::Tensor& blocks, const at::Tensor& ids, int64_t qtype);

// decoder_layer_cpu.cpp
void decoder_layers_bf16(at::Tensor x, const c10::List<c10::optional<at::Tensor>>& weight_list,
                         at::TensorList k_caches, at::TensorList v_caches, const at::Tensor& cos, const at::Tensor& sin,
                         const at::Tensor& slot_mapping, const at::Tensor& block_tables,
                         const c10::optional<at::Tensor>& row_tables, const at::Tensor& context_lens,
                         int64_t num_heads, double eps, double scale, at::IntArrayRef linear_types);

}  // namespace batchtop_cpu
