// DecoderStack (decoder_stack.h): decoder_layers_bf16's per-model arguments, checked once.
#include "decoder_stack.h"

#include <algorithm>

namespace batchtop_cpu {
namespace {

int64_t version_of(const at::Tensor& p) { return p.is_inference() ? -1 : static_cast<int64_t>(p._version()); }

}  // namespace

DecoderStack::DecoderStack(c10::List<c10::optional<at::Tensor>> weights, std::vector<int64_t> linear_types,
                           int64_t num_heads, int64_t kv_heads, int64_t head_dim, double eps, double scale,
                           std::vector<at::Tensor> params)
    : stack_(check_layer_stack(weights, linear_types, num_heads, kv_heads, head_dim)),
      params_(std::move(params)),
      eps_(eps),
      scale_(scale) {
  state_.reserve(2 * params_.size());
  for (const at::Tensor& p : params_) {
    state_.push_back(reinterpret_cast<int64_t>(p.data_ptr()));
    state_.push_back(version_of(p));
  }
}

int64_t DecoderStack::run(at::Tensor x, std::vector<at::Tensor> k_caches, std::vector<at::Tensor> v_caches,
                          const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& positions,
                          const at::Tensor& slot_mapping, const at::Tensor& block_tables,
                          const c10::optional<at::Tensor>& row_tables, const at::Tensor& context_lens) {
  for (size_t i = 0; i < params_.size(); ++i)
    if (reinterpret_cast<int64_t>(params_[i].data_ptr()) != state_[2 * i] || version_of(params_[i]) != state_[2 * i + 1])
      return kParamsChanged;
  const int64_t rows = x.dim() == 2 ? x.size(0) : -1, hd = std::max<int64_t>(1, stack_head_dim(*stack_));
  if (positions.scalar_type() == at::kLong && positions.is_contiguous() && positions.numel() == rows &&
      !rope_rows_cover(positions, rows, cos.numel() / hd))
    return kPositionsPast;  // (positions of another dtype or shape: run_layer_stack names them)
  run_layer_stack(*stack_, x, k_caches, v_caches, cos, sin, positions, slot_mapping, block_tables, row_tables,
                  context_lens, eps_, scale_);
  return kRan;
}

}  // namespace batchtop_cpu
