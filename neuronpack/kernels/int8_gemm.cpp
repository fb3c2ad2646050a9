// Many rows of float32 or bfloat16 x (a prefill) against int8 weights (NxD Inference's weight-only format), without
// ever converting the whole weight (the float path, before, converted every weight into a fresh matrix of x's dtype
// on each call: for bfloat16 x that cost 2-7x the bfloat16 GEMM itself, bench/int8_prefill.py):
//
// - two int8 rows per row of x through torch's integer GEMM (at::_int_mm: oneDNN's int8 matmul, AVX512_VNNI / AMX
//   where the CPU has them), for float32 x and for up to kTwoRowsMaxRows bfloat16 rows. int8 multiplies 4 pairs per
//   lane where float32 multiplies 1: ~4x float32's rate (SmolLM2's layer shapes, 1 thread, Zen 4: ~380 against ~95
//   GOP/s), so two rows run at ~2x float32's.
// - more bfloat16 rows: the weights converted to bfloat16 a kTileBytes tile at a time (exact: int8 values fit
//   bfloat16), each tile through torch's bfloat16 GEMM (at::mm: oneDNN, AVX512_BF16 / AMX) while it is in the cache.
//   Where bfloat16 GEMMs run about as fast as int8 ones (AMX has both), two rows are twice the work.
// The prefill's time to first token against llama.cpp's: bench/peers.py, docs/portable-backend.md; the choice for
// bfloat16: docs/quantize.md.
//
// Precision of two int8 rows: x[m] ~ s1 * q1 + s2 * q2: q1 = round(x[m] / s1) with s1 = max|x[m]| / 127, and q2 the
// same of the remainder x[m] - s1 * q1 (at most s1 / 2, so s2 <= s1 / 254). Each element then carries an error of at
// most max|x[m]| / 64516 (~2^-16), the bound of int8_rows.cpp's int16 rounding for 2-16 rows: a prompt's KV comes
// out as its decode steps' would. One int8 row alone (vLLM's W8A8 per-token) raises SmolLM2's mean KL to the float32
// model ten times over, and to the bfloat16 model six times (0.041 against 0.0066, bench/int8_prefill.py); two cost
// one GEMM of 2M rows. The integer sums are exact (int32: |q| * |w| <= 127 * 127 per product, kMaxK products); y is
// rounded once, to x's dtype. The tiles are the float path's arithmetic (x and the weights exact, a bfloat16 GEMM
// rounded to bfloat16, then scaled).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "int8_row.h"
#include "simd.h"

namespace {

// Below 2^31 / 127^2 products per sum the int32 sums cannot overflow.
constexpr int64_t kMaxK = 131072;

// Round to the nearest integer (ties to even) for |v| < 2^22, in plain arithmetic the compiler vectorises
// (std::nearbyint is a library call per element here). The reductions below are ``omp simd`` so that they vectorise
// without -ffast-math.
inline float round_even(float v) {
  constexpr float kMagic = 12582912.f;  // 1.5 * 2^23
  return (v + kMagic) - kMagic;
}

// Row m of x as float32: x's own memory, or (bfloat16, exact in float32) converted into ``buffer``.
inline const float* float_row(const float* x, int64_t m, int64_t K, std::vector<float>&) { return x + m * K; }
inline const float* float_row(const at::BFloat16* x, int64_t m, int64_t K, std::vector<float>& buffer) {
  for (int64_t k = 0; k < K; ++k) buffer[k] = static_cast<float>(x[m * K + k]);
  return buffer.data();
}

// q [2M, K]: the rows of q1 then those of q2; s1, s2 [M]. False if x holds an inf or a NaN.
template <class T>
bool split_rows(const T* x, int64_t M, int64_t K, int8_t* q, float* s1, float* s2) {
  std::atomic<bool> finite{true};
  at::parallel_for(0, M, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> rest(K), converted(std::is_same_v<T, float> ? 0 : K);
    for (int64_t m = begin; m < end; ++m) {
      const float* row = float_row(x, m, K, converted);
      float top = 0.f, probe = 0.f;
#pragma omp simd reduction(max : top) reduction(+ : probe)
      for (int64_t k = 0; k < K; ++k) {
        top = std::max(top, std::fabs(row[k]));
        probe += row[k] * 0.f;  // an inf or a NaN makes it a NaN
      }
      if (probe != 0.f) {
        finite = false;
        return;
      }
      const float a = top / 127.f, inv_a = top > 0.f ? 127.f / top : 0.f;
      int8_t* q1 = q + m * K;
      float far = 0.f;
#pragma omp simd reduction(max : far)
      for (int64_t k = 0; k < K; ++k) {
        const float v = round_even(row[k] * inv_a);  // |v| <= 127
        q1[k] = static_cast<int8_t>(v);
        rest[k] = row[k] - v * a;
        far = std::max(far, std::fabs(rest[k]));
      }
      const float b = far / 127.f, inv_b = far > 0.f ? 127.f / far : 0.f;
      int8_t* q2 = q + (M + m) * K;
      for (int64_t k = 0; k < K; ++k) q2[k] = static_cast<int8_t>(round_even(rest[k] * inv_b));
      s1[m] = a;
      s2[m] = b;
    }
  });
  return finite;
}

// n float32 values rounded to bfloat16 as c10::BFloat16 does (to nearest even, NaN to 0x7fc0), 16 at a time where
// the CPU has AVX-512 (a c10::BFloat16 per element is a scalar call chain).
inline void to_bf16(const float* v, int64_t n, at::BFloat16* out) {
  uint16_t* o = reinterpret_cast<uint16_t*>(out);
  int64_t i = 0;
#ifdef NEURONPACK_AVX512
  using namespace neuronpack_simd;
  for (; i < n; i += 16) {
    const __mmask16 mask = tail_mask16(n - i);
    _mm256_mask_storeu_epi16(o + i, mask, _mm512_cvtepi32_epi16(bf16_bits(_mm512_maskz_loadu_ps(mask, v + i))));
  }
#endif
  for (; i < n; ++i) o[i] = c10::BFloat16(v[i]).x;
}

// n int8 values as bfloat16 (exact: |w| <= 128 has at most 8 significant bits), 16 at a time where the CPU has
// AVX-512.
inline void int8_to_bf16(const int8_t* w, int64_t n, at::BFloat16* out) {
  uint16_t* o = reinterpret_cast<uint16_t*>(out);
  int64_t i = 0;
#ifdef NEURONPACK_AVX512
  for (; i < n; i += 16) {
    const __mmask16 mask = neuronpack_simd::tail_mask16(n - i);
    const __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mask, w + i)));
    _mm256_mask_storeu_epi16(o + i, mask, _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(f), 16)));
  }
#endif
  for (; i < n; ++i) o[i] = c10::BFloat16(static_cast<float>(w[i])).x;
}

// y[m] = (s1[m] * sums[m] + s2[m] * sums[M + m]) * scale (+ bias), rounded once to T (bfloat16: to nearest even,
// as c10::BFloat16).
template <class T>
void combine_rows(const int32_t* acc, int64_t M, int64_t N, const float* s1, const float* s2, const float* scale,
                  int64_t scale_n, const float* bias, T* out) {
  at::parallel_for(0, M, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> buffer(std::is_same_v<T, float> ? 0 : N);
    for (int64_t m = begin; m < end; ++m) {
      const int32_t* a1 = acc + m * N;
      const int32_t* a2 = acc + (M + m) * N;
      const float u = s1[m], v = s2[m];
      float* y = std::is_same_v<T, float> ? reinterpret_cast<float*>(out + m * N) : buffer.data();
      if (scale_n == 1) {
        for (int64_t n = 0; n < N; ++n) y[n] = (static_cast<float>(a1[n]) * u + static_cast<float>(a2[n]) * v) * scale[0];
      } else {
        for (int64_t n = 0; n < N; ++n) y[n] = (static_cast<float>(a1[n]) * u + static_cast<float>(a2[n]) * v) * scale[n];
      }
      if (bias)
        for (int64_t n = 0; n < N; ++n) y[n] += bias[n];
      if constexpr (!std::is_same_v<T, float>) to_bf16(y, N, out + m * N);
    }
  });
}

template <class T>
bool int8_gemm_of(const T* x, int64_t M, int64_t K, const at::Tensor& weight, const float* scale, int64_t scale_n,
                  const float* bias, T* out) {
  const int64_t N = weight.size(0);
  at::Tensor q = at::empty({2 * M, K}, at::TensorOptions().dtype(at::kChar));
  std::vector<float> s1(M), s2(M);
  if (!split_rows(x, M, K, q.data_ptr<int8_t>(), s1.data(), s2.data())) return false;
  const at::Tensor sums = at::_int_mm(q, weight.t());  // [2M, N] int32, exact
  combine_rows(sums.data_ptr<int32_t>(), M, N, s1.data(), s2.data(), scale, scale_n, bias, out);
  return true;
}

// bfloat16 x against the weights converted to bfloat16 a tile of kTileBytes at a time (int8 values are exact in
// bfloat16), each tile through torch's bfloat16 GEMM (at::mm: oneDNN, AMX where the CPU has it) while it is in the
// cache: the weights are read once, as int8, and never converted whole (the float path converted every weight into
// a fresh allocation of the whole matrix on each call).
constexpr int64_t kTileBytes = 4 << 20;

void bf16_tiles(const at::Tensor& x, const at::Tensor& weight, const float* scale, int64_t scale_n, const float* bias,
                at::BFloat16* out) {
  const int64_t N = weight.size(0), K = weight.size(1), M = x.numel() / K;
  const int64_t rows = std::min(N, std::max<int64_t>(16, kTileBytes / (2 * K) / 16 * 16));
  at::Tensor tile = at::empty({rows, K}, x.options());
  const int8_t* w = weight.data_ptr<int8_t>();
  for (int64_t n0 = 0; n0 < N; n0 += rows) {
    const int64_t nb = std::min(rows, N - n0);
    at::parallel_for(0, nb, 4, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) int8_to_bf16(w + (n0 + r) * K, K, tile.data_ptr<at::BFloat16>() + r * K);
    });
    const at::Tensor part = at::mm(x.view({M, K}), tile.narrow(0, 0, nb).t());  // [M, nb] bfloat16
    const at::BFloat16* p = part.data_ptr<at::BFloat16>();
    at::parallel_for(0, M, 16, [&](int64_t begin, int64_t end) {
      std::vector<float> y(nb);
      for (int64_t m = begin; m < end; ++m) {
        const uint16_t* row = reinterpret_cast<const uint16_t*>(p + m * nb);
        uint32_t* bits = reinterpret_cast<uint32_t*>(y.data());
        for (int64_t j = 0; j < nb; ++j) bits[j] = static_cast<uint32_t>(row[j]) << 16;  // bfloat16 -> float32
        if (scale_n == 1) {
          for (int64_t j = 0; j < nb; ++j) y[j] *= scale[0];
        } else {
          for (int64_t j = 0; j < nb; ++j) y[j] *= scale[n0 + j];
        }
        if (bias)
          for (int64_t j = 0; j < nb; ++j) y[j] += bias[n0 + j];
        to_bf16(y.data(), nb, out + m * N + n0);
      }
    });
  }
}

// Which path bfloat16 rows take: -1 by the row count (up to kTwoRowsMaxRows two int8 rows, more bfloat16 tiles), 0
// bfloat16 tiles, 1 two int8 rows (set_int8_bf16_prefill: tests and bench/int8_prefill.py run both).
std::atomic<int> bf16_path{-1};
// bench/int8_prefill.py, one thread, an AVX-512 + AMX Xeon, time over the bfloat16 weights' GEMM (paired rounds):
// SmolLM2-1.7B's layer at 41 rows, two int8 rows 0.86, tiles 2.14; at 128 rows 1.83 and 1.75; at 494 rows 2.36 and
// 1.41 (SmolLM2-135M's: 3.99 and 1.44). oneDNN's int8 GEMM gains little on bfloat16's there (AMX has both), and two
// rows are twice the work; at a few rows the tiles' conversion and per-tile calls cost more than that.
constexpr int64_t kTwoRowsMaxRows = 128;

}  // namespace

int int8_bf16_prefill(int mode) { return bf16_path.exchange(mode); }

bool int8_gemm(const at::Tensor& x, const at::Tensor& weight, const float* scale, int64_t scale_n, const float* bias,
               at::Tensor& out) {
  const int64_t K = x.size(-1), M = x.numel() / K;
  // K = 1: torch 2.13's at::_int_mm gives wrong sums for the [1, N] view weight.t() is then (strides 1, 1)
  if (K > kMaxK || K < 2) return false;
  const int path = bf16_path.load(std::memory_order_relaxed);
  if (x.scalar_type() == at::kBFloat16 && (path == 0 || (path < 0 && M > kTwoRowsMaxRows))) {
    bf16_tiles(x, weight, scale, scale_n, bias, out.data_ptr<at::BFloat16>());
    return true;
  }
  if (x.scalar_type() == at::kBFloat16)
    return int8_gemm_of(x.data_ptr<at::BFloat16>(), M, K, weight, scale, scale_n, bias, out.data_ptr<at::BFloat16>());
  return int8_gemm_of(x.data_ptr<float>(), M, K, weight, scale, scale_n, bias, out.data_ptr<float>());
}
