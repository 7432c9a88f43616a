// A step's Llama decoder layers over its rows in bfloat16, as one call: the work of 12-15 torch ops and
// Python lines a layer (llama.DecoderLayer.forward) on batchtop's CPU kernels, without the dispatch and
// allocation between them. On a deep, thin model (SmolLM2: 30 layers of hidden 576) that per-op cost is
// a good part of a decode step. Each layer:
//
//   h = rms_norm(x)                          input_layernorm
//   qkv = h Wqkv^T + b                        one GEMM over [q; k; v]
//   q, k = rope(q, k); k_cache, v_cache[slot] = k, v
//   x += paged_attention(q, pool) Wo^T + b    o_proj with the residual add as its epilogue
//   h = rms_norm(x)                          post_attention_layernorm
//   a = silu(gate) * up                      gate_up GEMM packed by halves, SiLU-and-mul as its epilogue
//   x += a Wdown^T + b                        down_proj with the residual add as its epilogue
//
// Every step rounds to bf16 where the torch ops round (the same kernels and row helpers as the unfused
// path), so the layer's output is bitwise that of DecoderLayer.forward on the CPU kernels. Every row is
// computed alone in a fixed order: a row's result does not depend on the other rows of the step.
//
// Each of a layer's four linears may instead be a GGUF-quantized block matrix (linear_quant_cpu.cpp), by
// its ggml type id in linear_types; a quantized gate_up holds its gate rows then its up rows. The layer
// is then bitwise the same ops run one by one with linear_quant in place of linear_bf16.
//
// A step of a few rows whose linears are all 16-column packs (Q4_0, Q4_1, Q8_0) runs as one team of
// threads (run_team, decoder_team_cpu.cpp): one parallel region for every layer, the threads meeting at
// barriers between the stages, where each stage would otherwise start and join a parallel region of its
// own. decoder_layer_parts.h holds what the two share.
#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu_vec.h"
#include "fused_rows.h"
#include "linear_bf16_cpu.h"
#include "linear_quant_cpu.h"
#include "quant_repack.h"
#include "ops_cpu.h"
#include "decoder_layer_parts.h"
#include "decoder_stack.h"

namespace batchtop_cpu {
namespace {

constexpr int64_t GRAIN = 1 << 14;  // elements per parallel task: a decode step's rows stay on one thread

}  // namespace

namespace layer {

// gate_up's intermediate size: a bf16 pack by halves has 32 columns of each half per 64-column group
int64_t gate_up_half(const Packed& w) {
  if (w.type < 0) return 32 * w.packed.size(0);
  const at::Tensor& p = w.packed;
  if (!quant_repacked(w.type) || p.dim() != 2 || p.scalar_type() != at::kByte || !p.is_contiguous() ||
      p.numel() < static_cast<int64_t>(sizeof(RepackHeader)))
    return p.size(0) / 2;  // check_packed then says what is wrong
  RepackHeader h{};
  std::memcpy(&h, w.packed.data_ptr<uint8_t>(), sizeof h);
  return h.n / 2;
}

const bf16* bias_of(const Packed& w) { return w.bias && w.bias->defined() ? w.bias->data_ptr<bf16>() : nullptr; }

// linear_quant's arguments for a block-matrix linear (from its pack's first group where it is repacked);
// n: the output features (both halves for kSiluMul), k the input features
QuantLinearArgs quant_args(const bf16* x, int64_t x_stride, int64_t rows, int64_t k, const Packed& w, int64_t n,
                           bf16* out, int64_t out_stride, Epilogue epilogue) {
  const uint8_t* blocks = w.packed.data_ptr<uint8_t>() + (quant_repacked(w.type) ? w.packed.size(1) : 0);
  return QuantLinearArgs{x, x_stride, rows, blocks, k, n, w.type, bias_of(w), out, out_stride, epilogue};
}

void norm_rows(bf16* out, const bf16* x, const at::Tensor& weight, int64_t rows, int64_t h, double eps) {
  const bf16* w = weight.data_ptr<bf16>();
  at::parallel_for(0, rows, std::max<int64_t>(1, GRAIN / h), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) rms_norm_row(out + r * h, x + r * h, w, h, static_cast<float>(eps));
  });
}

// RoPE on each row's q and k heads in place, then its k and v heads into the pool at its slot: of the
// row's heads [h_begin, h_end) (q heads, then k, then v; all of them by default). Row r's cos and sin are
// row table_rows[r] of the tables (row r where table_rows is null).
void rope_and_store(bf16* qkv, int64_t rows, int64_t width, int64_t heads, int64_t kv_heads, int64_t hd,
                    const bf16* cos, const bf16* sin, const int64_t* table_rows, bf16* k_cache, bf16* v_cache,
                    const int64_t* slots, int64_t h_begin, int64_t h_end) {
  const int64_t kv = kv_heads * hd, all = heads + 2 * kv_heads;
  h_end = h_end < 0 ? all : std::min(h_end, all);
  const int64_t k_begin = std::max(h_begin, heads), k_end = std::min(h_end, heads + kv_heads);
  const int64_t v_begin = std::max(h_begin, heads + kv_heads);
  at::parallel_for(0, rows, std::max<int64_t>(1, GRAIN / width), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      bf16* row = qkv + r * width;
      const int64_t t = table_rows != nullptr ? table_rows[r] : r;
      for (int64_t h = h_begin; h < std::min(h_end, heads + kv_heads); ++h)
        rope_head(row + h * hd, cos + t * hd, sin + t * hd, hd);
      if (k_begin < k_end)
        std::memcpy(k_cache + slots[r] * kv + (k_begin - heads) * hd, row + k_begin * hd, (k_end - k_begin) * hd * sizeof(bf16));
      if (v_begin < h_end)
        std::memcpy(v_cache + slots[r] * kv + (v_begin - heads - kv_heads) * hd, row + v_begin * hd,
                    (h_end - v_begin) * hd * sizeof(bf16));
    }
  });
}

}  // namespace layer

namespace {

using namespace layer;

void check_packed(const Packed& w, int64_t k, int64_t n) {
  const at::Tensor& p = w.packed;
  if (w.type >= 0 && quant_repacked(w.type)) {
    int64_t packed_n = 0;
    repacked_groups(p, w.type, k, &packed_n, "decoder_layers_bf16");
    TORCH_CHECK(packed_n == n, "decoder_layers_bf16: ", w.name, " must be the pack of a (", n, ", ", k,
                ") matrix of ggml type ", w.type, ", got one of ", packed_n, " rows");
  } else if (w.type >= 0) {
    const int64_t row_bytes = quant_row_bytes(w.type, k);
    TORCH_CHECK(row_bytes > 0 && p.dim() == 2 && p.is_contiguous() && p.scalar_type() == at::kByte &&
                    p.size(0) == n && p.size(1) == row_bytes,
                "decoder_layers_bf16: ", w.name, " must be a contiguous (", n, ", ", row_bytes, ") uint8 block matrix"
                " of ggml type ", w.type, " for ", k, " features");
  } else {
    TORCH_CHECK(p.dim() == 4 && p.size(2) == 64 && p.size(3) == 2 && p.is_contiguous() &&
                  p.scalar_type() == at::kBFloat16 && 2 * p.size(1) == k && n <= 64 * p.size(0) && n > 64 * (p.size(0) - 1),
                "decoder_layers_bf16: ", w.name, " must be pack_linear_bf16's pack of an (", n, ", ", k, ") weight");
  }
  TORCH_CHECK(!w.bias || !w.bias->defined() ||
                  (w.bias->dim() == 1 && w.bias->size(0) == n && w.bias->is_contiguous() &&
                   w.bias->scalar_type() == at::kBFloat16),
              "decoder_layers_bf16: ", w.name, " bias must be contiguous (", n, ",) bfloat16");
}

void linear(const bf16* x, int64_t x_stride, int64_t rows, int64_t k, const Packed& w, int64_t n, bf16* out,
            int64_t out_stride, Epilogue epilogue) {
  if (w.type >= 0) return linear_quant_run(quant_args(x, x_stride, rows, k, w, n, out, out_stride, epilogue));
  const int64_t half = epilogue == Epilogue::kSiluMul ? n / 2 : 0;
  linear_bf16_run(LinearArgs{x, x_stride, rows, w.packed.data_ptr<bf16>(), w.packed.size(0), w.packed.size(1), n, half,
                             bias_of(w), out, out_stride, epilogue});
}

constexpr int64_t WEIGHTS_PER_LAYER = 10;  // the two norms, then each linear's pack and bias (or None)

LayerWeights layer_weights(const std::vector<c10::optional<at::Tensor>>& w, const int64_t* types, int64_t layer) {
  const auto* e = w.data() + WEIGHTS_PER_LAYER * layer;
  const int64_t* t = types + 4 * layer;
  for (int i : {0, 1, 2, 4, 6, 8})
    TORCH_CHECK(e[i].has_value() && e[i]->defined(), "decoder_layers_bf16: layer ", layer,
                " lacks a norm weight or a linear's pack");
  return {*e[0], *e[1], {*e[2], e[3], "qkv", t[0]}, {*e[4], e[5], "o_proj", t[1]}, {*e[6], e[7], "gate_up", t[2]},
          {*e[8], e[9], "down_proj", t[3]}};
}

// Every layer's shapes and dtypes, checked before the first one runs: a bad call changes nothing.
void check_layer(const LayerWeights& w, int64_t hidden, int64_t num_heads, int64_t kv_heads, int64_t hd) {
  TORCH_CHECK(num_heads > 0 && kv_heads > 0 && num_heads % kv_heads == 0 && hd > 0 && hd % 2 == 0 && hd <= 256 &&
                  hidden % 2 == 0,
              "decoder_layers_bf16: heads must be a multiple of kv heads, head_dim even and <= 256, hidden even");
  const int64_t q_dim = num_heads * hd, width = q_dim + 2 * kv_heads * hd, inter = gate_up_half(w.gate_up);
  for (const at::Tensor* t : {&w.input_norm, &w.post_norm})
    TORCH_CHECK(t->dim() == 1 && t->size(0) == hidden && t->is_contiguous() && t->scalar_type() == at::kBFloat16,
                "decoder_layers_bf16: the norm weights must be contiguous (hidden,) bfloat16");
  check_packed(w.qkv, hidden, width);
  check_packed(w.o, q_dim, hidden);
  check_packed(w.gate_up, hidden, 2 * inter);
  check_packed(w.down, inter, hidden);
}

void run_layer(bf16* xp, const LayerWeights& w, at::Tensor& k_cache, at::Tensor& v_cache, const StepRows& s,
               Scratch& scratch) {
  const int64_t rows = s.rows, hidden = s.hidden, kv_heads = k_cache.size(2), hd = k_cache.size(3);
  const int64_t q_dim = s.num_heads * hd, width = q_dim + 2 * kv_heads * hd;
  const int64_t inter = gate_up_half(w.gate_up);
  bf16* hp = scratch.h.data_ptr<bf16>();
  bf16* qkv_out = scratch.qkv.data_ptr<bf16>();
  // Each stage is a scope torch.profiler shows by name (bench/profile_decode.py); off the profiler a
  // scope costs a flag check.
  {
    RECORD_USER_SCOPE("fused.input_norm");
    norm_rows(hp, xp, w.input_norm, rows, hidden, s.eps);
  }
  {
    RECORD_USER_SCOPE("fused.qkv_proj");
    linear(hp, hidden, rows, hidden, w.qkv, width, qkv_out, width, Epilogue::kStore);
  }
  {
    RECORD_USER_SCOPE("fused.rope_kv_write");
    rope_and_store(qkv_out, rows, width, s.num_heads, kv_heads, hd, s.cos, s.sin, s.table_rows,
                   k_cache.data_ptr<bf16>(), v_cache.data_ptr<bf16>(), s.slots);
  }
  {
    RECORD_USER_SCOPE("fused.attention");
    paged_attention(scratch.attn, scratch.qkv.narrow(1, 0, q_dim).view({rows, s.num_heads, hd}), k_cache, v_cache,
                    s.block_tables, s.row_tables, s.context_lens, s.scale);
  }
  {
    RECORD_USER_SCOPE("fused.o_proj_residual");
    linear(scratch.attn.data_ptr<bf16>(), q_dim, rows, q_dim, w.o, hidden, xp, hidden, Epilogue::kAddInto);
  }
  {
    RECORD_USER_SCOPE("fused.post_norm");
    norm_rows(hp, xp, w.post_norm, rows, hidden, s.eps);
  }
  {
    RECORD_USER_SCOPE("fused.gate_up_silu");
    linear(hp, hidden, rows, hidden, w.gate_up, 2 * inter, scratch.act.data_ptr<bf16>(), inter, Epilogue::kSiluMul);
  }
  {
    RECORD_USER_SCOPE("fused.down_proj_residual");
    linear(scratch.act.data_ptr<bf16>(), inter, rows, inter, w.down, hidden, xp, hidden, Epilogue::kAddInto);
  }
}

}  // namespace

// Every layer's weights, checked: what decoder_layers_bf16 runs in one call, and what a DecoderStack keeps
// between steps (decoder_stack_cpu.cpp). layers views weights: a stack is never copied.
struct LayerStack {
  std::vector<c10::optional<at::Tensor>> weights;
  std::vector<int64_t> types;
  std::vector<LayerWeights> layers;
  int64_t hidden = 0, num_heads = 0, kv_heads = 0, head_dim = 0;
};

std::shared_ptr<const LayerStack> check_layer_stack(const c10::List<c10::optional<at::Tensor>>& weight_list,
                                                    at::IntArrayRef linear_types, int64_t num_heads,
                                                    int64_t kv_heads, int64_t head_dim) {
  TORCH_CHECK(linear_bf16_supported(), "decoder_layers_bf16: built without AVX512_BF16 or AVX2 and FMA");
  const int64_t layers = static_cast<int64_t>(weight_list.size()) / WEIGHTS_PER_LAYER;
  TORCH_CHECK(static_cast<int64_t>(weight_list.size()) == WEIGHTS_PER_LAYER * layers,
              "decoder_layers_bf16: ", WEIGHTS_PER_LAYER, " weights a layer, got ", weight_list.size());
  auto stack = std::make_shared<LayerStack>();
  stack->weights = weight_list.vec();
  stack->types.assign(4 * layers, -1);
  stack->num_heads = num_heads, stack->kv_heads = kv_heads, stack->head_dim = head_dim;
  if (!linear_types.empty()) {
    TORCH_CHECK(static_cast<int64_t>(linear_types.size()) == 4 * layers, "decoder_layers_bf16: linear_types must "
                "hold 4 types a layer (qkv, o, gate_up, down), got ", linear_types.size(), " for ", layers, " layers");
    for (int64_t i = 0; i < 4 * layers; ++i) {
      TORCH_CHECK(linear_types[i] == -1 || linear_quant_supported(linear_types[i]), "decoder_layers_bf16: linear_types[",
                  i, "] = ", linear_types[i], " is neither -1 (bf16) nor a quantized type linear_quant runs here");
      stack->types[i] = linear_types[i];
    }
  }
  stack->layers.reserve(layers);
  for (int64_t i = 0; i < layers; ++i) {
    stack->layers.push_back(layer_weights(stack->weights, stack->types.data(), i));
    if (i == 0) stack->hidden = stack->layers[0].input_norm.numel();
    check_layer(stack->layers[i], stack->hidden, num_heads, kv_heads, head_dim);
    TORCH_CHECK(gate_up_half(stack->layers[i].gate_up) == gate_up_half(stack->layers[0].gate_up),
                "decoder_layers_bf16: every layer must have layer 0's shapes");  // the scratch is sized by layer 0
  }
  return stack;
}

int64_t stack_head_dim(const LayerStack& stack) { return stack.head_dim; }

bool rope_rows_cover(const at::Tensor& positions, int64_t rows, int64_t table_rows) {
  if (positions.scalar_type() != at::kLong || !positions.is_contiguous() || positions.numel() != rows) return false;
  const int64_t* p = positions.data_ptr<int64_t>();
  return std::all_of(p, p + rows, [&](int64_t t) { return t >= 0 && t < table_rows; });
}

void run_layer_stack(const LayerStack& stack, at::Tensor x, at::TensorList k_caches, at::TensorList v_caches,
                     const at::Tensor& cos, const at::Tensor& sin, const c10::optional<at::Tensor>& positions,
                     const at::Tensor& slot_mapping, const at::Tensor& block_tables,
                     const c10::optional<at::Tensor>& row_tables, const at::Tensor& context_lens, double eps,
                     double scale) {
  const int64_t layers = static_cast<int64_t>(stack.layers.size());
  TORCH_CHECK(static_cast<int64_t>(k_caches.size()) == layers && static_cast<int64_t>(v_caches.size()) == layers,
              "decoder_layers_bf16: a k and v pool layer per layer, got ", k_caches.size(), " and ", v_caches.size(),
              " for ", layers, " layers");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kBFloat16 && x.device().is_cpu() &&
                  (layers == 0 || x.size(1) == stack.hidden),
              "decoder_layers_bf16: x must be a contiguous (rows, hidden) bfloat16 CPU tensor, hidden the norms' size");
  if (layers == 0) return;
  for (int64_t i = 0; i < layers; ++i)
    TORCH_CHECK(k_caches[i].dim() == 4 && k_caches[i].is_contiguous() && v_caches[i].is_contiguous() &&
                    k_caches[i].scalar_type() == at::kBFloat16 && v_caches[i].scalar_type() == at::kBFloat16 &&
                    k_caches[i].sizes() == k_caches[0].sizes() && v_caches[i].sizes() == k_caches[0].sizes() &&
                    k_caches[i].size(2) == stack.kv_heads && k_caches[i].size(3) == stack.head_dim,
                "decoder_layers_bf16: k_cache and v_cache must be one contiguous bfloat16 pool layer each, of the "
                "stack's KV heads and head_dim, every layer's the same shape");
  const int64_t rows = x.size(0), hidden = x.size(1), num_heads = stack.num_heads, hd = stack.head_dim;
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.numel() == sin.numel() && cos.numel() % hd == 0 &&
                  cos.scalar_type() == at::kBFloat16 && sin.scalar_type() == at::kBFloat16 &&
                  (positions || cos.numel() == rows * hd),
              "decoder_layers_bf16: cos/sin tables (rows, head_dim) in bfloat16, or (positions, head_dim) with positions");
  TORCH_CHECK(!positions || rope_rows_cover(*positions, rows, cos.numel() / hd),
              "decoder_layers_bf16: positions must be (rows,) int64, each a row of the cos/sin tables");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous() && slot_mapping.numel() == rows,
              "decoder_layers_bf16: slot_mapping must be (rows,) int64");
  if (rows == 0) return;

  const int64_t kv_heads = stack.kv_heads, width = (num_heads + 2 * kv_heads) * hd;
  const auto opts = x.options();
  Scratch scratch{at::detail::empty_cpu({rows, hidden}, opts), at::detail::empty_cpu({rows, width}, opts),
                  at::detail::empty_cpu({rows, num_heads, hd}, opts),
                  at::detail::empty_cpu({rows, gate_up_half(stack.layers[0].gate_up)}, opts)};
  const std::optional<at::Tensor> tables_of_rows = row_tables ? std::optional<at::Tensor>(*row_tables) : std::nullopt;
  const StepRows step{rows, hidden, num_heads, cos.data_ptr<bf16>(), sin.data_ptr<bf16>(),
                      positions ? positions->data_ptr<int64_t>() : nullptr, slot_mapping.data_ptr<int64_t>(),
                      block_tables, tables_of_rows, context_lens, eps, scale};
  bf16* xp = x.data_ptr<bf16>();
  if (team_runs(stack.layers, rows, hidden, width, hd)) return run_team(xp, stack.layers, k_caches, v_caches, step, scratch);
  for (int64_t i = 0; i < layers; ++i) {
    at::Tensor k_cache = k_caches[i], v_cache = v_caches[i];
    run_layer(xp, stack.layers[i], k_cache, v_cache, step, scratch);
  }
}

// The step's decoder layers in turn over x, in place: layer i reads weights [10 i, 10 i + 10) and its
// pool layer k_caches[i], v_caches[i]; linear_types[4 i + j] is the type of its j-th linear (qkv, o, gate_up,
// down): -1 a pack_linear_bf16 pack, else a ggml type id (empty: every one -1). One call a step instead of
// one a layer: on SmolLM2 the Python and dispatch around 30 layer calls cost about as much as a tenth of
// a one-row step.
void decoder_layers_bf16(at::Tensor x, const c10::List<c10::optional<at::Tensor>>& weight_list,
                         at::TensorList k_caches, at::TensorList v_caches, const at::Tensor& cos, const at::Tensor& sin,
                         const at::Tensor& slot_mapping, const at::Tensor& block_tables,
                         const c10::optional<at::Tensor>& row_tables, const at::Tensor& context_lens,
                         int64_t num_heads, double eps, double scale, at::IntArrayRef linear_types) {
  const bool pool = !k_caches.empty();  // no layers: nothing to check them against
  TORCH_CHECK(!pool || k_caches[0].dim() == 4,
              "decoder_layers_bf16: k_caches must hold a (blocks, block_size, kv_heads, head_dim) pool layer a layer");
  const auto stack = check_layer_stack(weight_list, linear_types, num_heads, pool ? k_caches[0].size(2) : 0,
                                       pool ? k_caches[0].size(3) : 0);
  run_layer_stack(*stack, x, k_caches, v_caches, cos, sin, c10::nullopt, slot_mapping, block_tables, row_tables,
                  context_lens, eps, scale);
}

}  // namespace batchtop_cpu
