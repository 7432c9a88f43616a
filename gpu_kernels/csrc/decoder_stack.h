// A model's decoder layers checked once and kept between steps (torch.classes.batchtop_cpu.DecoderStack).
//
// decoder_layers_bf16 takes ~300 weights and the linears' types as arguments and checks every one of them
// each call. After a step has streamed 100 MB of weights through the caches, that conversion and
// checking, with the separate check that no parameter was replaced or written, cost ~0.2-0.3 ms of a
// 3 ms SmolLM2 decode step: every tensor object is a cache miss, twice. A DecoderStack converts and
// checks them when it is made; run() then takes the step's 60 pool layers and the whole RoPE tables (each
// row's is the row its position names: no gather in Python), looks at each source parameter's storage
// and version (the packs were built from them), and runs the layers.
#pragma once

#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace batchtop_cpu {

struct LayerStack;  // decoder_layer_cpu.cpp: the layers' weights, types and pool layers, checked

// decoder_layers_bf16's checks of everything but the step's rows; its TORCH_CHECK messages.
std::shared_ptr<const LayerStack> check_layer_stack(const c10::List<c10::optional<at::Tensor>>& weights,
                                                    at::IntArrayRef linear_types, int64_t num_heads,
                                                    int64_t kv_heads, int64_t head_dim);
int64_t stack_head_dim(const LayerStack& stack);
// Whether positions is (rows,) int64, each a row of tables of table_rows rows.
bool rope_rows_cover(const at::Tensor& positions, int64_t rows, int64_t table_rows);
// decoder_layers_bf16 over a checked stack and the step's pool layers (checked here). cos, sin: a row a
// step row, or, with positions, tables whose row positions[r] is step row r's.
void run_layer_stack(const LayerStack& stack, at::Tensor x, at::TensorList k_caches, at::TensorList v_caches,
                     const at::Tensor& cos, const at::Tensor& sin, const c10::optional<at::Tensor>& positions,
                     const at::Tensor& slot_mapping, const at::Tensor& block_tables,
                     const c10::optional<at::Tensor>& row_tables, const at::Tensor& context_lens, double eps,
                     double scale);

class DecoderStack : public torch::CustomClassHolder {
 public:
  // decoder_layers_bf16's weights and scalars, for pools of kv_heads x head_dim, and the parameters the
  // weights were built from (params): run() refuses once any of them is replaced or written. The pool is
  // the step's: a stack holds none, so no pool outlives its runner for it.
  DecoderStack(c10::List<c10::optional<at::Tensor>> weights, std::vector<int64_t> linear_types,
               int64_t num_heads, int64_t kv_heads, int64_t head_dim, double eps, double scale,
               std::vector<at::Tensor> params);
  // What run() did (cpu_kernels.STACK_*): ran the layers, or ran nothing, for one of these reasons.
  enum Status : int64_t {
    kRan = 0,
    kParamsChanged = 1,  // a parameter no longer sits at the storage and version it had (build anew)
    kPositionsPast = 2,  // a position is past the rope tables' rows (grow them, call again)
  };
  // The step's layers over x, in place, as decoder_layers_bf16, step row r roped with row positions[r]
  // of the cos and sin tables (positions, head_dim); a Status.
  int64_t run(at::Tensor x, std::vector<at::Tensor> k_caches, std::vector<at::Tensor> v_caches, const at::Tensor& cos,
              const at::Tensor& sin, const at::Tensor& positions, const at::Tensor& slot_mapping,
              const at::Tensor& block_tables, const c10::optional<at::Tensor>& row_tables,
              const at::Tensor& context_lens);

 private:
  std::shared_ptr<const LayerStack> stack_;
  std::vector<at::Tensor> params_;
  std::vector<int64_t> state_;  // params_[i]'s data pointer at 2 i, its version (-1: an inference tensor) at 2 i + 1
  double eps_, scale_;
};

}  // namespace batchtop_cpu
