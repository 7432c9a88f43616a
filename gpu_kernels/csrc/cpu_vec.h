// Helpers shared by the CPU kernels: bf16 <-> fp32 as torch rounds it (scalar, AVX-512, and AVX2 where
// there is no AVX-512), exp, lane sums, and the dispatch on a tensor's dtype.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace batchtop_cpu {

inline float to_float(float x) { return x; }
inline float to_float(c10::BFloat16 x) {
  uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline void store(float* dst, float x) { *dst = x; }
inline void store(c10::BFloat16* dst, float x) { *dst = c10::BFloat16(x); }  // round to nearest even

template <typename T>
inline float round_to(float x) {  // what storing x as a T and reading it back gives
  T t;
  store(&t, x);
  return to_float(t);
}

// f(T{}) with T the tensor's element type, float or c10::BFloat16; any other dtype fails with `refusal`.
template <typename F>
void by_dtype(const at::Tensor& t, const char* refusal, F&& f) {
  if (t.scalar_type() == at::kFloat) return f(float{});
  TORCH_CHECK(t.scalar_type() == at::kBFloat16, refusal);
  f(c10::BFloat16{});
}

#if defined(__AVX512F__)
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::BFloat16* p) {
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline void store16(float* p, __m512 x) { _mm512_storeu_ps(p, x); }
inline void store16(c10::BFloat16* p, __m512 x) {  // round to nearest even, as c10::BFloat16(float)
  __m512i bits = _mm512_castps_si512(x);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  bits = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(_mm512_srli_epi32(bits, 16)));
}

template <typename T>
inline __m512 round16(__m512 x) {  // round_to for 16 lanes
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    alignas(64) T tmp[16];
    store16(tmp, x);
    return load16(tmp);
  }
}

// exp(x): 2^(x log2 e), split into 2^n 2^f with a degree-6 polynomial on f in [-0.5, 0.5]; relative
// error ~2e-7, below fp32 rounding of the ops around it. Below -87 it is ~0, above 88 it overflows to inf.
inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.f)), _mm512_set1_ps(89.f));
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_mul_ps(_mm512_sub_ps(t, n), _mm512_set1_ps(0.693147180559945309f));
  __m512 p = _mm512_set1_ps(1.f / 720);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 120));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 24));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 6));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}
#endif

// The same helpers on 8 lanes, for AVX2 + FMA. BATCHTOP_AVX2 marks the CPUs without AVX-512 (Zen 2/3,
// Haswell to Alder Lake), where the kernels' 8-lane paths run instead of the 16-lane ones.
#if defined(__AVX2__) && defined(__FMA__)
#if !defined(__AVX512F__)
#define BATCHTOP_AVX2 1
#endif
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::BFloat16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline void store8(float* p, __m256 x) { _mm256_storeu_ps(p, x); }
inline void store8(c10::BFloat16* p, __m256 x) {  // round to nearest even, as c10::BFloat16(float)
  __m256i bits = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  bits = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}

template <typename T>
inline __m256 round8(__m256 x) {  // round_to for 8 lanes
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    alignas(32) T tmp[8];
    store8(tmp, x);
    return load8(tmp);
  }
}

inline float reduce_add8(__m256 x) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
inline float reduce_max8(__m256 x) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

// exp16's polynomial on 8 lanes; 2^n is built in the exponent field (no scalef on AVX2), so x is
// clamped to [-87, 88], where n stays in the normal range: exp(88) = 1.65e38 stands in for overflow.
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.f)), _mm256_set1_ps(88.f));
  const __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f));
  const __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_mul_ps(_mm256_sub_ps(t, n), _mm256_set1_ps(0.693147180559945309f));
  __m256 p = _mm256_set1_ps(1.f / 720);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.f / 120));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.f / 24));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.f / 6));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.f));
  const __m256i two_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(two_n));
}
#endif

}  // namespace batchtop_cpu
