// neuronpack's decode linears: y = x @ weight.T for a few rows of x, at the cost of reading the weight once.
//
// A decode step multiplies 1..16 rows by each weight. BLAS GEMV/GEMM kernels read these weights at ~55-60% of the
// machine's streaming read bandwidth on one thread (MKL on AMD, oneDNN's packed layout alike); this kernel walks
// each plain [out, in] weight row once, front to back (one sequential stream, the pattern a plain sum reads at full
// bandwidth), and dots it with every row of x while it is in the registers. float32, bfloat16 and int8 (NxD
// Inference's weight-only format, per-channel float32 scale) weights; accumulation in float32. One row of x reads
// two weight rows far apart at once (two streams; int8 goes through the integer dot products of int8_row.cpp where
// the CPU has them); 2+ rows prefetch into L2 ahead of the row being read, and rows of x too long to fit L1 together
// go a block of K at a time; 6+ rows take two weight rows per pass (each load of x feeds two FMAs, and with 8 rows
// the 16 sums come out of one shuffle tree); bfloat16 uses vdpbf16ps where the CPU has it, two weight rows per pass
// against 8 rows of x.
// Threads (torch's OpenMP team) split the weight rows.
// Measured in docs/portable-backend.md (bench/linears.py).
//
// More rows (a prefill) or a CPU without AVX-512: at::linear, the same GEMM F.linear runs; up to 256 float32 rows
// oneDNN's matmul (many_float_rows); int8 weights against float32 or bfloat16 x, int8_gemm.cpp's integer GEMMs.
// Built for torch's CPU capability by neuronpack/kernels/__init__.py; registered as torch.ops.neuronpack.linear /
// linear_int8.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "int8_row.h"
#include "simd.h"

namespace {

#ifdef NEURONPACK_AVX512
using namespace neuronpack_simd;
#endif

constexpr int64_t kMaxRows = 16;  // up to this many rows of x: the kernel below; more: at::linear
constexpr int64_t kOneDnnMaxRows = 256;  // float32: up to this many rows oneDNN's matmul (many_float_rows)
constexpr int kChunk = 8;         // rows of x dotted with a weight row at a time (accumulators in registers)
// Prefetch (into L2) the weight bytes this far ahead of the row being read. With many rows of x a row takes long
// enough that the hardware prefetcher falls behind (8 rows: 1.8x slower from DRAM than from L3 without this; with
// it, within ~1.25x); with one row it costs nothing.
constexpr int64_t kPrefetchBytes = 8192;
constexpr int64_t kL1Floats = 6144;  // 24 KiB of the 32 KiB L1 for the rows of x

#ifdef NEURONPACK_AVX512

// int8 weights widened to 16 float32 lanes (float32 and bfloat16: simd.h).
struct I8 {
  using T = int8_t;
  static __m512 widen(__m128i v) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v)); }
  static __m512 load(const T* p) { return widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static __m512 load(const T* p, __mmask16 m) { return widen(_mm_maskz_loadu_epi8(m, p)); }
};

// Prefetch (into L2) the cache line ``pf`` elements ahead of w[k], once per line.
template <class W>
inline void prefetch_line(const typename W::T* w, int64_t k, int64_t pf) {
  if ((k * static_cast<int64_t>(sizeof(typename W::T))) % 64 == 0)
    _mm_prefetch(reinterpret_cast<const char*>(w + k + pf), _MM_HINT_T1);
}

// y[m * ldy] (+)= dot(w[0..len), x[m * ld ...]) for MB rows of x (float32, rows ld apart; ``add``: accumulate into
// y, for a block of K after the first). U accumulators per row of x keep the FMA chains independent when MB is small.
template <class W, int MB, int U>
inline void dot_rows(const typename W::T* w, const float* x, int64_t ld, int64_t len, float* y, int64_t ldy,
                     int64_t pf, bool add) {
  __m512 acc[MB][U];
  for (int m = 0; m < MB; ++m)
    for (int u = 0; u < U; ++u) acc[m][u] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 * U <= len; k += 16 * U) {
    if (pf) prefetch_line<W>(w, k, pf);
    for (int u = 0; u < U; ++u) {
      const __m512 wv = W::load(w + k + 16 * u);
      for (int m = 0; m < MB; ++m)
        acc[m][u] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + m * ld + k + 16 * u), acc[m][u]);
    }
  }
  for (; k < len; k += 16) {
    const __mmask16 mask = tail_mask16(len - k);
    const __m512 wv = W::load(w + k, mask);
    for (int m = 0; m < MB; ++m)
      acc[m][0] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(mask, x + m * ld + k), acc[m][0]);
  }
  for (int m = 0; m < MB; ++m) {
    __m512 s = acc[m][0];
    for (int u = 1; u < U; ++u) s = _mm512_add_ps(s, acc[m][u]);
    y[m * ldy] = (add ? y[m * ldy] : 0.f) + _mm512_reduce_add_ps(s);
  }
}

// The same for two adjacent weight rows at once (y[m * ldy] and y[m * ldy + 1]): each load of x feeds two FMAs,
// which is what bounds many rows of x (8 rows: 9 loads per 8 FMAs with one weight row, 10 per 16 with two).
template <class W, int MB>
inline void dot_rows_pair(const typename W::T* w, const float* x, int64_t ld, int64_t len, float* y, int64_t ldy,
                          int64_t pf, bool add) {
  const typename W::T* w1 = w + ld;
  __m512 a[MB], b[MB];
  for (int m = 0; m < MB; ++m) a[m] = b[m] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= len; k += 16) {
    if (pf) {
      prefetch_line<W>(w, k, pf);
      prefetch_line<W>(w1, k, pf);
    }
    const __m512 v0 = W::load(w + k), v1 = W::load(w1 + k);
    for (int m = 0; m < MB; ++m) {
      __m512 xv = _mm512_loadu_ps(x + m * ld + k);
      __asm__("" : "+v"(xv));  // one load of x into a register for both FMAs (not folded into each FMA: 2 loads)
      a[m] = _mm512_fmadd_ps(v0, xv, a[m]);
      b[m] = _mm512_fmadd_ps(v1, xv, b[m]);
    }
  }
  if (k < len) {
    const __mmask16 mask = tail_mask16(len - k);
    const __m512 v0 = W::load(w + k, mask), v1 = W::load(w1 + k, mask);
    for (int m = 0; m < MB; ++m) {
      const __m512 xv = _mm512_maskz_loadu_ps(mask, x + m * ld + k);
      a[m] = _mm512_fmadd_ps(v0, xv, a[m]);
      b[m] = _mm512_fmadd_ps(v1, xv, b[m]);
    }
  }
  if constexpr (MB == 8) {  // 16 sums at once: a third of the instructions of 16 separate reductions
    alignas(64) float sums[16];
    const __m512 v[16] = {a[0], b[0], a[1], b[1], a[2], b[2], a[3], b[3], a[4], b[4], a[5], b[5], a[6], b[6], a[7], b[7]};
    _mm512_store_ps(sums, sum16(v));
    for (int m = 0; m < MB; ++m) {
      y[m * ldy] = (add ? y[m * ldy] : 0.f) + sums[2 * m];
      y[m * ldy + 1] = (add ? y[m * ldy + 1] : 0.f) + sums[2 * m + 1];
    }
    return;
  }
  for (int m = 0; m < MB; ++m) {
    y[m * ldy] = (add ? y[m * ldy] : 0.f) + _mm512_reduce_add_ps(a[m]);
    y[m * ldy + 1] = (add ? y[m * ldy + 1] : 0.f) + _mm512_reduce_add_ps(b[m]);
  }
}

// One row of x against two weight rows far apart (two read streams: one stream alone reads below the bandwidth).
template <class W>
inline void dot_two_streams(const typename W::T* w0, const typename W::T* w1, const float* x, int64_t K, float* y0,
                            float* y1) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, b0 = a0, b1 = a0;
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    const __m512 x0 = _mm512_loadu_ps(x + k), x1 = _mm512_loadu_ps(x + k + 16);
    a0 = _mm512_fmadd_ps(W::load(w0 + k), x0, a0);
    b0 = _mm512_fmadd_ps(W::load(w1 + k), x0, b0);
    a1 = _mm512_fmadd_ps(W::load(w0 + k + 16), x1, a1);
    b1 = _mm512_fmadd_ps(W::load(w1 + k + 16), x1, b1);
  }
  for (; k < K; k += 16) {
    const __mmask16 mask = tail_mask16(K - k);
    const __m512 xv = _mm512_maskz_loadu_ps(mask, x + k);
    a0 = _mm512_fmadd_ps(W::load(w0 + k, mask), xv, a0);
    b0 = _mm512_fmadd_ps(W::load(w1 + k, mask), xv, b0);
  }
  *y0 = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
  *y1 = _mm512_reduce_add_ps(_mm512_add_ps(b0, b1));
}

template <class W>
using DotFn = void (*)(const typename W::T*, const float*, int64_t, int64_t, float*, int64_t, int64_t, bool);

template <class W>
DotFn<W> dot_for(int rows) {
  switch (rows) {
    case 1: return dot_rows<W, 1, 4>;
    case 2: return dot_rows<W, 2, 2>;
    case 3: return dot_rows<W, 3, 2>;
    case 4: return dot_rows<W, 4, 1>;
    case 5: return dot_rows<W, 5, 1>;
    case 6: return dot_rows<W, 6, 1>;
    case 7: return dot_rows<W, 7, 1>;
    default: return dot_rows<W, 8, 1>;
  }
}

template <class W>
DotFn<W> pair_for(int rows) {  // rows >= 4 (fewer rows: one weight row at a time is not bound by loads of x)
  switch (rows) {
    case 4: return dot_rows_pair<W, 4>;
    case 5: return dot_rows_pair<W, 5>;
    case 6: return dot_rows_pair<W, 6>;
    case 7: return dot_rows_pair<W, 7>;
    default: return dot_rows_pair<W, 8>;
  }
}

// out [M, N] float32 = x [M, K] float32 @ w [N, K].T. Each weight row is read from memory once and dotted with
// every row of x, a chunk of rows at a time (the row stays in L1 between chunks); a chunk of x stays within L1 too.
// Threads (torch's intra-op pool) split the weight rows.
template <class W>
void rows_times_weight(const float* x, int64_t M, int64_t K, const typename W::T* w, int64_t N, float* out) {
  if (M == 1) {  // rows n and n + half at once; the hardware prefetcher keeps up with one row of x alone
    at::parallel_for(0, N, 32, [&](int64_t n0, int64_t n1) {
      const int64_t half = (n1 - n0) / 2;
      for (int64_t n = n0; n < n0 + half; ++n)
        dot_two_streams<W>(w + n * K, w + (n + half) * K, x, K, out + n, out + n + half);
      for (int64_t n = n0 + 2 * half; n < n1; ++n) dot_rows<W, 1, 4>(w + n * K, x, K, K, out + n, N, 0, false);
    });
    return;
  }
  // Blocks of K small enough that every row of x fits in L1 for the block (kL1Floats): each weight row's block is
  // dotted with every row of x from L1. Without blocks, rows of x longer than L1 holds (8 rows of 1536: 48 KiB) are
  // re-read from L2 for every weight row, and 8 rows cost 2.8x one row instead of 1.4x.
  const int64_t block = M * K <= kL1Floats ? K : std::max<int64_t>(64, kL1Floats / M / 16 * 16);
  const int chunk = static_cast<int>(std::min<int64_t>(kChunk, M));
  const int full = static_cast<int>(M / chunk), tail = static_cast<int>(M % chunk);
  const DotFn<W> dot_full = dot_for<W>(chunk), dot_tail = dot_for<W>(tail);
  // From 2 rows of x a row takes long enough to compute that the hardware prefetcher falls behind: prefetch.
  const bool pairs = M >= 6 && chunk >= 4;  // two weight rows per pass (fewer rows: one at a time measured faster)
  const int step = pairs ? 2 : 1;
  const DotFn<W> pair_full = pairs ? pair_for<W>(chunk) : nullptr;
  const DotFn<W> pair_tail = pairs && tail >= 4 ? pair_for<W>(tail) : nullptr;
  // elements ahead: the same place (row and block offset) two or more steps on, at least kPrefetchBytes
  const int64_t per_step = step * K, min_ahead = kPrefetchBytes / static_cast<int64_t>(sizeof(typename W::T));
  const int64_t ahead = per_step * std::max<int64_t>(2, (min_ahead + per_step - 1) / per_step);
  for (int64_t kb = 0; kb < K; kb += block) {
    const int64_t len = std::min(block, K - kb);
    const bool add = kb > 0;
    const float* xb = x + kb;
    at::parallel_for(0, N, 32, [&](int64_t n0, int64_t n1) {
      int64_t n = n0;
      for (; n + step <= n1; n += step) {
        const typename W::T* row = w + n * K + kb;
        // prefetch on the first pass over the row only (later chunks of x re-read it from L1); not past the end
        const int64_t pf = (n + step) * K + ahead + K <= N * K ? ahead : 0;
        for (int c = 0; c < full; ++c) {
          const float* xc = xb + c * chunk * K;
          float* yc = out + c * chunk * N + n;
          const int64_t pfc = c == 0 ? pf : 0;
          if (pairs) pair_full(row, xc, K, len, yc, N, pfc, add); else dot_full(row, xc, K, len, yc, N, pfc, add);
        }
        if (tail) {
          const float* xc = xb + full * chunk * K;
          float* yc = out + full * chunk * N + n;
          const int64_t pft = full == 0 ? pf : 0;
          if (pair_tail) pair_tail(row, xc, K, len, yc, N, pft, add);
          else {
            dot_tail(row, xc, K, len, yc, N, pft, add);
            if (pairs) dot_tail(row + K, xc, K, len, yc + 1, N, pft, add);
          }
        }
      }
      for (; n < n1; ++n) {  // an odd last row
        const typename W::T* row = w + n * K + kb;
        for (int c = 0; c < full; ++c) dot_full(row, xb + c * chunk * K, K, len, out + c * chunk * N + n, N, 0, add);
        if (tail) dot_tail(row, xb + full * chunk * K, K, len, out + full * chunk * N + n, N, 0, add);
      }
    });
  }
}

// bfloat16 weights and bfloat16 rows of x on CPUs with AVX512_BF16: vdpbf16ps multiplies 32 pairs and adds them
// into 16 float32 lanes in one instruction, with no conversion of the weight (the widening kernel above spends 3
// instructions per 16 weights and falls short of the read bandwidth). Products of two bfloat16 are exact in float32.
#define NEURONPACK_BF16_TARGET __attribute__((target("avx512bf16,avx512bw,avx512vl,avx512f")))

NEURONPACK_BF16_TARGET inline __m512 bf16_dot(__m512 acc, const uint16_t* a, const uint16_t* b, __mmask32 m) {
  return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_maskz_loadu_epi16(m, a), (__m512bh)_mm512_maskz_loadu_epi16(m, b));
}

// y[m * ldy] = dot(w_row, x[m]) for MB rows of x (bfloat16, contiguous [MB, K]).
template <int MB>
NEURONPACK_BF16_TARGET void bf16_rows(const uint16_t* w, const uint16_t* x, int64_t K, float* y, int64_t ldy,
                                      int64_t pf) {
  constexpr int U = MB == 1 ? 2 : 1;
  __m512 acc[MB][U];
  for (int m = 0; m < MB; ++m)
    for (int u = 0; u < U; ++u) acc[m][u] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 * U <= K; k += 32 * U) {
    if (pf) _mm_prefetch(reinterpret_cast<const char*>(w + k + pf), _MM_HINT_T1);
    for (int u = 0; u < U; ++u) {
      __m512i wv = _mm512_loadu_si512(w + k + 32 * u);
      for (int m = 0; m < MB; ++m)
        acc[m][u] = _mm512_dpbf16_ps(acc[m][u], (__m512bh)_mm512_loadu_si512(x + m * K + k + 32 * u), (__m512bh)wv);
    }
  }
  for (; k < K; k += 32)
    for (int m = 0; m < MB; ++m) acc[m][0] = bf16_dot(acc[m][0], x + m * K + k, w + k, tail_mask32(K - k));
  for (int m = 0; m < MB; ++m) {
    __m512 s = acc[m][0];
    for (int u = 1; u < U; ++u) s = _mm512_add_ps(s, acc[m][u]);
    y[m * ldy] = _mm512_reduce_add_ps(s);
  }
}

// One row of x against rows n and n + half at once (two read streams), as for float weights.
NEURONPACK_BF16_TARGET void bf16_two_streams(const uint16_t* w0, const uint16_t* w1, const uint16_t* x, int64_t K,
                                             float* y0, float* y1) {
  __m512 a = _mm512_setzero_ps(), b = a;
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + k);
    a = _mm512_dpbf16_ps(a, xv, (__m512bh)_mm512_loadu_si512(w0 + k));
    b = _mm512_dpbf16_ps(b, xv, (__m512bh)_mm512_loadu_si512(w1 + k));
  }
  if (k < K) {
    a = bf16_dot(a, x + k, w0 + k, tail_mask32(K - k));
    b = bf16_dot(b, x + k, w1 + k, tail_mask32(K - k));
  }
  *y0 = _mm512_reduce_add_ps(a);
  *y1 = _mm512_reduce_add_ps(b);
}

// y[m * ldy + j] = dot(w_row j, x[m]) for two adjacent weight rows (j = 0, 1) and 8 rows of x: each load of x feeds
// two vdpbf16ps (one weight row at a time: 9 loads per 8, which loads bound), and the 16 sums come out of one tree.
NEURONPACK_BF16_TARGET void bf16_rows_pair8(const uint16_t* w, const uint16_t* x, int64_t K, float* y, int64_t ldy,
                                            int64_t pf) {
  const uint16_t* w1 = w + K;
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    if (pf) {
      _mm_prefetch(reinterpret_cast<const char*>(w + k + pf), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(w1 + k + pf), _MM_HINT_T1);
    }
    const __m512bh v0 = (__m512bh)_mm512_loadu_si512(w + k), v1 = (__m512bh)_mm512_loadu_si512(w1 + k);
    for (int m = 0; m < 8; ++m) {
      __m512i xv = _mm512_loadu_si512(x + m * K + k);
      __asm__("" : "+v"(xv));  // one load of x for both instructions
      acc[2 * m] = _mm512_dpbf16_ps(acc[2 * m], (__m512bh)xv, v0);
      acc[2 * m + 1] = _mm512_dpbf16_ps(acc[2 * m + 1], (__m512bh)xv, v1);
    }
  }
  if (k < K)
    for (int m = 0; m < 8; ++m) {
      acc[2 * m] = bf16_dot(acc[2 * m], x + m * K + k, w + k, tail_mask32(K - k));
      acc[2 * m + 1] = bf16_dot(acc[2 * m + 1], x + m * K + k, w1 + k, tail_mask32(K - k));
    }
  alignas(64) float sums[16];
  _mm512_store_ps(sums, sum16(acc));
  for (int m = 0; m < 8; ++m) {
    y[m * ldy] = sums[2 * m];
    y[m * ldy + 1] = sums[2 * m + 1];
  }
}

using Bf16Fn = void (*)(const uint16_t*, const uint16_t*, int64_t, float*, int64_t, int64_t);

Bf16Fn bf16_for(int rows) {
  switch (rows) {
    case 1: return bf16_rows<1>;
    case 2: return bf16_rows<2>;
    case 3: return bf16_rows<3>;
    case 4: return bf16_rows<4>;
    case 5: return bf16_rows<5>;
    case 6: return bf16_rows<6>;
    case 7: return bf16_rows<7>;
    default: return bf16_rows<8>;
  }
}

// out [M, N] float32 = x [M, K] bfloat16 @ w [N, K] bfloat16 .T (chunks of 8 rows of x; prefetch from 2 rows up).
void bf16_rows_times_weight(const uint16_t* x, int64_t M, int64_t K, const uint16_t* w, int64_t N, float* out) {
  if (M == 1) {
    at::parallel_for(0, N, 32, [&](int64_t n0, int64_t n1) {
      const int64_t half = (n1 - n0) / 2;
      for (int64_t n = n0; n < n0 + half; ++n)
        bf16_two_streams(w + n * K, w + (n + half) * K, x, K, out + n, out + n + half);
      for (int64_t n = n0 + 2 * half; n < n1; ++n) bf16_rows<1>(w + n * K, x, K, out + n, N, 0);
    });
    return;
  }
  const int full = static_cast<int>(M / kChunk), tail = static_cast<int>(M % kChunk);
  const Bf16Fn dot_full = bf16_for(kChunk), dot_tail = bf16_for(tail);
  const int64_t ahead = std::max<int64_t>(kPrefetchBytes / 2, 2 * K);
  at::parallel_for(0, N, 32, [&](int64_t n0, int64_t n1) {
    int64_t n = n0;
    for (; full && n + 2 <= n1; n += 2) {  // two weight rows per pass against each full chunk of 8 rows of x
      const uint16_t* row = w + n * K;
      const int64_t pf = (n + 2) * K + ahead + K <= N * K ? ahead : 0;
      for (int c = 0; c < full; ++c) bf16_rows_pair8(row, x + c * kChunk * K, K, out + c * kChunk * N + n, N, c ? 0 : pf);
      if (tail)
        for (int j = 0; j < 2; ++j) dot_tail(row + j * K, x + full * kChunk * K, K, out + full * kChunk * N + n + j, N, 0);
    }
    for (; n < n1; ++n) {
      const uint16_t* row = w + n * K;
      const int64_t pf = (n + 1) * K + ahead + K <= N * K ? ahead : 0;
      for (int c = 0; c < full; ++c) dot_full(row, x + c * kChunk * K, K, out + c * kChunk * N + n, N, c ? 0 : pf);
      if (tail) dot_tail(row, x + full * kChunk * K, K, out + full * kChunk * N + n, N, full ? 0 : pf);
    }
  });
}

// set_dot_products(False): the widening kernels for bfloat16 and int8 (tests run both).
std::atomic<bool> dot_products_enabled{true};

bool cpu_has_bf16_dot() {
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has && dot_products_enabled.load(std::memory_order_relaxed);
}

bool cpu_has_int8_dot() {
  static const bool has = __builtin_cpu_supports("avx512vnni");
  return has && dot_products_enabled.load(std::memory_order_relaxed);
}

#endif  // NEURONPACK_AVX512

bool kernel_applies(const at::Tensor& x, const at::Tensor& weight) {
#ifdef NEURONPACK_AVX512
  const int64_t K = x.size(-1);
  return x.device().is_cpu() && weight.device().is_cpu() && weight.dim() == 2 && weight.is_contiguous() &&
         weight.size(1) == K && K > 0 && x.numel() > 0 && x.numel() / K <= kMaxRows &&
         (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16);
#else
  (void)x;
  (void)weight;
  return false;
#endif
}

// The wrappers below keep per-call ATen work to one allocation (the output; a copy of x only when it is not
// contiguous): a decode step makes ~200 of these calls, and each ATen op costs about a microsecond.

std::vector<int64_t> out_sizes(const at::Tensor& x, int64_t N) {
  std::vector<int64_t> sizes(x.sizes().begin(), x.sizes().end());
  sizes.back() = N;
  return sizes;
}

// x's rows as contiguous float32 [M, K]: x's own memory when it is that already, else converted into ``scratch``.
const float* float_rows(const at::Tensor& x, std::vector<float>& scratch) {
  if (x.scalar_type() == at::kFloat) return x.data_ptr<float>();
  const at::BFloat16* p = x.data_ptr<at::BFloat16>();
  scratch.resize(x.numel());
  for (int64_t i = 0; i < x.numel(); ++i) scratch[i] = static_cast<float>(p[i]);
  return scratch.data();
}

#ifdef NEURONPACK_AVX512
// y = acc (float32 [M, N]) * scale[n] (optional) + bias[n] (optional), in float32, then rounded once to y's dtype
// (bfloat16: round to nearest even, NaN to 0x7fc0, as c10::BFloat16). 16 outputs per instruction.
void finish(const float* acc, int64_t M, int64_t N, const float* scale, int64_t scale_n,
            const std::optional<at::Tensor>& bias, at::Tensor& y) {
  at::Tensor bias_f;
  if (bias.has_value() && bias->defined()) bias_f = bias->to(at::kFloat).contiguous();
  const float* b = bias_f.defined() ? bias_f.data_ptr<float>() : nullptr;
  const bool to_bf16 = y.scalar_type() == at::kBFloat16;
  char* out = static_cast<char*>(y.data_ptr());
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; n += 16) {
      const __mmask16 mask = tail_mask16(N - n);
      __m512 v = _mm512_maskz_loadu_ps(mask, acc + m * N + n);
      if (scale) v = _mm512_mul_ps(v, scale_n == 1 ? _mm512_set1_ps(scale[0]) : _mm512_maskz_loadu_ps(mask, scale + n));
      if (b) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, b + n));
      if (to_bf16) {
        _mm256_mask_storeu_epi16(out + (m * N + n) * 2, mask, _mm512_cvtepi32_epi16(bf16_bits(v)));
      } else {
        _mm512_mask_storeu_ps(out + (m * N + n) * 4, mask, v);
      }
    }
  }
}
#endif

// float32 rows past the kernel's, up to kOneDnnMaxRows (a short prefill): oneDNN's matmul on the plain weight,
// torch's own op (the one its compiler calls for CPU linears), where MKL's sgemm (at::linear) runs ~8% slower on
// weights read from memory (SmolLM2's layer shapes, 41 rows, 1 thread, Zen 4: 74.6 against 69.2 GFLOP/s; its
// 41-token prefill 122 against 136 ms, 128 tokens 308 against 335 ms). At 494 rows the prefill ran slower on it
// (1744 against 1453 ms) though the same linears alone did not: MKL from kOneDnnMaxRows up.
at::Tensor many_float_rows(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  static const auto op = c10::Dispatcher::singleton().findSchema({"mkldnn::_linear_pointwise", ""});
  if (!op.has_value()) return at::linear(x, weight, bias);
  const bool has_bias = bias.has_value() && bias->defined();
  torch::jit::Stack stack{x.contiguous(), weight, has_bias ? c10::IValue(*bias) : c10::IValue(), std::string("none"),
                          c10::List<std::optional<at::Scalar>>(), c10::IValue()};
  op->callBoxed(&stack);
  return stack[0].toTensor();
}

at::Tensor linear(const at::Tensor& x_in, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  const bool same_dtypes = weight.scalar_type() == x_in.scalar_type() &&
                           !(bias.has_value() && bias->defined() && bias->scalar_type() != x_in.scalar_type());
  if (same_dtypes && x_in.scalar_type() == at::kFloat && x_in.device().is_cpu() && weight.device().is_cpu() &&
      weight.dim() == 2 && weight.is_contiguous() && x_in.size(-1) == weight.size(1) && x_in.size(-1) > 0 &&
      x_in.numel() / x_in.size(-1) > kMaxRows && x_in.numel() / x_in.size(-1) <= kOneDnnMaxRows)
    return many_float_rows(x_in, weight, bias);
  if (!kernel_applies(x_in, weight) || !same_dtypes) return at::linear(x_in, weight, bias);
#ifdef NEURONPACK_AVX512
  const at::Tensor x = x_in.is_contiguous() ? x_in : x_in.contiguous();
  const int64_t N = weight.size(0), K = weight.size(1), M = x.numel() / K;
  at::Tensor y = at::empty(out_sizes(x, N), x.options());
  const bool direct = x.scalar_type() == at::kFloat && !(bias.has_value() && bias->defined());
  thread_local std::vector<float> acc_buffer, x_buffer;
  if (!direct) acc_buffer.resize(M * N);
  float* acc = direct ? y.data_ptr<float>() : acc_buffer.data();
  if (weight.scalar_type() == at::kFloat) {
    rows_times_weight<F32>(x.data_ptr<float>(), M, K, weight.data_ptr<float>(), N, acc);
  } else if (cpu_has_bf16_dot()) {  // x stays bfloat16
    bf16_rows_times_weight(reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()), M, K,
                           reinterpret_cast<const uint16_t*>(weight.data_ptr<at::BFloat16>()), N, acc);
  } else {
    rows_times_weight<BF16>(float_rows(x, x_buffer), M, K,
                            reinterpret_cast<const uint16_t*>(weight.data_ptr<at::BFloat16>()), N, acc);
  }
  if (!direct) finish(acc, M, N, nullptr, 0, bias, y);
  return y;
#else
  return at::linear(x_in, weight, bias);
#endif
}

// More rows than the kernel takes, float32 or bfloat16 x against a plain int8 [N, K] weight: int8_gemm.cpp's integer
// GEMMs, which never convert the weights (the float path below converts all of them to x's dtype on every call: for
// bfloat16 x that cost more than the GEMM at short prompts, bench/int8_prefill.py).
bool many_int8_rows(const at::Tensor& x, const at::Tensor& weight) {
  const int64_t K = x.size(-1);
  return x.device().is_cpu() && weight.device().is_cpu() &&
         (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) && weight.scalar_type() == at::kChar &&
         weight.dim() == 2 && weight.is_contiguous() && weight.size(1) == K && K > 0 && x.numel() / K > kMaxRows;
}

// Weight-only int8: (x @ weight.T) * scale + bias in float32, then x's dtype. scale: [N, 1], [N] or [1].
at::Tensor linear_int8(const at::Tensor& x_in, const at::Tensor& weight, const at::Tensor& scale,
                       const std::optional<at::Tensor>& bias) {
  const int64_t N = weight.size(0);
  const bool has_bias = bias.has_value() && bias->defined();
  if (many_int8_rows(x_in, weight) &&
      (!has_bias || bias->scalar_type() == at::kFloat || bias->scalar_type() == x_in.scalar_type())) {
    // a prefill: integer GEMMs (int8_gemm.cpp), unless x holds an inf or a NaN
    const at::Tensor x = x_in.contiguous();
    const at::Tensor s = scale.to(at::kFloat).contiguous();
    const at::Tensor b = has_bias ? bias->to(at::kFloat).contiguous() : at::Tensor();
    at::Tensor y = at::empty(out_sizes(x, N), x.options());
    if (int8_gemm(x, weight, s.data_ptr<float>(), s.numel(), has_bias ? b.data_ptr<float>() : nullptr, y)) return y;
  }
  if (!kernel_applies(x_in, weight) || weight.scalar_type() != at::kChar ||
      (has_bias && bias->scalar_type() != x_in.scalar_type())) {
    // int8 values are exact in any float dtype: only the matmul's accumulation rounds
    at::Tensor y = at::linear(x_in.reshape({-1, x_in.size(-1)}), weight.to(x_in.scalar_type())).to(at::kFloat);
    y = y.mul_(scale.reshape({1, -1}).to(at::kFloat));
    if (bias.has_value() && bias->defined()) y = y.add_(bias->to(at::kFloat));
    return y.to(x_in.scalar_type()).view(out_sizes(x_in, N));
  }
#ifdef NEURONPACK_AVX512
  const at::Tensor x = x_in.is_contiguous() ? x_in : x_in.contiguous();
  const at::Tensor s = scale.scalar_type() == at::kFloat && scale.is_contiguous() ? scale : scale.to(at::kFloat).contiguous();
  const int64_t K = weight.size(1), M = x.numel() / K;
  at::Tensor y = at::empty(out_sizes(x, N), x.options());
  thread_local std::vector<float> acc_buffer, x_buffer;
  acc_buffer.resize(M * N);
  const float* xf = float_rows(x, x_buffer);
  const int8_t* w = weight.data_ptr<int8_t>();
  const bool dot = cpu_has_int8_dot() && (M == 1 ? int8_row_times_weight(xf, K, w, N, acc_buffer.data())
                                                 : int8_rows_times_weight(xf, M, K, w, N, acc_buffer.data()));
  if (!dot) rows_times_weight<I8>(xf, M, K, w, N, acc_buffer.data());
  finish(acc_buffer.data(), M, N, s.data_ptr<float>(), s.numel(), bias, y);
  return y;
#else
  return at::Tensor();
#endif
}

}  // namespace

TORCH_LIBRARY(neuronpack, m) {
  m.def("linear(Tensor x, Tensor weight, Tensor? bias=None) -> Tensor");
  m.def("linear_int8(Tensor x, Tensor weight, Tensor scale, Tensor? bias=None) -> Tensor");
  // how a prefill's bfloat16 rows meet int8 weights (int8_gemm.cpp): -1 default, 0 bfloat16 tiles, 1 two int8 rows;
  // returns the old setting
  m.def("set_int8_bf16_prefill(int mode) -> int",
        [](int64_t mode) { return int64_t{int8_bf16_prefill(static_cast<int>(mode))}; });
#ifdef NEURONPACK_AVX512
  m.def("has_kernel() -> bool", []() { return true; });  // whether this build has the kernel (else: at::linear)
  // whether bfloat16 runs vdpbf16ps and int8 vpdpbusd where the CPU has them (default) or the widening kernels;
  // returns the old setting
  m.def("set_dot_products(bool enabled) -> bool",
        [](bool enabled) { return dot_products_enabled.exchange(enabled); });
  // how int8_row.cpp reads the weights: -1 by CPU, 1 one stream with a prefetch, 0 four streams; the old setting
  m.def("set_int8_one_stream(int mode) -> int",
        [](int64_t mode) { return int64_t{int8_one_stream(static_cast<int>(mode))}; });
#else
  m.def("has_kernel() -> bool", []() { return false; });
  m.def("set_dot_products(bool enabled) -> bool", [](bool enabled) { return false; });
  m.def("set_int8_one_stream(int mode) -> int", [](int64_t mode) { return int64_t{-1}; });
#endif
}

TORCH_LIBRARY_IMPL(neuronpack, CPU, m) {
  m.impl("linear", &linear);
  m.impl("linear_int8", &linear_int8);
}
