// A whole Llama decoder layer over a step's rows in bfloat16, as one call: the work of the 12-15 torch
// ops and Python lines of llama.DecoderLayer.forward on batchtop's CPU kernels, without the dispatch
// and allocation between them. On a deep, thin model (SmolLM2: 30 layers of hidden 576) that per-op
// cost is a good part of a decode step.
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
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>

#include "cpu_vec.h"
#include "fused_rows.h"
#include "linear_bf16_cpu.h"
#include "paged_attention_cpu.h"

namespace batchtop_cpu {
namespace {

using bf16 = c10::BFloat16;
constexpr int64_t GRAIN = 1 << 14;  // elements per parallel task: a decode step's rows stay on one thread

struct Packed {  // a PackedLinear's pack, its bias and its output features
  const at::Tensor& packed;
  const c10::optional<at::Tensor>& bias;
  const char* name;
};

void check_packed(const Packed& w, int64_t k, int64_t n) {
  const at::Tensor& p = w.packed;
  TORCH_CHECK(p.dim() == 4 && p.size(2) == 64 && p.size(3) == 2 && p.is_contiguous() &&
                  p.scalar_type() == at::kBFloat16 && 2 * p.size(1) == k && n <= 64 * p.size(0) && n > 64 * (p.size(0) - 1),
              "decoder_layer_bf16: ", w.name, " must be pack_linear_bf16's pack of an (", n, ", ", k, ") weight");
  TORCH_CHECK(!w.bias || !w.bias->defined() ||
                  (w.bias->dim() == 1 && w.bias->size(0) == n && w.bias->is_contiguous() &&
                   w.bias->scalar_type() == at::kBFloat16),
              "decoder_layer_bf16: ", w.name, " bias must be contiguous (", n, ",) bfloat16");
}

void linear(const bf16* x, int64_t x_stride, int64_t rows, const Packed& w, int64_t n, int64_t half, bf16* out,
            int64_t out_stride, Epilogue epilogue) {
  const bf16* bias = w.bias && w.bias->defined() ? w.bias->data_ptr<bf16>() : nullptr;
  linear_bf16_run(LinearArgs{x, x_stride, rows, w.packed.data_ptr<bf16>(), w.packed.size(0), w.packed.size(1), n, half,
                             bias, out, out_stride, epilogue});
}

void norm_rows(bf16* out, const bf16* x, const at::Tensor& weight, int64_t rows, int64_t h, double eps) {
  const bf16* w = weight.data_ptr<bf16>();
  at::parallel_for(0, rows, std::max<int64_t>(1, GRAIN / h), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) rms_norm_row(out + r * h, x + r * h, w, h, static_cast<float>(eps));
  });
}

// RoPE on each row's q and k heads in place, then its k and v heads into the pool at its slot.
void rope_and_store(bf16* qkv, int64_t rows, int64_t width, int64_t heads, int64_t kv_heads, int64_t hd,
                    const bf16* cos, const bf16* sin, bf16* k_cache, bf16* v_cache, const int64_t* slots) {
  const int64_t kv = kv_heads * hd;
  at::parallel_for(0, rows, std::max<int64_t>(1, GRAIN / width), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      bf16* row = qkv + r * width;
      for (int64_t h = 0; h < heads + kv_heads; ++h) rope_head(row + h * hd, cos + r * hd, sin + r * hd, hd);
      std::memcpy(k_cache + slots[r] * kv, row + heads * hd, kv * sizeof(bf16));
      std::memcpy(v_cache + slots[r] * kv, row + heads * hd + kv, kv * sizeof(bf16));
    }
  });
}

void decoder_layer_bf16(at::Tensor x, const at::Tensor& input_norm, const at::Tensor& post_norm,
                        const at::Tensor& qkv_packed, const c10::optional<at::Tensor>& qkv_bias,
                        const at::Tensor& o_packed, const c10::optional<at::Tensor>& o_bias,
                        const at::Tensor& gate_up_packed, const c10::optional<at::Tensor>& gate_up_bias,
                        const at::Tensor& down_packed, const c10::optional<at::Tensor>& down_bias,
                        const at::Tensor& cos, const at::Tensor& sin, at::Tensor k_cache, at::Tensor v_cache,
                        const at::Tensor& slot_mapping, const at::Tensor& block_tables,
                        const c10::optional<at::Tensor>& row_tables, const at::Tensor& context_lens,
                        int64_t num_heads, double eps, double scale) {
  TORCH_CHECK(linear_bf16_supported(), "decoder_layer_bf16: built without AVX512_BF16");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kBFloat16 && x.device().is_cpu(),
              "decoder_layer_bf16: x must be a contiguous (rows, hidden) bfloat16 CPU tensor");
  const int64_t rows = x.size(0), hidden = x.size(1);
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  v_cache.sizes() == k_cache.sizes() && k_cache.scalar_type() == at::kBFloat16 &&
                  v_cache.scalar_type() == at::kBFloat16,
              "decoder_layer_bf16: k_cache and v_cache must be one contiguous bfloat16 pool layer each");
  const int64_t kv_heads = k_cache.size(2), hd = k_cache.size(3);
  TORCH_CHECK(num_heads > 0 && num_heads % kv_heads == 0 && hd % 2 == 0 && hd <= 256 && hidden % 2 == 0,
              "decoder_layer_bf16: heads must be a multiple of kv heads, head_dim even and <= 256, hidden even");
  const int64_t q_dim = num_heads * hd, width = q_dim + 2 * kv_heads * hd;
  const int64_t half = 32 * gate_up_packed.size(0), inter = half;  // packed by halves: 32 columns of each per group
  for (const at::Tensor* t : {&input_norm, &post_norm})
    TORCH_CHECK(t->dim() == 1 && t->size(0) == hidden && t->is_contiguous() && t->scalar_type() == at::kBFloat16,
                "decoder_layer_bf16: the norm weights must be contiguous (hidden,) bfloat16");
  const Packed qkv{qkv_packed, qkv_bias, "qkv"}, o{o_packed, o_bias, "o_proj"},
      gate_up{gate_up_packed, gate_up_bias, "gate_up"}, down{down_packed, down_bias, "down_proj"};
  check_packed(qkv, hidden, width);
  check_packed(o, q_dim, hidden);
  check_packed(gate_up, hidden, 2 * inter);
  check_packed(down, inter, hidden);
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.numel() == rows * hd && sin.numel() == rows * hd &&
                  cos.scalar_type() == at::kBFloat16 && sin.scalar_type() == at::kBFloat16,
              "decoder_layer_bf16: cos/sin tables (rows, head_dim) in bfloat16");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous() && slot_mapping.numel() == rows,
              "decoder_layer_bf16: slot_mapping must be (rows,) int64");
  if (rows == 0) return;

  const auto opts = x.options();
  bf16* xp = x.data_ptr<bf16>();
  at::Tensor h = at::empty({rows, hidden}, opts);
  at::Tensor qkv_out = at::empty({rows, width}, opts);
  at::Tensor attn = at::empty({rows, num_heads, hd}, opts);
  at::Tensor act = at::empty({rows, inter}, opts);
  bf16* hp = h.data_ptr<bf16>();

  // Each stage is a scope torch.profiler shows by name (bench/profile_decode.py); off the profiler a
  // scope costs a flag check.
  {
    RECORD_USER_SCOPE("fused.input_norm");
    norm_rows(hp, xp, input_norm, rows, hidden, eps);
  }
  {
    RECORD_USER_SCOPE("fused.qkv_proj");
    linear(hp, hidden, rows, qkv, width, 0, qkv_out.data_ptr<bf16>(), width, Epilogue::kStore);
  }
  {
    RECORD_USER_SCOPE("fused.rope_kv_write");
    rope_and_store(qkv_out.data_ptr<bf16>(), rows, width, num_heads, kv_heads, hd, cos.data_ptr<bf16>(),
                   sin.data_ptr<bf16>(), k_cache.data_ptr<bf16>(), v_cache.data_ptr<bf16>(),
                   slot_mapping.data_ptr<int64_t>());
  }
  {
    RECORD_USER_SCOPE("fused.attention");
    paged_attention(attn, qkv_out.narrow(1, 0, q_dim).view({rows, num_heads, hd}), k_cache, v_cache, block_tables,
                    row_tables ? std::optional<at::Tensor>(*row_tables) : std::nullopt, context_lens, scale);
  }
  {
    RECORD_USER_SCOPE("fused.o_proj_residual");
    linear(attn.data_ptr<bf16>(), q_dim, rows, o, hidden, 0, xp, hidden, Epilogue::kAddInto);
  }
  {
    RECORD_USER_SCOPE("fused.post_norm");
    norm_rows(hp, xp, post_norm, rows, hidden, eps);
  }
  {
    RECORD_USER_SCOPE("fused.gate_up_silu");
    linear(hp, hidden, rows, gate_up, 2 * inter, half, act.data_ptr<bf16>(), inter, Epilogue::kSiluMul);
  }
  {
    RECORD_USER_SCOPE("fused.down_proj_residual");
    linear(act.data_ptr<bf16>(), inter, rows, down, hidden, 0, xp, hidden, Epilogue::kAddInto);
  }
}

}  // namespace
}  // namespace batchtop_cpu

TORCH_LIBRARY_FRAGMENT(batchtop_cpu, m) {
  m.def("decoder_layer_bf16(Tensor(a!) x, Tensor input_norm, Tensor post_norm, Tensor qkv, Tensor? qkv_bias, "
        "Tensor o, Tensor? o_bias, Tensor gate_up, Tensor? gate_up_bias, Tensor down, Tensor? down_bias, "
        "Tensor cos, Tensor sin, Tensor(b!) k_cache, Tensor(c!) v_cache, Tensor slot_mapping, Tensor block_tables, "
        "Tensor? row_tables, Tensor context_lens, int num_heads, float eps, float scale) -> ()");
  m.impl("decoder_layer_bf16", c10::DispatchKey::CPU, TORCH_FN(batchtop_cpu::decoder_layer_bf16));
}
