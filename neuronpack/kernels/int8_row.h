// neuronpack's int8 kernel for a few rows of x (int8_row.cpp), called by linear.cpp's linear_int8.
#pragma once

#include <cstdint>

// Rows of x the kernel takes (more: linear.cpp's widening kernel, faster there on the Zen 4 it was measured on).
constexpr int64_t kDigitMaxRows = 4;

// out [M, N] float32 = x [M, K] float32 (M <= kDigitMaxRows) @ w [N, K] int8 .T through AVX512_VNNI's integer dot products, to within
// max|x[m]| * 2^-23 * sum|w| per row of x (the caller checked the CPU has them). False when x holds an inf or a NaN:
// the caller's float kernel then gives float results.
bool int8_rows_times_weight(const float* x, int64_t M, int64_t K, const int8_t* w, int64_t N, float* out);
