// One row of x against int8 weights (NxD Inference's weight-only format) with AVX512_VNNI's exact integer dot
// products, instead of widening every weight to float32 (6 instructions per 16 weights, ~20 GB/s).
//
// x becomes a row of integers q, x = s * q to within max|x| * 2^-31 (float32's own rounding scale over the row):
// s' = max|x| / 32767, hi = round(x / s'), lo = round((x / s' - hi) * 2^15) (each step exact in float32), and
// q = hi * 2^15 + lo, s = s' / 2^15. Two ways to dot q with the weights, by row length (the measurements: SmolLM2's
// layer linears in bench/linears.py, single matrices in docs/portable-backend.md, one thread, Zen 5):
//
// - K <= kDigitMaxK: q as four rows of signed base-256 digits (q = e0 + 2^8 e1 + 2^16 e2 + 2^24 e3) through
//   vpdpbusd, which multiplies 64 pairs of (unsigned 8-bit, signed 8-bit) into 16 int32 lanes: the weights go in as
//   the unsigned bytes w + 128 (one xor) and the 128 * e that adds to each lane is taken off exactly, per lane, from
//   the same instruction over 128s, once per row of x. Rows are read one after another (one stream) with a software
//   prefetch kPrefetchBytes ahead, past the end of the matrix too: the loader lays the weights out in the order a
//   step reads them (models/weight_arena.py), so the next matrix's first lines are in flight before its call starts.
//   SmolLM2's 210 int8 layer linears: 62-65% -> 70-88% of the read bandwidth.
// - longer rows: q as two int16 rows (hi, lo) through vpdpwssd (32 pairs of int16 per instruction), four weight rows
//   far apart at once sharing each load of x (four read streams): the digit rows (4 bytes per element) no longer stay
//   in L1 beside the streamed weights (see kDigitMaxK).
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
constexpr int kDigits = 4;
// The longest row the digit kernel takes: its 4 digit rows of 2048 bytes (8 KiB) stay in L1 beside the weights
// streaming through. 12 matrices in a row, one thread: 8192 x 2048 read at 97-103% of the bandwidth with digits,
// 84-90% with int16 rows; 4096 x 3072 at 54-60% with digits, 84-87% with int16 rows.
constexpr int64_t kDigitMaxK = 2048;
// SmolLM2's int8 layer linears in a row (a C micro-benchmark): 36 GB/s without a prefetch, 47-51 GB/s (a plain sum's
// read bandwidth) 16 KiB ahead (8 KiB: 47-50; 32 KiB: 46-51).
constexpr int64_t kPrefetchBytes = 16384;
// Elements per int32 accumulation of the int16 kernel: a lane adds two products of at most 32767 * 128 per
// instruction, and 4096 elements are 128 instructions per lane: below 2^31 (digits: four products of at most
// 255 * 128, and kDigitMaxK / 64 instructions, far below).
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

// -- K <= kDigitMaxK: digit rows through vpdpbusd ----------------------------------------------------------------

struct DigitRow {  // q as kDigits rows of signed base-256 digits, row d at e[d * Kp] (zero padded)
  std::vector<int8_t> e;
  int32_t offset[kDigits][16];  // per digit and lane: what the weights' +128 adds (128 * the lane's digits)
  int64_t Kp = 0;                // K rounded up to 64
};

NEURONPACK_VNNI_TARGET void digit_row(const float* x, int64_t K, __m512 inv, DigitRow& out) {
  out.Kp = (K + 63) / 64 * 64;
  out.e.assign(kDigits * out.Kp, 0);
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 mask = tail_mask16(K - k);
    __m512i hi, lo;
    split16(x + k, mask, inv, hi, lo);
    __m512i q = _mm512_add_epi32(_mm512_slli_epi32(hi, 15), lo);  // |q| < 2^30
    for (int d = 0; d < kDigits; ++d) {
      const __m512i digit = _mm512_srai_epi32(_mm512_slli_epi32(q, 24), 24);  // the low byte, sign extended
      _mm_mask_storeu_epi8(out.e.data() + d * out.Kp + k, mask, _mm512_cvtepi32_epi8(digit));
      q = _mm512_srai_epi32(_mm512_sub_epi32(q, digit), 8);  // exact: q - digit is a multiple of 256
    }
  }
  const __m512i unsigned128 = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int d = 0; d < kDigits; ++d) {  // (stored unaligned: a thread_local is not 64-byte aligned)
    __m512i offset = _mm512_setzero_si512();
    for (int64_t k = 0; k < out.Kp; k += 64)
      offset = _mm512_dpbusd_epi32(offset, unsigned128, _mm512_loadu_si512(out.e.data() + d * out.Kp + k));
    _mm512_storeu_si512(out.offset[d], offset);
  }
}

// acc_d += (w + 128) . digit row d, for the 64 weights at w and digits at e (rows Kp apart).
NEURONPACK_VNNI_TARGET inline void digit_step(__m512i raw, const int8_t* e, int64_t Kp, __m512i& a0, __m512i& a1,
                                              __m512i& a2, __m512i& a3) {
  const __m512i v = _mm512_xor_si512(raw, _mm512_set1_epi8(static_cast<char>(0x80)));  // w + 128, unsigned
  a0 = _mm512_dpbusd_epi32(a0, v, _mm512_loadu_si512(e));
  a1 = _mm512_dpbusd_epi32(a1, v, _mm512_loadu_si512(e + Kp));
  a2 = _mm512_dpbusd_epi32(a2, v, _mm512_loadu_si512(e + 2 * Kp));
  a3 = _mm512_dpbusd_epi32(a3, v, _mm512_loadu_si512(e + 3 * Kp));
}

// acc - offset, per lane exact, as float32.
NEURONPACK_VNNI_TARGET inline __m512 exact(__m512i acc, const int32_t* offset) {
  return _mm512_cvtepi32_ps(_mm512_sub_epi32(acc, _mm512_loadu_si512(offset)));
}

// q . w for one weight row w [K] (four accumulators, one per digit, named: an array of them was kept on the stack).
NEURONPACK_VNNI_TARGET inline float digit_dot(const int8_t* w, const DigitRow& x, int64_t K) {
  const int8_t* e = x.e.data();
  const int64_t Kp = x.Kp;
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  int64_t k = 0;
  for (; k + 64 <= K; k += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(w + k + kPrefetchBytes), _MM_HINT_T0);
    digit_step(_mm512_loadu_si512(w + k), e + k, Kp, a0, a1, a2, a3);
  }
  if (k < K)  // the tail: the digits are zero past K
    digit_step(_mm512_maskz_loadu_epi8(~0ULL >> (64 - (K - k)), w + k), e + k, Kp, a0, a1, a2, a3);
  const __m512 f = _mm512_set1_ps(256.f);  // sum over digits of 256^d (acc_d - offset_d)
  __m512 sum = _mm512_fmadd_ps(exact(a3, x.offset[3]), f, exact(a2, x.offset[2]));
  sum = _mm512_fmadd_ps(sum, f, exact(a1, x.offset[1]));
  return _mm512_reduce_add_ps(_mm512_fmadd_ps(sum, f, exact(a0, x.offset[0])));
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

bool int8_row_times_weight(const float* x, int64_t K, const int8_t* w, int64_t N, float* out) {
  const float top = abs_max(x, K);
  if (!(top <= 3.4e38f)) return false;  // inf or NaN
  const float s = top / kHiLevels / kLoUnit;  // x = s * q
  const __m512 inv = _mm512_set1_ps(top > 0.f ? kHiLevels / top : 0.f);
  if (K <= kDigitMaxK) {
    thread_local DigitRow scratch;
    DigitRow& digits = scratch;  // this thread's: a thread_local named inside the lambda would be each worker's own
    digit_row(x, K, inv, digits);
    at::parallel_for(0, N, 32, [&](int64_t n0, int64_t n1) {  // threads split the rows; each reads its rows in order
      for (int64_t n = n0; n < n1; ++n) out[n] = s * digit_dot(w + n * K, digits, K);
    });
    return true;
  }
  thread_local SplitRow scratch;
  SplitRow& split = scratch;
  split_row(x, K, inv, split);
  const float unit = s * kLoUnit;
  at::parallel_for(0, N, 32, [&](int64_t n0, int64_t n1) {  // rows n, n + quarter, n + 2 quarter, n + 3 quarter
    const int64_t quarter = (n1 - n0) / 4;
    for (int64_t n = n0; n < n0 + quarter; ++n)
      split_streams<4>(w + n * K, quarter * K, split, K, unit, out + n, quarter);
    for (int64_t n = n0 + 4 * quarter; n < n1; ++n) split_streams<1>(w + n * K, 0, split, K, unit, out + n, 0);
  });
  return true;
}

#else
bool int8_row_times_weight(const float*, int64_t, const int8_t*, int64_t, float*) { return false; }
#endif  // NEURONPACK_AVX512
