// The dot products of neuronpack's routed experts (moe.cpp): two weight rows of one expert against up to 8 rows of
// x, each weight byte read once and used for every row while it is in the registers. AVX-512 only.
//
// Weight formats: float32, bfloat16 and int8 widened to float32 lanes against float32 rows of x (int8's per-channel
// scale is the caller's); bfloat16 against bfloat16 rows through vdpbf16ps (CPUs with AVX512_BF16); MXFP4 (OCP
// microscaling: blocks of 32 FP4 E2M1 values, two per byte with the lower-indexed one in the low nibble, and one E8M0
// scale byte per block, 2^(s - 127)) looked up in registers (vpermps over the 16 FP4 values times the block's scale)
// against float32 rows of x stored block-permuted: in each block of 32, the even elements then the odd ones
// (``fp4_permute``), so a byte's low nibbles meet the first 16 lanes and its high nibbles the next 16.
#pragma once

#include <algorithm>
#include <cstdint>

#include "simd.h"

namespace neuronpack_moe {

// FP4 E2M1 values by code (sign in bit 3), and E8M0 scales by byte (255: NaN).
alignas(64) inline const float kFp4[16] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f,
                                           -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

inline const float* e8m0_table() {
  static const auto table = [] {
    struct T { float v[256]; } t{};
    for (int s = 0; s < 255; ++s) t.v[s] = __builtin_ldexpf(1.f, s - 127);
    t.v[255] = __builtin_nanf("");
    return t;
  }();
  return table.v;
}

}  // namespace neuronpack_moe

#ifdef NEURONPACK_AVX512
namespace neuronpack_moe {

using namespace neuronpack_simd;

#define NEURONPACK_MOE_BF16_TARGET __attribute__((target("avx512bf16,avx512bw,avx512vl,avx512f")))

struct I8 {  // int8 weights widened to float32 lanes (the per-channel scale is applied to the sums)
  using T = int8_t;
  static __m512 widen(__m128i v) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v)); }
  static __m512 load(const T* p) { return widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static __m512 load(const T* p, __mmask16 m) { return widen(_mm_maskz_loadu_epi8(m, p)); }
};

// s0[m] = w0 . x[m], s1[m] = w1 . x[m] for MB rows of float32 x (rows ld apart), K elements; W: F32, BF16 or I8.
// One row of x gets two accumulators per weight row (independent FMA chains while the two streams load).
template <class W, int MB>
void dot2(const typename W::T* w0, const typename W::T* w1, const float* x, int64_t ld, int64_t K, float* s0,
          float* s1) {
  constexpr int U = MB == 1 ? 2 : 1;
  __m512 a[MB][U], b[MB][U];
  for (int m = 0; m < MB; ++m)
    for (int u = 0; u < U; ++u) a[m][u] = b[m][u] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 * U <= K; k += 16 * U)
    for (int u = 0; u < U; ++u) {
      const __m512 v0 = W::load(w0 + k + 16 * u), v1 = W::load(w1 + k + 16 * u);
      for (int m = 0; m < MB; ++m) {
        __m512 xv = _mm512_loadu_ps(x + m * ld + k + 16 * u);
        __asm__("" : "+v"(xv));  // one load of x for both FMAs
        a[m][u] = _mm512_fmadd_ps(v0, xv, a[m][u]);
        b[m][u] = _mm512_fmadd_ps(v1, xv, b[m][u]);
      }
    }
  for (; k < K; k += 16) {
    const __mmask16 mask = tail_mask16(K - k);
    const __m512 v0 = W::load(w0 + k, mask), v1 = W::load(w1 + k, mask);
    for (int m = 0; m < MB; ++m) {
      const __m512 xv = _mm512_maskz_loadu_ps(mask, x + m * ld + k);
      a[m][0] = _mm512_fmadd_ps(v0, xv, a[m][0]);
      b[m][0] = _mm512_fmadd_ps(v1, xv, b[m][0]);
    }
  }
  for (int m = 0; m < MB; ++m) {
    __m512 sa = a[m][0], sb = b[m][0];
    for (int u = 1; u < U; ++u) sa = _mm512_add_ps(sa, a[m][u]), sb = _mm512_add_ps(sb, b[m][u]);
    s0[m] = _mm512_reduce_add_ps(sa);
    s1[m] = _mm512_reduce_add_ps(sb);
  }
}

// The same for MXFP4 rows (w: K / 2 bytes, e: K / 32 scales) against block-permuted float32 rows of x.
template <int MB>
void dot2_fp4(const uint8_t* w0, const uint8_t* e0, const uint8_t* w1, const uint8_t* e1, const float* x,
              int64_t ld, int64_t K, float* s0, float* s1) {
  const __m512 lut = _mm512_load_ps(kFp4);
  const float* scale = e8m0_table();
  __m512 a[MB], b[MB];
  for (int m = 0; m < MB; ++m) a[m] = b[m] = _mm512_setzero_ps();
  for (int64_t blk = 0; blk < K / 32; ++blk) {
    // 16 bytes, one per lane: the low nibble indexes the table as it is (vpermps reads 4 bits), the high one shifted
    const __m512i v0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w0 + 16 * blk)));
    const __m512i v1 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w1 + 16 * blk)));
    const __m512 t0 = _mm512_mul_ps(lut, _mm512_set1_ps(scale[e0[blk]]));  // the block's values, scaled: exact
    const __m512 t1 = _mm512_mul_ps(lut, _mm512_set1_ps(scale[e1[blk]]));
    const __m512 lo0 = _mm512_permutexvar_ps(v0, t0), hi0 = _mm512_permutexvar_ps(_mm512_srli_epi32(v0, 4), t0);
    const __m512 lo1 = _mm512_permutexvar_ps(v1, t1), hi1 = _mm512_permutexvar_ps(_mm512_srli_epi32(v1, 4), t1);
    for (int m = 0; m < MB; ++m) {
      const float* xb = x + m * ld + 32 * blk;
      __m512 xe = _mm512_loadu_ps(xb), xo = _mm512_loadu_ps(xb + 16);
      __asm__("" : "+v"(xe), "+v"(xo));
      a[m] = _mm512_fmadd_ps(lo0, xe, _mm512_fmadd_ps(hi0, xo, a[m]));
      b[m] = _mm512_fmadd_ps(lo1, xe, _mm512_fmadd_ps(hi1, xo, b[m]));
    }
  }
  for (int m = 0; m < MB; ++m) {
    s0[m] = _mm512_reduce_add_ps(a[m]);
    s1[m] = _mm512_reduce_add_ps(b[m]);
  }
}

// bfloat16 weights against bfloat16 rows of x through vdpbf16ps (32 products per instruction, summed in float32;
// products of two bfloat16 are exact in float32).
template <int MB>
NEURONPACK_MOE_BF16_TARGET void dot2_bf16(const uint16_t* w0, const uint16_t* w1, const uint16_t* x, int64_t ld,
                                          int64_t K, float* s0, float* s1) {
  __m512 a[MB], b[MB];
  for (int m = 0; m < MB; ++m) a[m] = b[m] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    const __m512bh v0 = (__m512bh)_mm512_loadu_si512(w0 + k), v1 = (__m512bh)_mm512_loadu_si512(w1 + k);
    for (int m = 0; m < MB; ++m) {
      __m512i xv = _mm512_loadu_si512(x + m * ld + k);
      __asm__("" : "+v"(xv));
      a[m] = _mm512_dpbf16_ps(a[m], (__m512bh)xv, v0);
      b[m] = _mm512_dpbf16_ps(b[m], (__m512bh)xv, v1);
    }
  }
  if (k < K) {
    const __mmask32 mask = tail_mask32(K - k);
    const __m512bh v0 = (__m512bh)_mm512_maskz_loadu_epi16(mask, w0 + k);
    const __m512bh v1 = (__m512bh)_mm512_maskz_loadu_epi16(mask, w1 + k);
    for (int m = 0; m < MB; ++m) {
      const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mask, x + m * ld + k);
      a[m] = _mm512_dpbf16_ps(a[m], xv, v0);
      b[m] = _mm512_dpbf16_ps(b[m], xv, v1);
    }
  }
  for (int m = 0; m < MB; ++m) {
    s0[m] = _mm512_reduce_add_ps(a[m]);
    s1[m] = _mm512_reduce_add_ps(b[m]);
  }
}

// -- MXFP4 against rows of x rounded to 16 bits (AVX512_VNNI, AVX512_VBMI) ----------------------------------------
//
// The float32 lookup above spends 8 instructions per 16 weight bytes, half of them shuffles, and reads ~12 GB/s on
// one core (Zen 4), half the read bandwidth. Here 64 bytes (4 blocks) at a time: each nibble becomes the byte
// w' = 2 * value + 12 (0..24: FP4 values times 2 are the integers 0, 1, 2, 3, 4, 6, 8, 12 and their negatives)
// through one vpermb, and x, rounded to integers q of 16 bits per row (x ~ step * q, |q| <= 32639; an error of at most
// max|x| / 65278 per element, about int8_rows.cpp's bound), meets them as two signed byte digits (q = d0 + 256 d1)
// through vpdpbusd: per lane (4 bytes of one block) w . q = w' . d0 + 256 (w' . d1) - 12 sum(q), exact in int32, with
// 12 sum(q) computed once per row of x; each block's sum is then scaled by its E8M0 scale in float32 (one FMA for 4
// blocks). x per group of 4 blocks (``fp4_digits``): 64 bytes of d0 of the even elements (byte i: element 2 (i % 16)
// of block i / 16), d1 of the even ones, d0 of the odd ones, d1 of the odd ones, then 16 int32 of 12 sum(q) per lane;
// zero padded (q = 0) to whole groups.

#define NEURONPACK_MOE_VNNI_TARGET __attribute__((target("avx512vnni,avx512vbmi,avx512bw,avx512vl,avx512f")))

constexpr int64_t kDigitGroupBytes = 320;  // a group's digits (4 x 64 bytes) and its 16 lane sums
constexpr int32_t kFp4Offset = 12;         // w' = 2 * value + 12

// 2 * the FP4 values + 12, by code, four times over: vpermb reads 6 index bits, and bits 4-5 of a byte (or of a
// 16-bit lane shifted by 4) belong to another nibble.
alignas(64) inline const uint8_t kFp4Unsigned[64] = {
    12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0, 12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,
    12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0, 12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};

// The E8M0 scales of up to 16 blocks (the first ``n``) as float32 lanes: the exponent field itself, 2^-127 for 0, NaN
// for 255.
inline __m512 e8m0_lanes(const uint8_t* s, int64_t n) {
  const __m512i v = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(tail_mask16(n), s));
  __m512 f = _mm512_castsi512_ps(_mm512_slli_epi32(v, 23));
  f = _mm512_mask_mov_ps(f, _mm512_cmpeq_epi32_mask(v, _mm512_setzero_si512()), _mm512_set1_ps(0x1p-127f));
  return _mm512_mask_mov_ps(f, _mm512_cmpeq_epi32_mask(v, _mm512_set1_epi32(255)), _mm512_set1_ps(__builtin_nanf("")));
}

// Per lane (4 bytes of one block): w . q as float32, from the weights w' of the low (lo) and high (hi) nibbles and a
// group of digits d (see above).
NEURONPACK_MOE_VNNI_TARGET inline __m512 fp4_block_sums(const uint8_t* d, __m512i lo, __m512i hi) {
  const __m512i z = _mm512_setzero_si512();
  const __m512i d0 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, lo, _mm512_loadu_si512(d)), hi,
                                         _mm512_loadu_si512(d + 128));
  const __m512i d1 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, lo, _mm512_loadu_si512(d + 64)), hi,
                                         _mm512_loadu_si512(d + 192));
  const __m512i sums = _mm512_add_epi32(d0, _mm512_slli_epi32(d1, 8));
  return _mm512_cvtepi32_ps(_mm512_sub_epi32(sums, _mm512_loadu_si512(d + 256)));
}

// s0[m] = step[m] / 2 * (w0 . q[m]) (and s1 of w1): MXFP4 rows (w: K / 2 bytes, e: K / 32 scales) against MB rows
// of digits (``fp4_digits``, rows ld bytes apart).
template <int MB>
NEURONPACK_MOE_VNNI_TARGET void dot2_fp4_digits(const uint8_t* w0, const uint8_t* e0, const uint8_t* w1,
                                                const uint8_t* e1, const uint8_t* x, int64_t ld, int64_t K,
                                                const float* step, float* s0, float* s1) {
  const __m512i lut = _mm512_load_si512(kFp4Unsigned);
  const __m512i quarter = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);  // lane -> its block
  const int64_t blocks = K / 32, groups = (blocks + 3) / 4;
  __m512 a[MB], b[MB];
  for (int m = 0; m < MB; ++m) a[m] = b[m] = _mm512_setzero_ps();
  for (int64_t g0 = 0; g0 < groups; g0 += 4) {  // 4 groups share one load of 16 scales
    const __m512 sc0 = e8m0_lanes(e0 + 4 * g0, blocks - 4 * g0), sc1 = e8m0_lanes(e1 + 4 * g0, blocks - 4 * g0);
    for (int64_t g = g0; g < std::min(groups, g0 + 4); ++g) {
      const int64_t bytes = std::min<int64_t>(64, 16 * (blocks - 4 * g));
      const __mmask64 mask = bytes == 64 ? ~0ULL : (1ULL << bytes) - 1;  // a partial group: w' = 0 past its end
      const __m512i v0 = _mm512_maskz_loadu_epi8(mask, w0 + 64 * g), v1 = _mm512_maskz_loadu_epi8(mask, w1 + 64 * g);
      const __m512i lo0 = _mm512_maskz_permutexvar_epi8(mask, v0, lut);
      const __m512i hi0 = _mm512_maskz_permutexvar_epi8(mask, _mm512_srli_epi16(v0, 4), lut);
      const __m512i lo1 = _mm512_maskz_permutexvar_epi8(mask, v1, lut);
      const __m512i hi1 = _mm512_maskz_permutexvar_epi8(mask, _mm512_srli_epi16(v1, 4), lut);
      const __m512i index = _mm512_add_epi32(quarter, _mm512_set1_epi32(static_cast<int>(4 * (g - g0))));
      const __m512 scale0 = _mm512_permutexvar_ps(index, sc0), scale1 = _mm512_permutexvar_ps(index, sc1);
      for (int m = 0; m < MB; ++m) {
        const uint8_t* d = x + m * ld + kDigitGroupBytes * g;
        a[m] = _mm512_fmadd_ps(fp4_block_sums(d, lo0, hi0), scale0, a[m]);
        b[m] = _mm512_fmadd_ps(fp4_block_sums(d, lo1, hi1), scale1, b[m]);
      }
    }
  }
  for (int m = 0; m < MB; ++m) {
    s0[m] = _mm512_reduce_add_ps(a[m]) * step[m] * 0.5f;
    s1[m] = _mm512_reduce_add_ps(b[m]) * step[m] * 0.5f;
  }
}

}  // namespace neuronpack_moe
#endif  // NEURONPACK_AVX512
