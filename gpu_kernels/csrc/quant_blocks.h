// GGUF block formats (ggml's Q4_0, Q4_1, Q8_0, Q4_K, Q6_K) read straight from a file's bytes, one 32-weight
// sub-block at a time, as the integer operands of a u8 x s8 dot product and the fp32 scales to apply to it.
//
// Every type is written as  w = scale * q + coef * offset  over a group of weights, with q a small
// unsigned integer, so that against an activation block quantized to int8 (x = dx * xq) the dot is
//   sum(w x) = dx * scale * sum(q xq)  +  coef * (OFFSET * dx * sum(xq))
// The first term is one VNNI dot (vpdpbusd: u8 q, s8 xq) per 32 weights; the second needs only the
// activation block's sum, computed once per row when the activations are quantized (the `corr` array of
// linear_quant_cpu.cpp), and a per-group coefficient of the weight, gathered into `coef` as the blocks
// are read and applied once per output element at the end.
//
// Layouts (gguf/quants.py's dequantizers, which mirror ggml's):
//   Q4_0 (18 B / 32): fp16 d, 16 B of nibbles: low nibble of byte i is weight i, high nibble weight i + 16;
//                     w = d (q - 8)
//   Q4_1 (20 B / 32): fp16 d, fp16 m, the same nibbles; w = d q + m
//   Q8_0 (34 B / 32): fp16 d, 32 int8; w = d q. On VNNI q + 128 is the u8 operand (the offset -128 is the
//                     correction); on AVX2 maddubs would saturate at 255 * 127 * 2, so there the dot takes
//                     |q| and the activation with q's sign instead, and no correction.
//   Q4_K (144 B / 256): fp16 d, fp16 dmin, 12 B of 6-bit scales and mins for 8 sub-blocks of 32, 128 B of
//                     nibbles: sub-block 2i is the low nibbles of bytes [32 i, 32 i + 32), 2i + 1 the high ones;
//                     w = d sc_j q - dmin m_j
//   Q6_K (210 B / 256): 128 B low nibbles ql, 64 B high 2-bit pairs qh, 16 int8 scales (one per 16 weights),
//                     fp16 d; weight e (h = e / 128, s = e % 128) has low bits ql[64 h + s % 64] >> 4 (s / 64)
//                     and high bits qh[32 h + s % 32] >> 2 (s / 32); w = d sc_{e / 16} (q - 32)
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define BATCHTOP_QUANT_VNNI 1
#endif
#if defined(BATCHTOP_QUANT_VNNI) || (defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#define BATCHTOP_QUANT 1
#endif

#if defined(BATCHTOP_QUANT)
namespace batchtop_cpu::quant {

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof h);
  return _cvtsh_ss(h);
}

inline __m256 half_broadcast(const uint8_t* p) {
  int16_t h;
  std::memcpy(&h, p, sizeof h);
  return _mm256_cvtph_ps(_mm_set1_epi16(h));
}

inline __m256i low_bits(__m256i v, int shift, int mask) {  // (v >> shift) & mask in every byte
  return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(shift)), _mm256_set1_epi8(static_cast<char>(mask)));
}

// 16 bytes of nibbles as 32 u8 weights in order: the low nibbles (weights 0-15) then the high ones (16-31).
inline __m256i nibbles(const uint8_t* p) {
  const __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_and_si256(_mm256_srlv_epi64(both, _mm256_set_epi64x(4, 4, 0, 0)), _mm256_set1_epi8(0x0F));
}

// sum over 4 consecutive bytes of u8 w times s8 x: 8 int32 lanes, lane i from bytes [4 i, 4 i + 4).
inline __m256i dot_u8s8(__m256i w, __m256i x) {
#if defined(BATCHTOP_QUANT_VNNI)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x);
#else  // w <= 63 in every caller, so the pair sums of maddubs (<= 2 * 63 * 127) do not saturate
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
#endif
}

#if defined(BATCHTOP_QUANT_VNNI)
// Two consecutive 32-weight blocks in one zmm (pair_* below): the first in the low 256 bits.
inline __m512i nibbles_pair(const uint8_t* p0, const uint8_t* p1) {
  const __m512i both = _mm512_inserti64x4(
      _mm512_castsi256_si512(_mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p0)))),
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p1))), 1);
  return _mm512_and_si512(_mm512_srlv_epi64(both, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0)), _mm512_set1_epi8(0x0F));
}

// fp16 d at p0 and at p1 as [d0 x 8 | d1 x 8]
inline __m512 halves_pair(const uint8_t* p0, const uint8_t* p1) {
  int16_t h0, h1;
  std::memcpy(&h0, p0, 2);
  std::memcpy(&h1, p1, 2);
  return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(h0)), _mm_set1_epi16(h1), 1));
}

inline void store_pair_lanes(float* coef, __m512 v) {  // lanes 0 and 8: the two blocks' values
  _mm_store_ss(coef, _mm512_castps512_ps128(v));
  _mm_store_ss(coef + 1, _mm512_extractf32x4_ps(v, 2));
}
#endif

// Each type: SUPER weights a block of BYTES bytes, read as SUPER / 32 sub-blocks; GROUP weights share a
// correction coefficient; OFFSET scales the activation sums the correction multiplies (0: none).
// head() reads a block's scales once (and writes its SUPER / GROUP coefficients to coef); sub() gives
// sub-block j's u8 weights and the fp32 scale of each of the dot's 8 lanes.
struct Q4_0 {
  static constexpr int ID = 2, SUPER = 32, BYTES = 18, GROUP = 32;
  static constexpr float OFFSET = -8.f;
  struct Head { __m256 d; };
  static Head head(const uint8_t* b, float* coef) {
    const __m256 d = half_broadcast(b);
    _mm_store_ss(coef, _mm256_castps256_ps128(d));
    return {d};
  }
  static void sub(const uint8_t* b, const Head& h, int, __m256i& q, __m256& scale) { q = nibbles(b + 2), scale = h.d; }
  static __m256i dot(__m256i q, __m256i x) { return dot_u8s8(q, x); }
#if defined(BATCHTOP_QUANT_VNNI)
  static void pair(const uint8_t* b, __m512i& q, __m512& scale, float* coef) {
    scale = halves_pair(b, b + BYTES);
    store_pair_lanes(coef, scale);
    q = nibbles_pair(b + 2, b + BYTES + 2);
  }
#endif
};

struct Q4_1 {
  static constexpr int ID = 3, SUPER = 32, BYTES = 20, GROUP = 32;
  static constexpr float OFFSET = 1.f;
  struct Head { __m256 d; };
  static Head head(const uint8_t* b, float* coef) {
    *coef = half_at(b + 2);
    return {half_broadcast(b)};
  }
  static void sub(const uint8_t* b, const Head& h, int, __m256i& q, __m256& scale) { q = nibbles(b + 4), scale = h.d; }
  static __m256i dot(__m256i q, __m256i x) { return dot_u8s8(q, x); }
#if defined(BATCHTOP_QUANT_VNNI)
  static void pair(const uint8_t* b, __m512i& q, __m512& scale, float* coef) {
    int32_t dm0, dm1;  // (d, m) of each block as one 32-bit lane, widened together: [d m d m .. | d1 m1 ..]
    std::memcpy(&dm0, b, 4);
    std::memcpy(&dm1, b + BYTES, 4);
    const __m512 dm = _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi32(dm0)),
                                                              _mm_set1_epi32(dm1), 1));
    scale = _mm512_permute_ps(dm, _MM_SHUFFLE(2, 2, 0, 0));
    store_pair_lanes(coef, _mm512_permute_ps(dm, _MM_SHUFFLE(3, 3, 1, 1)));
    q = nibbles_pair(b + 4, b + BYTES + 4);
  }
#endif
};

struct Q8_0 {
  static constexpr int ID = 8, SUPER = 32, BYTES = 34, GROUP = 32;
#if defined(BATCHTOP_QUANT_VNNI)
  static constexpr float OFFSET = -128.f;
#else
  static constexpr float OFFSET = 0.f;
#endif
  struct Head { __m256 d; };
  static Head head(const uint8_t* b, float* coef) {
    const __m256 d = half_broadcast(b);
    _mm_store_ss(coef, _mm256_castps256_ps128(d));
    return {d};
  }
  static void sub(const uint8_t* b, const Head& h, int, __m256i& q, __m256& scale) {
    q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
#if defined(BATCHTOP_QUANT_VNNI)
    q = _mm256_xor_si256(q, _mm256_set1_epi8(static_cast<char>(0x80)));  // q + 128 as u8
#endif
    scale = h.d;
  }
  static __m256i dot(__m256i q, __m256i x) {
#if defined(BATCHTOP_QUANT_VNNI)
    return dot_u8s8(q, x);
#else  // |q| <= 128 and |x| <= 127: the pair sums stay below 2^15
    const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(x, q));
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
#endif
  }
#if defined(BATCHTOP_QUANT_VNNI)
  static void pair(const uint8_t* b, __m512i& q, __m512& scale, float* coef) {
    scale = halves_pair(b, b + BYTES);
    store_pair_lanes(coef, scale);
    q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2))),
                           _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + BYTES + 2)), 1);
    q = _mm512_xor_si512(q, _mm512_set1_epi8(static_cast<char>(0x80)));  // q + 128 as u8
  }
#endif
};

struct Q4_K {
  static constexpr int ID = 12, SUPER = 256, BYTES = 144, GROUP = 32;
  static constexpr float OFFSET = -1.f;
  struct Head { float dsc[8]; };
  static Head head(const uint8_t* b, float* coef) {
    const float d = half_at(b), dmin = half_at(b + 2);
    const uint8_t* s = b + 4;  // sub-block j < 4: s[j], s[j + 4]; j >= 4: split over s[j + 4] and the top bits
    Head h;
    for (int j = 0; j < 8; ++j) {
      const int sc = j < 4 ? s[j] & 63 : (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
      const int m = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
      h.dsc[j] = d * static_cast<float>(sc);
      coef[j] = dmin * static_cast<float>(m);
    }
    return h;
  }
  static void sub(const uint8_t* b, const Head& h, int j, __m256i& q, __m256& scale) {
    q = low_bits(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + 32 * (j >> 1))), 4 * (j & 1), 0x0F);
    scale = _mm256_set1_ps(h.dsc[j]);
  }
  static __m256i dot(__m256i q, __m256i x) { return dot_u8s8(q, x); }
};

struct Q6_K {
  static constexpr int ID = 14, SUPER = 256, BYTES = 210, GROUP = 16;
  static constexpr float OFFSET = -32.f;
  struct Head { float dsc[16]; };
  static Head head(const uint8_t* b, float* coef) {
    const float d = half_at(b + 208);
    Head h;
    for (int i = 0; i < 16; ++i) coef[i] = h.dsc[i] = d * static_cast<float>(static_cast<int8_t>(b[192 + i]));
    return h;
  }
  static void sub(const uint8_t* b, const Head& h, int j, __m256i& q, __m256& scale) {
    const int half = j >> 2, quarter = j & 3;
    const __m256i lo = low_bits(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * half + 32 * (quarter & 1))),
                                4 * (quarter >> 1), 0x0F);
    const __m256i hi = low_bits(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * half)), 2 * quarter, 3);
    q = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
    // lanes 0-3 are weights 0-15 of the sub-block, lanes 4-7 weights 16-31: one int8 scale each
    scale = _mm256_set_m128(_mm_set1_ps(h.dsc[2 * j + 1]), _mm_set1_ps(h.dsc[2 * j]));
  }
  static __m256i dot(__m256i q, __m256i x) { return dot_u8s8(q, x); }
};

}  // namespace batchtop_cpu::quant
#endif
