// SIMD helpers shared by neuronpack's kernels (linear.cpp, attention.cpp): AVX-512 only (NEURONPACK_AVX512).
#pragma once

#include <cstdint>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define NEURONPACK_AVX512 1
#include <immintrin.h>
#endif

#ifdef NEURONPACK_AVX512
namespace neuronpack_simd {

// Weight element types: load 16 elements as 16 float32 lanes (all, or the first `mask` ones).
struct F32 {
  using T = float;
  static __m512 load(const T* p) { return _mm512_loadu_ps(p); }
  static __m512 load(const T* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
};
struct BF16 {  // bfloat16 is the top half of a float32
  using T = uint16_t;
  static __m512 widen(__m256i v) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16)); }
  static __m512 load(const T* p) { return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static __m512 load(const T* p, __mmask16 m) { return widen(_mm256_maskz_loadu_epi16(m, p)); }
};
// The first min(left, 16) lanes.
inline __mmask16 tail_mask16(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
}

// The first min(left, 32) lanes (16-bit lanes, bytes of 32).
inline __mmask32 tail_mask32(int64_t left) {
  return left >= 32 ? static_cast<__mmask32>(0xFFFFFFFFu) : static_cast<__mmask32>((1u << left) - 1);
}

// max|x| over x [K]; inf when x holds an inf, NaN when it holds a NaN (vmaxps alone would drop a NaN: it returns its
// second operand when either is one).
inline float abs_max(const float* x, int64_t K) {
  __m512 amax = _mm512_setzero_ps();
  __mmask16 nan = 0;
  for (int64_t k = 0; k < K; k += 16) {
    const __m512 v = _mm512_abs_ps(_mm512_maskz_loadu_ps(tail_mask16(K - k), x + k));
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    amax = _mm512_max_ps(amax, v);
  }
  return nan ? __builtin_nanf("") : _mm512_reduce_max_ps(amax);
}

// Lane i of the result = the sum of v[i]'s 16 lanes: a tree of 45 shuffles and adds where 16 separate reductions
// take ~130 instructions (with 8 rows of x and two weight rows they cost ~15% of the FMAs of a 576-long row).
inline __m512 sum16(const __m512 v[16]) {
  __m512 t[8], u[4];
  for (int i = 0; i < 8; ++i)  // per 128-bit lane: [v2i: l0+l2, v2i+1: l0+l2, v2i: l1+l3, v2i+1: l1+l3]
    t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i)  // per 128-bit lane: partial sums of v4i .. v4i+3
    u[i] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * i], t[2 * i + 1], 0x44), _mm512_shuffle_ps(t[2 * i], t[2 * i + 1], 0xEE));
  // pairs of 128-bit lanes added: w0 = [v0-3 (l0+l1), v0-3 (l2+l3), v4-7 (l0+l1), v4-7 (l2+l3)], w1 for v8-15
  const __m512 w0 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88), _mm512_shuffle_f32x4(u[0], u[1], 0xDD));
  const __m512 w1 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x88), _mm512_shuffle_f32x4(u[2], u[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(w0, w1, 0x88), _mm512_shuffle_f32x4(w0, w1, 0xDD));
}

// 16 float32 lanes rounded to bfloat16 as c10::BFloat16 does (round to nearest even, NaN to 0x7fc0): the 16-bit
// patterns, one per 32-bit lane; ``round_bf16``: the same values as float32.
inline __m512i bf16_bits(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF),
                                                         _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
  return _mm512_mask_mov_epi32(_mm512_srli_epi32(r, 16), _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
}
inline __m512 round_bf16(__m512 v) { return _mm512_castsi512_ps(_mm512_slli_epi32(bf16_bits(v), 16)); }
}  // namespace neuronpack_simd
#endif  // NEURONPACK_AVX512
