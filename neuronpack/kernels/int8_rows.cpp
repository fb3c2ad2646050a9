// 2-16 rows of x against int8 weights (NxD Inference's weight-only format) with AVX512_VNNI's vpdpwssd: each row
// of x rounded to int16 with a scale of its own, so one instruction multiplies 32 weights by one row of x and adds
// the products in pairs into exact int32 sums, where linear.cpp's widening kernel converts the weights to float32
// and multiplies 16 per FMA. From a few rows of x up, the FMAs bound that kernel, not the weight reads (SmolLM2's
// int8 layer linears at 8 rows: 25% of the read bandwidth on a Zen 5, 69% of a batch-8 step on a Zen 4); this one
// issues half the multiplies.
//
// Precision: x[m] = s_m * q_m with s_m = max|x[m]| / 32767 and q_m = round(x[m] / s_m), so each element carries an
// error of at most max|x[m]| * 2^-16 (llama.cpp's Q8_0 rounds x to int8 per 32 elements; NxD Inference computes
// in bfloat16, each element to 2^-9 of itself). The integer dot and the weights are exact; the sums are rounded
// to float32 once per block. One row alone keeps int8_row.cpp's kernel (float32's precision).
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "int8_row.h"
#include "simd.h"

#ifdef NEURONPACK_AVX512
namespace {

using namespace neuronpack_simd;

#define NEURONPACK_VNNI_TARGET __attribute__((target("avx512vnni,avx512bw,avx512vl,avx512f")))

constexpr float kLevels = 32767.f;
constexpr int kChunk = 8;  // rows of x per pass over a weight row pair: 16 accumulators in registers
// Elements of K per block: the chunk's int16 rows of the block stay in L1 beside the streaming weights (8 rows of
// 1536: 24 KiB), and a lane's int32 sum stays below 2^31 (a vpdpwssd adds two products of at most 32767 * 128:
// 4096 / 32 = 128 of them per lane reach 2^30).
constexpr int64_t kBlockBytes = 24576, kMaxBlock = 4096;
// Software prefetch (into L2) this far ahead of the weight row pair being read: 8 rows of x take long enough per
// weight row that the hardware prefetcher falls behind (as in linear.cpp).
constexpr int64_t kPrefetchBytes = 8192;

// x [M, K] as int16 rows q [M, Kp] (Kp: K rounded up to 32, zero padded) and a scale per row; false if x holds an
// inf or a NaN.
NEURONPACK_VNNI_TARGET bool quantize_rows(const float* x, int64_t M, int64_t K, std::vector<int16_t>& q, int64_t& Kp,
                                          float* scale) {
  Kp = (K + 31) / 32 * 32;
  q.assign(M * Kp, 0);
  for (int64_t m = 0; m < M; ++m) {
    const float* row = x + m * K;
    const float top = abs_max(row, K);
    if (!(top <= 3.4e38f)) return false;
    scale[m] = top / kLevels;
    const __m512 inv = _mm512_set1_ps(top > 0.f ? kLevels / top : 0.f);
    for (int64_t k = 0; k < K; k += 16) {
      const __mmask16 mask = tail_mask16(K - k);
      const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(mask, row + k), inv));  // nearest
      _mm256_mask_storeu_epi16(q.data() + m * Kp + k, mask, _mm512_cvtsepi32_epi16(v));
    }
  }
  return true;
}

// 32 int8 weights widened to int16 (the first ``left`` of them when fewer than 32 are left, the rest zero).
NEURONPACK_VNNI_TARGET inline __m512i widen32(const int8_t* w, int64_t left) {
  return _mm512_cvtepi8_epi16(left >= 32 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w))
                                         : _mm256_maskz_loadu_epi8(tail_mask32(left), w));
}

// acc += the products of a and b (int16) added in pairs, in place (the intrinsic's accumulator is copied to another
// register and back around every call by gcc 12, and an array of accumulators lives on the stack).
NEURONPACK_VNNI_TARGET inline void dpwssd(__m512i& acc, __m512i a, __m512i b) {
  __asm__("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
}

// y[m * ldy + j] (+)= s[m] * (q[m] . w_j[0..len)) for the R rows of q (ld apart) and the two weight rows w0, w1
// (j = 0, 1): each load of q feeds both weight rows, each widened weight vector R rows. Named accumulators (a<m>,
// b<m>), the unused ones optimised away.
template <int R>
NEURONPACK_VNNI_TARGET void pair_rows(const int8_t* w0, const int8_t* w1, const int16_t* q, int64_t ld, int64_t len,
                                      const float* s, float* y, int64_t ldy, int64_t pf, bool add) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, b0 = a0,
          b1 = a0, b2 = a0, b3 = a0, b4 = a0, b5 = a0, b6 = a0, b7 = a0;
  for (int64_t k = 0; k < len; k += 32) {
    if (pf && k % 64 == 0) {
      _mm_prefetch(reinterpret_cast<const char*>(w0 + k + pf), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(w1 + k + pf), _MM_HINT_T1);
    }
    const __m512i v0 = widen32(w0 + k, len - k), v1 = widen32(w1 + k, len - k);
#define NEURONPACK_ROW(M)                                                              \
  if constexpr (R > M) {                                                               \
    const __m512i xv = _mm512_loadu_si512(q + M * ld + k); /* zero padded: no mask */ \
    dpwssd(a##M, xv, v0), dpwssd(b##M, xv, v1);                                        \
  }
    NEURONPACK_ROW(0) NEURONPACK_ROW(1) NEURONPACK_ROW(2) NEURONPACK_ROW(3)
    NEURONPACK_ROW(4) NEURONPACK_ROW(5) NEURONPACK_ROW(6) NEURONPACK_ROW(7)
#undef NEURONPACK_ROW
  }
  const __m512i acc[16] = {a0, b0, a1, b1, a2, b2, a3, b3, a4, b4, a5, b5, a6, b6, a7, b7};
  alignas(64) float sums[16];
  if constexpr (R > 4) {  // 16 sums out of one shuffle tree
    __m512 v[16];
    for (int i = 0; i < 16; ++i) v[i] = _mm512_cvtepi32_ps(acc[i]);
    _mm512_store_ps(sums, sum16(v));
  } else {
    for (int i = 0; i < 2 * R; ++i) sums[i] = _mm512_reduce_add_ps(_mm512_cvtepi32_ps(acc[i]));
  }
  for (int m = 0; m < R; ++m) {
    y[m * ldy] = (add ? y[m * ldy] : 0.f) + s[m] * sums[2 * m];
    y[m * ldy + 1] = (add ? y[m * ldy + 1] : 0.f) + s[m] * sums[2 * m + 1];
  }
}

using PairFn = void (*)(const int8_t*, const int8_t*, const int16_t*, int64_t, int64_t, const float*, float*, int64_t,
                        int64_t, bool);

PairFn pair_for(int rows) {
  switch (rows) {
    case 1: return pair_rows<1>;
    case 2: return pair_rows<2>;
    case 3: return pair_rows<3>;
    case 4: return pair_rows<4>;
    case 5: return pair_rows<5>;
    case 6: return pair_rows<6>;
    case 7: return pair_rows<7>;
    default: return pair_rows<8>;
  }
}

}  // namespace

bool int8_rows_times_weight(const float* x, int64_t M, int64_t K, const int8_t* w, int64_t N, float* out) {
  thread_local std::vector<int16_t> scratch;
  std::vector<int16_t>& q = scratch;  // this thread's (the workers below read it)
  std::vector<float> scale(M);
  int64_t Kp = 0;
  if (!quantize_rows(x, M, K, q, Kp, scale.data())) return false;
  const int chunk = static_cast<int>(std::min<int64_t>(kChunk, M));
  const int64_t fits = std::min(kMaxBlock, kBlockBytes / 2 / chunk) / 32 * 32;  // a multiple of 32
  const int64_t block = std::min<int64_t>(Kp, std::max<int64_t>(32, fits));
  const int64_t chunks = (M + chunk - 1) / chunk;
  const int64_t ahead = std::max<int64_t>(kPrefetchBytes, 4 * K);  // two pairs of rows or more on
  for (int64_t kb = 0; kb < K; kb += block) {
    const int64_t len = std::min(block, K - kb);
    at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; n += 2) {
        const int8_t* w0 = w + n * K + kb;
        const int8_t* w1 = n + 1 < n1 ? w0 + K : w0;  // an odd last row pairs with itself (its second sum dropped)
        const int64_t pf = (n + 2) * K + kb + ahead + K <= N * K ? ahead : 0;
        for (int64_t c = 0; c < chunks; ++c) {
          const int rows = static_cast<int>(std::min<int64_t>(chunk, M - c * chunk));
          float pair_out[2 * kChunk] = {};
          float* y = out + c * chunk * N + n;
          const bool odd = n + 1 >= n1;
          // an odd last row writes its pair's second sums into pair_out (dropped), not past the row
          float* dst = odd ? pair_out : y;
          const int64_t ldy = odd ? 2 : N;
          if (odd && kb > 0)
            for (int m = 0; m < rows; ++m) pair_out[2 * m] = y[m * N];
          pair_for(rows)(w0, w1, q.data() + c * chunk * Kp + kb, Kp, len, scale.data() + c * chunk, dst, ldy,
                         c == 0 ? pf : 0, kb > 0);
          if (odd)
            for (int m = 0; m < rows; ++m) y[m * N] = pair_out[2 * m];
        }
      }
    });
  }
  return true;
}

#else
bool int8_rows_times_weight(const float*, int64_t, int64_t, const int8_t*, int64_t, float*) { return false; }
#endif  // NEURONPACK_AVX512
