// Many rows of float32 or bfloat16 x (a prefill) against int8 weights (NxD Inference's weight-only format) as integer
// GEMMs: torch's at::_int_mm (oneDNN's int8 matmul, AVX512_VNNI / AMX where the CPU has them) multiplies 4 int8 pairs
// per lane where a float32 GEMM multiplies 1, so it runs ~4x float32's rate (SmolLM2's layer shapes, 1 thread, Zen 4:
// ~380 against ~95 GOP/s). The weights are never converted: the float path before this converted every weight to
// x's dtype on each call, which for bfloat16 x cost more than the GEMM itself at short prompts (bench/int8_prefill.py).
// The prefill's time to first token against llama.cpp's: bench/peers.py, docs/portable-backend.md.
//
// Precision: each row of x is written as two int8 rows, x[m] ~ s1 * q1 + s2 * q2: q1 = round(x[m] / s1) with
// s1 = max|x[m]| / 127, and q2 the same of the remainder x[m] - s1 * q1 (at most s1 / 2, so s2 <= s1 / 254). Each
// element then carries an error of at most max|x[m]| / 64516 (~2^-16), the bound of int8_rows.cpp's int16 rounding
// for 2-16 rows: a prompt's KV comes out as its decode steps' would. One int8 row alone (vLLM's W8A8 per-token)
// raises SmolLM2's mean KL to the float model ten times over, and to the bfloat16 model too (bench/int8_prefill.py,
// docs/quantize.md); two cost one GEMM of 2M rows, ~2x float32's rate and about bfloat16's. The integer sums are
// exact (int32: |q| * |w| <= 127 * 127 per product, kMaxK products); y is rounded once, to x's dtype.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "int8_row.h"

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
      if constexpr (!std::is_same_v<T, float>)
        for (int64_t n = 0; n < N; ++n) out[m * N + n] = static_cast<T>(y[n]);
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

}  // namespace

bool int8_gemm(const at::Tensor& x, const at::Tensor& weight, const float* scale, int64_t scale_n, const float* bias,
               at::Tensor& out) {
  const int64_t K = x.size(-1), M = x.numel() / K;
  // K = 1: torch 2.13's at::_int_mm gives wrong sums for the [1, N] view weight.t() is then (strides 1, 1)
  if (K > kMaxK || K < 2) return false;
  if (x.scalar_type() == at::kBFloat16)
    return int8_gemm_of(x.data_ptr<at::BFloat16>(), M, K, weight, scale, scale_n, bias, out.data_ptr<at::BFloat16>());
  return int8_gemm_of(x.data_ptr<float>(), M, K, weight, scale, scale_n, bias, out.data_ptr<float>());
}
