// paged_attention_cpu.cpp's kernel as a C++ call, for the kernels that run a whole decoder layer.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace batchtop_cpu {

// out, q: (rows, heads, head_dim), last dim contiguous; k/v_cache: one contiguous pool layer; row r
// attends to keys [0, context_lens[r]) of the sequence whose table is block_tables[row_tables[r]]
// (block_tables[r] without row_tables).
void paged_attention(at::Tensor out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                     const at::Tensor& block_tables, const std::optional<at::Tensor>& row_tables,
                     const at::Tensor& context_lens, double scale);

}  // namespace batchtop_cpu
