// The decoder layer's elementwise work as single passes for the CPU, each with Hugging Face's rounding:
// every intermediate torch would store in the model dtype is rounded to it here too.
//   rms_norm:      out = w * dtype(x * rsqrt(mean(x^2) + eps))
//   add_rms_norm:  residual = dtype(residual + x), then out = rms_norm(residual)   (residual in place)
//   silu_and_mul:  out = dtype(dtype(silu(gate)) * up) over gate_up = [gate | up]
//   rope:          x = dtype(dtype(x * cos) + rotate(x) * signed_sin) per head, in place
// At decode sizes each torch op costs more in dispatch than in arithmetic; one pass also reads and
// writes each tensor once instead of once per op.

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <cmath>
#include <cstdint>

#include "cpu_vec.h"
#include "fused_rows.h"
#include "ops_cpu.h"

namespace batchtop_cpu {
namespace {

constexpr int64_t GRAIN = 1 << 14;  // elements per parallel task: small tensors stay on one thread

template <typename T>
void rms_norm_impl(at::Tensor& out, at::Tensor& x, const at::Tensor& w, double eps, const at::Tensor* added) {
  const int64_t n = x.size(-1), rows = x.numel() / n;
  T* op = out.data_ptr<T>();
  T* xp = x.data_ptr<T>();
  const T* wp = w.data_ptr<T>();
  const T* rp = added ? added->data_ptr<T>() : nullptr;  // added into x first, when given
  at::parallel_for(0, rows, std::max<int64_t>(1, GRAIN / n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      T* row = xp + r * n;
      if (rp) {
        const T* other = rp + r * n;
        int64_t i = 0;
#if defined(__AVX512F__)
        for (; i + 16 <= n; i += 16) store16(row + i, _mm512_add_ps(load16(row + i), load16(other + i)));
#elif defined(BATCHTOP_AVX2)
        for (; i + 8 <= n; i += 8) store8(row + i, _mm256_add_ps(load8(row + i), load8(other + i)));
#endif
        for (; i < n; ++i) store(row + i, to_float(row[i]) + to_float(other[i]));
      }
      rms_norm_row(op + r * n, row, wp, n, static_cast<float>(eps));
    }
  });
}

void check_rows(const at::Tensor& t, const at::Tensor& like, const char* what) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous() && t.scalar_type() == like.scalar_type() &&
              t.sizes() == like.sizes(), what, ": a contiguous CPU tensor shaped and typed like the input");
}

template <typename T>
void silu_and_mul_impl(at::Tensor& out, const at::Tensor& gate_up) {
  const int64_t n = out.size(-1), rows = out.numel() / n;
  T* op = out.data_ptr<T>();
  const T* gp = gate_up.data_ptr<T>();
  at::parallel_for(0, rows, std::max<int64_t>(1, GRAIN / n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* g = gp + r * 2 * n;
      const T* u = g + n;
      silu_mul_row(op + r * n, g, u, n);
    }
  });
}

template <typename T>
void rope_impl(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t rows = x.size(0), heads = x.size(1), hd = x.size(2);
  const int64_t row_stride = x.stride(0), head_stride = x.stride(1);
  T* xp = x.data_ptr<T>();
  const T* cp = cos.data_ptr<T>();
  const T* sp = sin.data_ptr<T>();
  at::parallel_for(0, rows, std::max<int64_t>(1, GRAIN / (heads * hd)), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      for (int64_t h = 0; h < heads; ++h) rope_head(xp + r * row_stride + h * head_stride, cp + r * hd, sp + r * hd, hd);
  });
}

}  // namespace

void rms_norm(at::Tensor out, at::Tensor x, const at::Tensor& weight, double eps) {
  check_rows(out, x, "rms_norm out");
  check_rows(x, x, "rms_norm x");
  TORCH_CHECK(weight.is_contiguous() && weight.numel() == x.size(-1) && weight.scalar_type() == x.scalar_type(),
              "rms_norm: weight must be (hidden,) in the input's dtype");
  by_dtype(x, "rms_norm: float32 or bfloat16 only",
           [&](auto t) { rms_norm_impl<decltype(t)>(out, x, weight, eps, nullptr); });
}

// residual += x (rounded), then out = rms_norm(residual)
void add_rms_norm(at::Tensor residual, const at::Tensor& x, at::Tensor out, const at::Tensor& weight, double eps) {
  check_rows(residual, x, "add_rms_norm residual");
  check_rows(out, x, "add_rms_norm out");
  check_rows(x, x, "add_rms_norm x");
  TORCH_CHECK(weight.is_contiguous() && weight.numel() == x.size(-1) && weight.scalar_type() == x.scalar_type(),
              "add_rms_norm: weight must be (hidden,) in the input's dtype");
  by_dtype(x, "add_rms_norm: float32 or bfloat16 only",
           [&](auto t) { rms_norm_impl<decltype(t)>(out, residual, weight, eps, &x); });
}

void silu_and_mul(at::Tensor out, const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.device().is_cpu() && gate_up.is_contiguous() && out.is_contiguous() &&
              gate_up.scalar_type() == out.scalar_type() && gate_up.size(-1) == 2 * out.size(-1) &&
              gate_up.numel() == 2 * out.numel(), "silu_and_mul: out (rows, n), gate_up (rows, 2n), contiguous");
  by_dtype(out, "silu_and_mul: float32 or bfloat16 only",
           [&](auto t) { silu_and_mul_impl<decltype(t)>(out, gate_up); });
}

// x: (rows, heads, head_dim) with a contiguous last dim, rotated in place; cos, signed_sin: (rows, head_dim)
void rope(at::Tensor x, const at::Tensor& cos, const at::Tensor& signed_sin) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 3 && x.stride(2) == 1 && x.size(2) % 2 == 0 && x.size(2) <= 512,
              "rope: x (rows, heads, even head_dim <= 512) with a contiguous last dim");
  TORCH_CHECK(cos.is_contiguous() && signed_sin.is_contiguous() && cos.numel() == x.size(0) * x.size(2) &&
              signed_sin.numel() == cos.numel() && cos.scalar_type() == x.scalar_type() &&
              signed_sin.scalar_type() == x.scalar_type(), "rope: cos/sin tables (rows, head_dim) in x's dtype");
  by_dtype(x, "rope: float32 or bfloat16 only", [&](auto t) { rope_impl<decltype(t)>(x, cos, signed_sin); });
}

// A step's tail in one call: logits (S, N) = rms_norm(x[rows]) W^T for a GGUF lm_head W (head: its blocks,
// or its pack where linear_quant reads one), each row normed as rms_norm and multiplied as linear_quant
// do it. Python's index_select, RMSNorm and QuantLinear around those two ops cost ~0.1 ms of a SmolLM2
// decode step, their caches cold after the step's weights went through.
void norm_head_quant(at::Tensor& logits, const at::Tensor& x, const at::Tensor& rows, const at::Tensor& norm_weight,
                     double eps, const at::Tensor& head, int64_t qtype) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.device().is_cpu() &&
                  (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat),
              "norm_head_quant: x must be a contiguous (T, hidden) bfloat16 or float32 CPU tensor");
  TORCH_CHECK(rows.dim() == 1 && rows.scalar_type() == at::kLong && rows.is_contiguous(),
              "norm_head_quant: rows must be (S,) int64");
  const int64_t t = x.size(0), hidden = x.size(1), s = rows.size(0);
  TORCH_CHECK(norm_weight.is_contiguous() && norm_weight.numel() == hidden && norm_weight.scalar_type() == x.scalar_type(),
              "norm_head_quant: norm_weight must be (hidden,) in x's dtype");
  const int64_t* r = rows.data_ptr<int64_t>();
  for (int64_t i = 0; i < s; ++i)
    TORCH_CHECK(r[i] >= 0 && r[i] < t, "norm_head_quant: row ", r[i], " is outside x's ", t, " rows");
  at::Tensor normed = at::empty({s, hidden}, x.options());
  by_dtype(x, "norm_head_quant: float32 or bfloat16 only", [&](auto zero) {
    using T = decltype(zero);
    const T* xp = x.data_ptr<T>();
    const T* wp = norm_weight.data_ptr<T>();
    T* np = normed.data_ptr<T>();
    for (int64_t i = 0; i < s; ++i) rms_norm_row(np + i * hidden, xp + r[i] * hidden, wp, hidden, static_cast<float>(eps));
  });
  linear_quant(logits, normed, head, qtype, c10::nullopt, 0);
}

}  // namespace batchtop_cpu
