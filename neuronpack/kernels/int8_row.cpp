// A few rows of x against int8 weights (NxD Inference's weight-only format) with AVX512_VNNI's integer dot products,
// instead of widening every weight to float32 (linear.cpp's kernel: one FMA per 16 products, plus two conversions).
// Two ways, by shape (measured with bench/linears.py and docs/portable-backend.md, one thread):
//
// - digit rows (up to kDigitMaxRows rows of x; one row only up to kDigitMaxK columns): each row of x becomes
//   integers q = x / unit to within max|x| * 2^-23 (float32's own rounding of the row's largest element) and q + 2^23
//   three rows of unsigned bytes (base-256 digits), dotted with the weights as they are stored through vpdpbusd (64
//   byte products per instruction; see "digit rows" below). Four weight rows far apart at once (four long read
//   streams, the pattern the hardware prefetcher keeps up with) against every row of x from L1. On this round's Zen 4
//   (family 25) SmolLM2's int8 layer linears and head at one row: 22 GB/s, where the earlier four-digit kernel (one
//   stream, a software prefetch, tuned on a Zen 5) read at 12-15 GB/s and the widening kernel at 20-22; at 2-4 rows
//   up to 1.15x the widening kernel, at 8 rows 0.9x (so from 5 rows linear.cpp widens).
// - one row longer than kDigitMaxK: q as two int16 rows (hi, lo) through vpdpwssd (32 pairs of int16 per
//   instruction), exact to max|x| * 2^-31, four weight rows far apart at once sharing each load of x.
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "int8_row.h"
#include "simd.h"

#ifdef NEURONPACK_AVX512
namespace {

using namespace neuronpack_simd;

#define NEURONPACK_VNNI_TARGET __attribute__((target("avx512vnni,avx512bw,avx512vl,avx512f")))

constexpr float kHiLevels = 32767.f, kLoUnit = 32768.f;
// q's largest magnitude: q + 2^23 stays below 2^24 (three unsigned base-256 digits) after float32 rounding.
constexpr float kLevels = 8388600.f;
constexpr int kDigits = 3;
constexpr int64_t kDigitL1Bytes = 24576;  // the digit rows of every row of x over a block of K stay in L1
// The longest single row the digit kernel takes (longer: int16 rows, measured faster on the Zen 5 for 4096 x 3072).
constexpr int64_t kDigitMaxK = 2048;
// Elements per int32 accumulation of the int16 kernel: a lane adds two products of at most 32767 * 128 per
// instruction, and 4096 elements are 128 instructions per lane: below 2^31 (digits: four products of at most
// 255 * 128 per instruction, 2^31 after 2^20 columns).
constexpr int64_t kIntBlock = 4096;

// max|x| over x [K]; inf when x holds an inf, NaN when it holds a NaN (vmaxps alone would drop a NaN: it returns its
// second operand when either is one).
NEURONPACK_VNNI_TARGET float abs_max(const float* x, int64_t K) {
  __m512 amax = _mm512_setzero_ps();
  __mmask16 nan = 0;
  for (int64_t k = 0; k < K; k += 16) {
    const __m512 v = _mm512_abs_ps(_mm512_maskz_loadu_ps(tail_mask16(K - k), x + k));
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    amax = _mm512_max_ps(amax, v);
  }
  return nan ? __builtin_nanf("") : _mm512_reduce_max_ps(amax);
}

// hi, lo of 16 values of x (see the top of this file); inv = 32767 / max|x|.
NEURONPACK_VNNI_TARGET inline void split16(const float* x, __mmask16 mask, __m512 inv, __m512i& hi, __m512i& lo) {
  const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, x), inv);
  const __m512 h = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  hi = _mm512_cvtps_epi32(h);
  lo = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_sub_ps(v, h), _mm512_set1_ps(kLoUnit)));  // v - h exact; |lo| <= 2^14
}

// -- digit rows through vpdpbusd, 1..16 rows of x ---------------------------------------------------------------
//
// Each row of x becomes q = round(x / unit), |q| <= kLevels < 2^23, and q + 2^23 three unsigned base-256 digits
// u0 + 2^8 u1 + 2^16 u2 (rows of bytes, zero padded to Kp). vpdpbusd multiplies 64 pairs of (unsigned byte, signed
// byte) into 16 int32 lanes, so the digits are its unsigned side and the weights, as stored, its signed side (read
// straight from memory, no conversion): w . q = A0 + 2^8 A1 + 2^16 (A2 - 128 S) per lane, A_d = w . u_d and
// S = the lane's sum of w (one more vpdpbusd per weight vector, shared by every row of x), all exact in int32.

// acc += the unsigned bytes u times the signed bytes at w, in place (gcc 12 copies the accumulator of
// _mm512_dpbusd_epi32 to another register and back around every call).
NEURONPACK_VNNI_TARGET inline void dpbusd(__m512i& acc, __m512i u, const int8_t* w) {
  __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "m"(*reinterpret_cast<const __m512i*>(w)));
}
NEURONPACK_VNNI_TARGET inline void dpbusd(__m512i& acc, __m512i u, __m512i w) {
  __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(w));
}

struct Digits {  // u_d of row m at e[(m * kDigits + d) * Kp] (64-byte aligned: no load splits a cache line); per
                 // row of x the value of one step of q
  std::vector<uint8_t> buffer;
  uint8_t* e = nullptr;
  std::vector<float> unit;
  int64_t Kp = 0;
  const uint8_t* row(int64_t m) const { return e + m * kDigits * Kp; }
};

// False when a row of x holds an inf or a NaN.
NEURONPACK_VNNI_TARGET bool make_digits(const float* x, int64_t M, int64_t K, Digits& out) {
  out.Kp = (K + 63) / 64 * 64;
  out.buffer.assign(M * kDigits * out.Kp + 64, 0);
  out.e = out.buffer.data() + (64 - reinterpret_cast<uintptr_t>(out.buffer.data()) % 64) % 64;
  out.unit.assign(M, 0.f);
  const __m512i bias = _mm512_set1_epi32(1 << 23);
  for (int64_t m = 0; m < M; ++m) {
    const float* xm = x + m * K;
    const float top = abs_max(xm, K);
    if (!(top <= 3.4e38f)) return false;
    out.unit[m] = top / kLevels;
    const __m512 inv = _mm512_set1_ps(top > 0.f ? kLevels / top : 0.f);
    uint8_t* e = out.e + m * kDigits * out.Kp;
    for (int64_t k = 0; k < K; k += 16) {
      const __mmask16 mask = tail_mask16(K - k);
      __m512i q = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(mask, xm + k), inv)), bias);
      for (int d = 0; d < kDigits; ++d, q = _mm512_srli_epi32(q, 8))  // 0 <= q < 2^24
        _mm_mask_storeu_epi8(e + d * out.Kp + k, mask, _mm512_cvtepi32_epi8(_mm512_and_si512(q, _mm512_set1_epi32(255))));
    }
  }
  return true;
}

// Sums of 16-lane vectors, 16 at a time through one shuffle tree (simd.h sum16), each added to its output.
struct Sums {
  __m512 v[16];
  float* dst[16];
  int n = 0;
  NEURONPACK_VNNI_TARGET void add(__m512 value, float* to) {
    v[n] = value;
    dst[n++] = to;
    if (n == 16) flush();
  }
  NEURONPACK_VNNI_TARGET void flush() {
    if (!n) return;
    for (int i = n; i < 16; ++i) v[i] = _mm512_setzero_ps();
    alignas(64) float s[16];
    _mm512_store_ps(s, sum16(v));
    for (int i = 0; i < n; ++i) *dst[i] += s[i];
    n = 0;
  }
};

// (A2 - 128 S) 2^16 + A1 2^8 + A0 per lane, times unit.
NEURONPACK_VNNI_TARGET inline __m512 combine(__m512i a0, __m512i a1, __m512i a2, __m512i sum_w, __m512 unit) {
  const __m512 f = _mm512_set1_ps(256.f);
  const __m512 top = _mm512_cvtepi32_ps(_mm512_sub_epi32(a2, _mm512_slli_epi32(sum_w, 7)));
  return _mm512_mul_ps(_mm512_fmadd_ps(_mm512_fmadd_ps(top, f, _mm512_cvtepi32_ps(a1)), f, _mm512_cvtepi32_ps(a0)), unit);
}

// The weights of [k, k + 64) of a row: the tail past K masked to zero (the digits are zero there too).
NEURONPACK_VNNI_TARGET inline __m512i tail_weights(const int8_t* w, int64_t left) {
  return _mm512_maskz_loadu_epi8(~0ULL >> (64 - left), w);
}

// S (each lane's sum of the weights) of 4 adjacent weight rows w (K apart) over [k0, k1): this pass brings the rows
// into L1 for the rows of x after it, with a software prefetch of what follows them (the loader lays the weights out
// in the order a step reads them, models/weight_arena.py: past the matrix's end is the next matrix).
NEURONPACK_VNNI_TARGET __attribute__((always_inline)) inline void weight_sums4(const int8_t* w, int64_t stride, int64_t K, int64_t k0, int64_t k1,
                                         __m512i s[4]) {
  const __m512i ones = _mm512_set1_epi8(1);
  __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
  const int8_t *w1 = w + stride, *w2 = w + 2 * stride, *w3 = w + 3 * stride;
  int64_t k = k0;
  for (; k + 64 <= std::min(k1, K); k += 64) {
    dpbusd(s0, ones, w + k);
    dpbusd(s1, ones, w1 + k);
    dpbusd(s2, ones, w2 + k);
    dpbusd(s3, ones, w3 + k);
  }
  if (k < k1 && k < K) {
    dpbusd(s0, ones, tail_weights(w + k, K - k));
    dpbusd(s1, ones, tail_weights(w1 + k, K - k));
    dpbusd(s2, ones, tail_weights(w2 + k, K - k));
    dpbusd(s3, ones, tail_weights(w3 + k, K - k));
  }
  s[0] = s0, s[1] = s1, s[2] = s2, s[3] = s3;
}

// One row of x (digits e, rows Kp apart) against 4 adjacent weight rows over [k0, k1): y[0..3] += the partial dots.
NEURONPACK_VNNI_TARGET __attribute__((always_inline)) inline void digit_tile4(const int8_t* w, int64_t stride, int64_t K, int64_t k0, int64_t k1,
                                        const uint8_t* e, int64_t Kp, const __m512i s[4], __m512 unit, float* y,
                                        int64_t ystride, Sums& sums) {
  __m512i a00 = _mm512_setzero_si512(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00, a13 = a00,
          a20 = a00, a21 = a00, a22 = a00, a23 = a00;  // a<digit><weight row>
  const int8_t *w1 = w + stride, *w2 = w + 2 * stride, *w3 = w + 3 * stride;
  int64_t k = k0;
  for (; k + 64 <= std::min(k1, K); k += 64) {
    const __m512i u0 = _mm512_loadu_si512(e + k), u1 = _mm512_loadu_si512(e + Kp + k),
                  u2 = _mm512_loadu_si512(e + 2 * Kp + k);
    dpbusd(a00, u0, w + k), dpbusd(a10, u1, w + k), dpbusd(a20, u2, w + k);
    dpbusd(a01, u0, w1 + k), dpbusd(a11, u1, w1 + k), dpbusd(a21, u2, w1 + k);
    dpbusd(a02, u0, w2 + k), dpbusd(a12, u1, w2 + k), dpbusd(a22, u2, w2 + k);
    dpbusd(a03, u0, w3 + k), dpbusd(a13, u1, w3 + k), dpbusd(a23, u2, w3 + k);
  }
  if (k < k1 && k < K) {
    const __m512i u0 = _mm512_loadu_si512(e + k), u1 = _mm512_loadu_si512(e + Kp + k),
                  u2 = _mm512_loadu_si512(e + 2 * Kp + k);
    const __m512i v0 = tail_weights(w + k, K - k), v1 = tail_weights(w1 + k, K - k),
                  v2 = tail_weights(w2 + k, K - k), v3 = tail_weights(w3 + k, K - k);
    dpbusd(a00, u0, v0), dpbusd(a10, u1, v0), dpbusd(a20, u2, v0);
    dpbusd(a01, u0, v1), dpbusd(a11, u1, v1), dpbusd(a21, u2, v1);
    dpbusd(a02, u0, v2), dpbusd(a12, u1, v2), dpbusd(a22, u2, v2);
    dpbusd(a03, u0, v3), dpbusd(a13, u1, v3), dpbusd(a23, u2, v3);
  }
  sums.add(combine(a00, a10, a20, s[0], unit), y);
  sums.add(combine(a01, a11, a21, s[1], unit), y + ystride);
  sums.add(combine(a02, a12, a22, s[2], unit), y + 2 * ystride);
  sums.add(combine(a03, a13, a23, s[3], unit), y + 3 * ystride);
}

// One row of x against one weight row (the last N % 4 rows), S computed alongside.
NEURONPACK_VNNI_TARGET void digit_tile1(const int8_t* w, int64_t K, int64_t k0, int64_t k1, const uint8_t* e,
                                        int64_t Kp, __m512 unit, float* y, Sums& sums) {
  const __m512i ones = _mm512_set1_epi8(1);
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, s = a0;
  for (int64_t k = k0; k < std::min(k1, K); k += 64) {
    const __m512i v = K - k >= 64 ? _mm512_loadu_si512(w + k) : tail_weights(w + k, K - k);
    dpbusd(a0, _mm512_loadu_si512(e + k), v), dpbusd(a1, _mm512_loadu_si512(e + Kp + k), v);
    dpbusd(a2, _mm512_loadu_si512(e + 2 * Kp + k), v), dpbusd(s, ones, v);
  }
  sums.add(combine(a0, a1, a2, s, unit), y);
}

// Weight rows [n0, n1) against every row of x, a block of K at a time.
NEURONPACK_VNNI_TARGET void digit_range(const int8_t* w, int64_t K, int64_t N, int64_t n0, int64_t n1,
                                        const Digits& digits, int64_t M, int64_t block, float* out) {
  const int64_t Kp = digits.Kp;
  for (int64_t m = 0; m < M; ++m) std::fill(out + m * N + n0, out + m * N + n1, 0.f);
  Sums sums;
  for (int64_t k0 = 0; k0 < Kp; k0 += block) {
    const int64_t k1 = std::min(Kp, k0 + block);
    const int64_t quarter = (n1 - n0) / 4;
    for (int64_t n = n0; n < n0 + quarter; ++n) {  // rows n + j quarter: four read streams, each read once
      __m512i s[4];
      weight_sums4(w + n * K, quarter * K, K, k0, k1, s);
      for (int64_t m = 0; m < M; ++m)
        digit_tile4(w + n * K, quarter * K, K, k0, k1, digits.row(m), Kp, s, _mm512_set1_ps(digits.unit[m]),
                    out + m * N + n, quarter, sums);
    }
    for (int64_t n = n0 + 4 * quarter; n < n1; ++n)
      for (int64_t m = 0; m < M; ++m)
        digit_tile1(w + n * K, K, k0, k1, digits.row(m), Kp, _mm512_set1_ps(digits.unit[m]), out + m * N + n, sums);
  }
  sums.flush();
}

// -- longer rows: int16 hi / lo rows through vpdpwssd, four streams ----------------------------------------------

struct SplitRow {  // q as int16 rows: hi at q[0], lo at q[Kp] (zero padded)
  std::vector<int16_t> q;
  int64_t Kp = 0;  // K rounded up to 32
};

NEURONPACK_VNNI_TARGET void split_row(const float* x, int64_t K, __m512 inv, SplitRow& out) {
  out.Kp = (K + 31) / 32 * 32;
  out.q.assign(2 * out.Kp, 0);
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 mask = tail_mask16(K - k);
    __m512i hi, lo;
    split16(x + k, mask, inv, hi, lo);
    _mm256_mask_storeu_epi16(out.q.data() + k, mask, _mm512_cvtepi32_epi16(hi));
    _mm256_mask_storeu_epi16(out.q.data() + out.Kp + k, mask, _mm512_cvtepi32_epi16(lo));
  }
}

NEURONPACK_VNNI_TARGET inline __m512i widen_i8(const int8_t* w, __mmask32 m) {
  return _mm512_cvtepi8_epi16(m == 0xFFFFFFFFu ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w))
                                               : _mm256_maskz_loadu_epi8(m, w));
}

// y[r * ystride] = x . w[r * stride ...] for R weight rows far apart (R read streams: with two, the two integer dots
// per weight vector fall short of the read bandwidth; four keep up); unit: x's value of one hi step (s * 2^15).
template <int R>
NEURONPACK_VNNI_TARGET void split_streams(const int8_t* w, int64_t stride, const SplitRow& x, int64_t K, float unit,
                                          float* y, int64_t ystride) {
  const int16_t* q = x.q.data();
  __m512 sum[R];
  for (int r = 0; r < R; ++r) sum[r] = _mm512_setzero_ps();
  for (int64_t kb = 0; kb < K; kb += kIntBlock) {
    const int64_t kend = std::min(K, kb + kIntBlock);
    __m512i hi[R], lo[R];
    for (int r = 0; r < R; ++r) hi[r] = lo[r] = _mm512_setzero_si512();
    for (int64_t k = kb; k < kend; k += 32) {  // x is zero padded: only the weight needs the tail mask
      const __mmask32 mask = tail_mask32(kend - k);
      const __m512i h = _mm512_loadu_si512(q + k), l = _mm512_loadu_si512(q + x.Kp + k);
      for (int r = 0; r < R; ++r) {
        const __m512i v = widen_i8(w + r * stride + k, mask);
        hi[r] = _mm512_dpwssd_epi32(hi[r], v, h);
        lo[r] = _mm512_dpwssd_epi32(lo[r], v, l);
      }
    }
    for (int r = 0; r < R; ++r)  // sum += hi + lo / 2^15 of this block
      sum[r] = _mm512_add_ps(sum[r], _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo[r]), _mm512_set1_ps(1.f / kLoUnit),
                                                     _mm512_cvtepi32_ps(hi[r])));
  }
  for (int r = 0; r < R; ++r) y[r * ystride] = unit * _mm512_reduce_add_ps(sum[r]);
}

}  // namespace

bool int8_rows_times_weight(const float* x, int64_t M, int64_t K, const int8_t* w, int64_t N, float* out) {
  if (M == 1 && K > kDigitMaxK) {
    const float top = abs_max(x, K);
    if (!(top <= 3.4e38f)) return false;  // inf or NaN
    const __m512 inv = _mm512_set1_ps(top > 0.f ? kHiLevels / top : 0.f);
    thread_local SplitRow scratch;
    SplitRow& split = scratch;  // this thread's: a thread_local named inside the lambda would be each worker's own
    split_row(x, K, inv, split);
    const float unit = top / kHiLevels;  // x's value of one hi step
    at::parallel_for(0, N, 32, [&](int64_t n0, int64_t n1) {  // rows n, n + quarter, n + 2 quarter, n + 3 quarter
      const int64_t quarter = (n1 - n0) / 4;
      for (int64_t n = n0; n < n0 + quarter; ++n)
        split_streams<4>(w + n * K, quarter * K, split, K, unit, out + n, quarter);
      for (int64_t n = n0 + 4 * quarter; n < n1; ++n) split_streams<1>(w + n * K, 0, split, K, unit, out + n, 0);
    });
    return true;
  }
  // Blocks of K small enough that the digit rows of every row of x for the block stay in L1 while the weight rows
  // stream past (8 rows of 1536: 36 KiB of digits without blocks).
  const int64_t Kp = (K + 63) / 64 * 64;
  const int64_t block = M * kDigits * Kp <= kDigitL1Bytes ? Kp
                                                          : std::max<int64_t>(64, kDigitL1Bytes / (M * kDigits) / 64 * 64);
  thread_local Digits scratch;
  Digits& digits = scratch;  // this thread's: a thread_local named inside the lambda would be each worker's own
  if (!make_digits(x, M, K, digits)) return false;
  at::parallel_for(0, N, 32, [&](int64_t n0, int64_t n1) { digit_range(w, K, N, n0, n1, digits, M, block, out); });
  return true;
}

#else
bool int8_rows_times_weight(const float*, int64_t, int64_t, const int8_t*, int64_t, float*) { return false; }
#endif  // NEURONPACK_AVX512
