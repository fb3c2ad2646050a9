// neuronpack's int8 kernel for one row of x (int8_row.cpp), called by linear.cpp's linear_int8.
#pragma once

#include <cstdint>

// out [N] float32 = x [K] float32 @ w [N, K] int8 .T through AVX512_VNNI's integer dot products, to within
// max|x| * 2^-31 * sum|w| (the caller checked the CPU has them). False when x holds an inf or a NaN: the caller's
// float kernel then gives float results.
bool int8_row_times_weight(const float* x, int64_t K, const int8_t* w, int64_t N, float* out);

// How the digit kernel reads the weight rows: -1 by CPU (default), 1 one stream with a software prefetch, 0 four
// streams far apart. Returns the old setting.
int int8_one_stream(int mode);

// out [M, N] float32 = x [M, K] float32 @ w [N, K] int8 .T for 2-16 rows, each row of x rounded to int16 with a
// scale of its own (int8_rows.cpp: to within max|x[m]| * 2^-16 per element), through AVX512_VNNI's vpdpwssd (the
// caller checked the CPU has it). False when x holds an inf or a NaN, as above.
bool int8_rows_times_weight(const float* x, int64_t M, int64_t K, const int8_t* w, int64_t N, float* out);

// out [M, N] = (x [M, K] @ weight [N, K] int8 .T) * scale (+ bias) for many rows (a prefill), through at::_int_mm,
// each row of x written as two int8 rows (int8_gemm.cpp: to within max|x[m]| * 2^-16 per element, as
// int8_rows_times_weight). x: contiguous float32 or bfloat16, out: x's dtype and [M, N] elements; scale: [N] or [1]
// (scale_n); bias: float32 [N] or null. False when x holds an inf or a NaN, or K is too long for exact int32 sums (or
// 1): the caller's float path runs instead.
#include <ATen/core/Tensor.h>
bool int8_gemm(const at::Tensor& x, const at::Tensor& weight, const float* scale, int64_t scale_n, const float* bias,
               at::Tensor& out);

// How int8_gemm takes bfloat16 rows: -1 by default, 0 bfloat16 tiles of the weights, 1 two int8 rows. Returns the
// old setting.
int int8_bf16_prefill(int mode);
