// One row of x against int8 weights (NxD Inference's weight-only format) with AVX512_VNNI's exact integer dot
// products, instead of widening every weight to float32 (linear.cpp's kernel: a conversion and an FMA per 16).
//
// x becomes a row of integers q, x = s * q to within max|x| * 2^-31 (float32's own rounding scale over the row):
// s' = max|x| / 32767, hi = round(x / s'), lo = round((x / s' - hi) * 2^15) (each step exact in float32), and
// q = hi * 2^15 + lo, s = s' / 2^15. Two ways to dot q with the weights, by row length:
//
// - K <= kDigitMaxK: q + 2^30 as four rows of unsigned base-256 digits through vpdpbusd (see "digit rows" below),
//   four weight rows at a time. Where they are in memory is the CPU's (measured with bench/linears.py's layer set,
//   one thread): on a Zen 5 (AMD family 26, round 9) rows one after another with a software prefetch kPrefetchBytes
//   ahead, past the end of the matrix too (the loader lays the weights out in the order a step reads them,
//   models/weight_arena.py): 42-47 GB/s against 35-36 for four streams (a C micro-benchmark of the layer sequence);
//   on a Zen 4 (family 25, round 15) that pattern read SmolLM2's int8 layer linears and head at 12-15 GB/s, four
//   weight rows far apart (four long streams, no software prefetch) at 20-23 GB/s. Other CPUs take the four streams.
// - longer rows: q as two int16 rows (hi, lo) through vpdpwssd (32 pairs of int16 per instruction), four weight rows
//   far apart at once sharing each load of x (four read streams): four digit rows no longer stay in L1 beside the
//   streamed weights (see kDigitMaxK).
#include <ATen/Parallel.h>

#include <cpuid.h>

#include <algorithm>
#include <atomic>
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
// streaming through. 12 matrices in a row, one thread, Zen 5: 8192 x 2048 read at 97-103% of the bandwidth with
// digits, 84-90% with int16 rows; 4096 x 3072 at 54-60% with digits, 84-87% with int16 rows.
constexpr int64_t kDigitMaxK = 2048;
// SmolLM2's int8 layer linears in a row on the Zen 5 (a C micro-benchmark): 36 GB/s without a prefetch, 47-51 GB/s
// (a plain sum's read bandwidth) 16 KiB ahead (8 KiB: 47-50; 32 KiB: 46-51).
constexpr int64_t kPrefetchBytes = 16384;
// Elements per int32 accumulation of the int16 kernel: a lane adds two products of at most 32767 * 128 per
// instruction, and 4096 elements are 128 instructions per lane: below 2^31 (digits: four products of at most
// 255 * 128 per instruction, 2^31 after 2^20 columns).
constexpr int64_t kIntBlock = 4096;

// hi, lo of 16 values of x (see the top of this file); inv = 32767 / max|x|.
NEURONPACK_VNNI_TARGET inline void split16(const float* x, __mmask16 mask, __m512 inv, __m512i& hi, __m512i& lo) {
  const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, x), inv);
  const __m512 h = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  hi = _mm512_cvtps_epi32(h);
  lo = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_sub_ps(v, h), _mm512_set1_ps(kLoUnit)));  // v - h exact; |lo| <= 2^14
}

// -- digit rows through vpdpbusd ----------------------------------------------------------------------------------
//
// q + 2^30 (0 <= q + 2^30 < 2^31) = u0 + 2^8 u1 + 2^16 u2 + 2^24 u3, four rows of bytes (zero padded to Kp).
// vpdpbusd multiplies 64 pairs of (unsigned byte, signed byte) into 16 int32 lanes, so the digits are its unsigned
// side and the weights, as stored, its signed side (read straight from memory, no conversion): per lane
// w . q = A0 + 2^8 A1 + 2^16 A2 + 2^24 (A3 - 64 S), A_d = w . u_d and S the lane's sum of w (one more vpdpbusd per
// weight vector), each exact in int32.

// acc += the unsigned bytes u times the signed bytes at w, in place (gcc 12 copies the accumulator of
// _mm512_dpbusd_epi32 to another register and back around every call).
NEURONPACK_VNNI_TARGET inline void dpbusd(__m512i& acc, __m512i u, const int8_t* w) {
  __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "m"(*reinterpret_cast<const __m512i*>(w)));
}
NEURONPACK_VNNI_TARGET inline void dpbusd(__m512i& acc, __m512i u, __m512i w) {
  __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(w));
}

struct Digits {  // u_d at e[d * Kp], 64-byte aligned (no load splits a cache line)
  std::vector<uint8_t> buffer;
  const uint8_t* e = nullptr;
  int64_t Kp = 0;
};

NEURONPACK_VNNI_TARGET void make_digits(const float* x, int64_t K, __m512 inv, Digits& out) {
  out.Kp = (K + 63) / 64 * 64;
  out.buffer.assign(kDigits * out.Kp + 64, 0);
  uint8_t* e = out.buffer.data() + (64 - reinterpret_cast<uintptr_t>(out.buffer.data()) % 64) % 64;
  out.e = e;
  const __m512i bias = _mm512_set1_epi32(1 << 30), low_byte = _mm512_set1_epi32(255);
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 mask = tail_mask16(K - k);
    __m512i hi, lo;
    split16(x + k, mask, inv, hi, lo);
    __m512i q = _mm512_add_epi32(_mm512_add_epi32(_mm512_slli_epi32(hi, 15), lo), bias);  // |q| < 2^30 before
    for (int d = 0; d < kDigits; ++d, q = _mm512_srli_epi32(q, 8))
      _mm_mask_storeu_epi8(e + d * out.Kp + k, mask, _mm512_cvtepi32_epi8(_mm512_and_si512(q, low_byte)));
  }
}

// The weights of [k, k + 64) of a row with the tail past K masked to zero (the digits are zero there too).
NEURONPACK_VNNI_TARGET inline __m512i tail_weights(const int8_t* w, int64_t left) {
  return _mm512_maskz_loadu_epi8(~0ULL >> (64 - left), w);
}

// (((A3 - 64 S) 2^8 + A2) 2^8 + A1) 2^8 + A0 per lane of one weight row (the caller sums the lanes).
NEURONPACK_VNNI_TARGET inline __m512 combine(__m512i a0, __m512i a1, __m512i a2, __m512i a3, __m512i sum_w) {
  const __m512 f = _mm512_set1_ps(256.f);
  __m512 v = _mm512_cvtepi32_ps(_mm512_sub_epi32(a3, _mm512_slli_epi32(sum_w, 6)));
  v = _mm512_fmadd_ps(v, f, _mm512_cvtepi32_ps(a2));
  v = _mm512_fmadd_ps(v, f, _mm512_cvtepi32_ps(a1));
  return _mm512_fmadd_ps(v, f, _mm512_cvtepi32_ps(a0));
}

// y[j * ystride] = s * (q . weight row j) for the four weight rows w + j * stride; ``prefetch``: software-prefetch
// kPrefetchBytes ahead of the rows (for adjacent rows, stride == K: one stream).
NEURONPACK_VNNI_TARGET void digit_rows4(const int8_t* w, int64_t stride, int64_t K, const Digits& x, float s, float* y,
                                        int64_t ystride, bool prefetch) {
  // a<digit><weight row>, named: gcc keeps an array of 16 accumulators on the stack (a load and a store per product)
  __m512i a00 = _mm512_setzero_si512(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00, a13 = a00,
          a20 = a00, a21 = a00, a22 = a00, a23 = a00, a30 = a00, a31 = a00, a32 = a00, a33 = a00, s0 = a00, s1 = a00,
          s2 = a00, s3 = a00;
  const __m512i ones = _mm512_set1_epi8(1);
  const int8_t *w0 = w, *w1 = w + stride, *w2 = w + 2 * stride, *w3 = w + 3 * stride;
  const uint8_t* e = x.e;
  const int64_t Kp = x.Kp;
  const char* ahead = reinterpret_cast<const char*>(w) + kPrefetchBytes;  // adjacent rows: 4 lines per 64 columns
#define NEURONPACK_DIGITS4(V0, V1, V2, V3)                                              \
  dpbusd(a00, u0, V0), dpbusd(a10, u1, V0), dpbusd(a20, u2, V0), dpbusd(a30, u3, V0);   \
  dpbusd(a01, u0, V1), dpbusd(a11, u1, V1), dpbusd(a21, u2, V1), dpbusd(a31, u3, V1);   \
  dpbusd(a02, u0, V2), dpbusd(a12, u1, V2), dpbusd(a22, u2, V2), dpbusd(a32, u3, V2);   \
  dpbusd(a03, u0, V3), dpbusd(a13, u1, V3), dpbusd(a23, u2, V3), dpbusd(a33, u3, V3);   \
  dpbusd(s0, ones, V0), dpbusd(s1, ones, V1), dpbusd(s2, ones, V2), dpbusd(s3, ones, V3)
  int64_t k = 0;
  for (; k + 64 <= K; k += 64) {
    if (prefetch)
      for (int j = 0; j < 4; ++j) _mm_prefetch(ahead + 4 * k + 64 * j, _MM_HINT_T0);
    const __m512i u0 = _mm512_load_si512(e + k), u1 = _mm512_load_si512(e + Kp + k),
                  u2 = _mm512_load_si512(e + 2 * Kp + k), u3 = _mm512_load_si512(e + 3 * Kp + k);
    NEURONPACK_DIGITS4(w0 + k, w1 + k, w2 + k, w3 + k);
  }
  if (k < K) {
    const __m512i u0 = _mm512_load_si512(e + k), u1 = _mm512_load_si512(e + Kp + k),
                  u2 = _mm512_load_si512(e + 2 * Kp + k), u3 = _mm512_load_si512(e + 3 * Kp + k);
    const __m512i v0 = tail_weights(w0 + k, K - k), v1 = tail_weights(w1 + k, K - k),
                  v2 = tail_weights(w2 + k, K - k), v3 = tail_weights(w3 + k, K - k);
    NEURONPACK_DIGITS4(v0, v1, v2, v3);
  }
#undef NEURONPACK_DIGITS4
  y[0] = s * _mm512_reduce_add_ps(combine(a00, a10, a20, a30, s0));
  y[ystride] = s * _mm512_reduce_add_ps(combine(a01, a11, a21, a31, s1));
  y[2 * ystride] = s * _mm512_reduce_add_ps(combine(a02, a12, a22, a32, s2));
  y[3 * ystride] = s * _mm512_reduce_add_ps(combine(a03, a13, a23, a33, s3));
}

// The same for one weight row (the last N % 4 rows of a thread's range).
NEURONPACK_VNNI_TARGET void digit_row1(const int8_t* w, int64_t K, const Digits& x, float s, float* y) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, sum = a0;
  const __m512i ones = _mm512_set1_epi8(1);
  const uint8_t* e = x.e;
  for (int64_t k = 0; k < K; k += 64) {
    const __m512i v = K - k >= 64 ? _mm512_loadu_si512(w + k) : tail_weights(w + k, K - k);
    dpbusd(a0, _mm512_load_si512(e + k), v), dpbusd(a1, _mm512_load_si512(e + x.Kp + k), v);
    dpbusd(a2, _mm512_load_si512(e + 2 * x.Kp + k), v), dpbusd(a3, _mm512_load_si512(e + 3 * x.Kp + k), v);
    dpbusd(sum, ones, v);
  }
  *y = s * _mm512_reduce_add_ps(combine(a0, a1, a2, a3, sum));
}

// Whether this CPU reads the weight rows one after another with a software prefetch (AMD family 26, Zen 5, where
// that was measured faster) rather than as four streams far apart; int8_one_stream(0 / 1) overrides (tests).
std::atomic<int> one_stream_override{-1};

bool one_stream() {
  static const bool amd_zen5_or_later = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx) || ebx != 0x68747541u) return false;  // "Auth"enticAMD
    __get_cpuid(1, &eax, &ebx, &ecx, &edx);
    return ((eax >> 8) & 0xF) + ((eax >> 20) & 0xFF) >= 0x1A;
  }();
  const int forced = one_stream_override.load(std::memory_order_relaxed);
  return forced < 0 ? amd_zen5_or_later : forced == 1;
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

int int8_one_stream(int mode) { return one_stream_override.exchange(mode); }

bool int8_row_times_weight(const float* x, int64_t K, const int8_t* w, int64_t N, float* out) {
  const float top = abs_max(x, K);
  if (!(top <= 3.4e38f)) return false;  // inf or NaN
  const float s = top / kHiLevels / kLoUnit;  // x = s * q
  const __m512 inv = _mm512_set1_ps(top > 0.f ? kHiLevels / top : 0.f);
  if (K > kDigitMaxK) {
    thread_local SplitRow scratch;
    SplitRow& split = scratch;  // this thread's: a thread_local named inside the lambda would be each worker's own
    split_row(x, K, inv, split);
    const float unit = s * kLoUnit;  // x's value of one hi step
    at::parallel_for(0, N, 32, [&](int64_t n0, int64_t n1) {  // rows n, n + quarter, n + 2 quarter, n + 3 quarter
      const int64_t quarter = (n1 - n0) / 4;
      for (int64_t n = n0; n < n0 + quarter; ++n)
        split_streams<4>(w + n * K, quarter * K, split, K, unit, out + n, quarter);
      for (int64_t n = n0 + 4 * quarter; n < n1; ++n) split_streams<1>(w + n * K, 0, split, K, unit, out + n, 0);
    });
    return true;
  }
  thread_local Digits scratch;
  Digits& digits = scratch;
  make_digits(x, K, inv, digits);
  const bool adjacent = one_stream();
  at::parallel_for(0, N, 32, [&](int64_t n0, int64_t n1) {  // threads split the weight rows
    const int64_t quarter = (n1 - n0) / 4;
    if (adjacent) {
      for (int64_t n = n0; n < n0 + 4 * quarter; n += 4) digit_rows4(w + n * K, K, K, digits, s, out + n, 1, true);
    } else {  // rows n, n + quarter, n + 2 quarter, n + 3 quarter
      for (int64_t n = n0; n < n0 + quarter; ++n)
        digit_rows4(w + n * K, quarter * K, K, digits, s, out + n, quarter, false);
    }
    for (int64_t n = n0 + 4 * quarter; n < n1; ++n) digit_row1(w + n * K, K, digits, s, out + n);
  });
  return true;
}

#else
int int8_one_stream(int) { return -1; }
bool int8_row_times_weight(const float*, int64_t, const int8_t*, int64_t, float*) { return false; }
#endif  // NEURONPACK_AVX512
