// One row of the fused elementwise ops (fused_ops_cpu.cpp), shared with the decoder-layer kernel so that
// both round exactly as Hugging Face's torch ops do.
#pragma once

#include <cmath>
#include <cstdint>

#include "cpu_vec.h"

namespace batchtop_cpu {

// out = w * dtype(x * rsqrt(mean(x^2) + eps))
template <typename T>
void rms_norm_row(T* out, const T* x, const T* w, int64_t n, float eps) {
  float sumsq = 0.f;
  int64_t i = 0;
#if defined(__AVX512F__)
  __m512 acc = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    const __m512 v = load16(x + i);
    acc = _mm512_fmadd_ps(v, v, acc);
  }
  sumsq = _mm512_reduce_add_ps(acc);
#elif defined(BATCHTOP_AVX2)
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 v = load8(x + i);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  sumsq = reduce_add8(acc);
#endif
  for (; i < n; ++i) sumsq += to_float(x[i]) * to_float(x[i]);
  const float inv = 1.f / std::sqrt(sumsq / static_cast<float>(n) + eps);
  i = 0;
#if defined(__AVX512F__)
  const __m512 vinv = _mm512_set1_ps(inv);
  for (; i + 16 <= n; i += 16) {
    const __m512 normed = round16<T>(_mm512_mul_ps(load16(x + i), vinv));  // rounded before the scale, as HF
    store16(out + i, _mm512_mul_ps(load16(w + i), normed));
  }
#elif defined(BATCHTOP_AVX2)
  const __m256 vinv = _mm256_set1_ps(inv);
  for (; i + 8 <= n; i += 8) {
    const __m256 normed = round8<T>(_mm256_mul_ps(load8(x + i), vinv));  // rounded before the scale, as HF
    store8(out + i, _mm256_mul_ps(load8(w + i), normed));
  }
#endif
  for (; i < n; ++i) store(out + i, to_float(w[i]) * round_to<T>(to_float(x[i]) * inv));
}

// One head of hd (even, <= 512) features rotated in place: v = dtype(dtype(v * cos) + rotate(v) * signed_sin)
template <typename T>
void rope_head(T* v, const T* cos, const T* signed_sin, int64_t hd) {
  float head[512];
  const int64_t half = hd / 2;
  for (int64_t d = 0; d < hd; ++d) head[d] = to_float(v[d]);
  for (int64_t d = 0; d < hd; ++d) {
    const float rotated = head[d < half ? d + half : d - half];
    store(v + d, round_to<T>(head[d] * to_float(cos[d])) + rotated * to_float(signed_sin[d]));
  }
}

// SiLU-and-mul of one row, out = silu(gate) * up, rounded where the torch ops round: fused_ops_cpu.cpp's
// silu_and_mul and linear_quant's kSiluMul epilogue both run it, so that epilogue is bitwise a store GEMM
// followed by that op.
template <typename T>
void silu_mul_row(T* o, const T* g, const T* u, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 one = _mm512_set1_ps(1.f);
  for (; i + 16 <= n; i += 16) {
    const __m512 x = load16(g + i);
    const __m512 act = round16<T>(_mm512_div_ps(x, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), x)))));
    store16(o + i, _mm512_mul_ps(act, load16(u + i)));
  }
#elif defined(BATCHTOP_AVX2)
  const __m256 one = _mm256_set1_ps(1.f);
  for (; i + 8 <= n; i += 8) {
    const __m256 x = load8(g + i);
    const __m256 act = round8<T>(_mm256_div_ps(x, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), x)))));
    store8(o + i, _mm256_mul_ps(act, load8(u + i)));
  }
#endif
  for (; i < n; ++i) {
    const float x = to_float(g[i]);
    store(o + i, round_to<T>(x / (1.f + std::exp(-x))) * to_float(u[i]));
  }
}

}  // namespace batchtop_cpu
