// The torch schemas of every op in ops_cpu.h, and the DecoderStack class: the one source that includes
// torch/library.h. The Python side calls them as torch.ops.batchtop_cpu.<name> and
// torch.classes.batchtop_cpu.DecoderStack (gpu_kernels/cpu_kernels.py).
#include <torch/custom_class.h>
#include <torch/library.h>

#include "decoder_stack.h"
#include "ops_cpu.h"

TORCH_LIBRARY(batchtop_cpu, m) {
  using namespace batchtop_cpu;
  m.def("paged_attention(Tensor(a!) out, Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor? row_tables, Tensor context_lens, float scale) -> ()");
  m.def("rms_norm(Tensor(a!) out, Tensor x, Tensor weight, float eps) -> ()");
  m.def("add_rms_norm(Tensor(a!) residual, Tensor x, Tensor(b!) out, Tensor weight, float eps) -> ()");
  m.def("silu_and_mul(Tensor(a!) out, Tensor gate_up) -> ()");
  m.def("rope(Tensor(a!) x, Tensor cos, Tensor signed_sin) -> ()");
  m.def("norm_head_quant(Tensor(a!) logits, Tensor x, Tensor rows, Tensor norm_weight, float eps, Tensor head, "
        "int qtype) -> ()");
  m.def("sample(Tensor(a!) tokens, Tensor logits, Tensor temperature, Tensor top_p, Tensor seed_lo, "
        "Tensor seed_hi, Tensor counter) -> ()");
  m.def("argmax(Tensor(a!) tokens, Tensor logits) -> ()");
  m.def("pack_linear_bf16(Tensor weight) -> Tensor");
  m.def("linear_bf16(Tensor(a!) out, Tensor x, Tensor packed, Tensor? bias, int half=0, int epilogue=0) -> ()");
  m.def("linear_bf16_supported() -> bool", &linear_bf16_supported);
  m.def("linear_quant(Tensor(a!) out, Tensor x, Tensor blocks, int qtype, Tensor? bias, int epilogue=0) -> ()");
  m.def("linear_quant_supported(int qtype) -> bool", &linear_quant_supported);
  m.def("pack_linear_quant(Tensor blocks, int qtype) -> Tensor");
  m.def("quant_embedding(Tensor(a!) out, Tensor blocks, Tensor ids, int qtype) -> ()");
  m.def("decoder_layers_bf16(Tensor(a!) x, Tensor?[] weights, Tensor(b!)[] k_caches, Tensor(c!)[] v_caches, "
        "Tensor cos, Tensor sin, Tensor slot_mapping, Tensor block_tables, Tensor? row_tables, Tensor context_lens, "
        "int num_heads, float eps, float scale, int[] linear_types=[]) -> ()");
  m.class_<DecoderStack>("DecoderStack")
      .def(torch::init<c10::List<c10::optional<at::Tensor>>, std::vector<int64_t>, int64_t, int64_t, int64_t,
                       double, double, std::vector<at::Tensor>>())
      .def("run", &DecoderStack::run);

  m.impl("paged_attention", c10::DispatchKey::CPU, TORCH_FN(paged_attention));
  m.impl("rms_norm", c10::DispatchKey::CPU, TORCH_FN(rms_norm));
  m.impl("add_rms_norm", c10::DispatchKey::CPU, TORCH_FN(add_rms_norm));
  m.impl("silu_and_mul", c10::DispatchKey::CPU, TORCH_FN(silu_and_mul));
  m.impl("rope", c10::DispatchKey::CPU, TORCH_FN(rope));
  m.impl("norm_head_quant", c10::DispatchKey::CPU, TORCH_FN(norm_head_quant));
  m.impl("sample", c10::DispatchKey::CPU, TORCH_FN(sample));
  m.impl("argmax", c10::DispatchKey::CPU, TORCH_FN(argmax));
  m.impl("pack_linear_bf16", c10::DispatchKey::CPU, TORCH_FN(pack_linear_bf16));
  m.impl("linear_bf16", c10::DispatchKey::CPU, TORCH_FN(linear_bf16));
  m.impl("linear_quant", c10::DispatchKey::CPU, TORCH_FN(linear_quant));
  m.impl("pack_linear_quant", c10::DispatchKey::CPU, TORCH_FN(pack_linear_quant));
  m.impl("quant_embedding", c10::DispatchKey::CPU, TORCH_FN(quant_embedding));
  m.impl("decoder_layers_bf16", c10::DispatchKey::CPU, TORCH_FN(decoder_layers_bf16));
}
