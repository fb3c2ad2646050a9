// neuronpack's routed experts: a mixture-of-experts FFN that reads only the experts its tokens are routed to.
//
// torch.ops.neuronpack.routed_experts(x [T, H], expert_ids [T, k] int64, expert_weights [T, k], gate_up, down,
//     gate_up_scale?, down_scale?, gate_up_bias?, down_bias?, alpha, limit, up_offset) -> [T, H] in x's dtype:
//   y[t] = sum_j w[t, j] * (down[e] @ act(gate_up[e] @ x[t] + gate_up_bias[e]) + down_bias[e]),  e = expert_ids[t, j]
//   act(g, u) = g' * sigmoid(alpha * g') * (u' + up_offset),  g' = min(g, limit), u' = clamp(u, -limit, limit)
// with the gate rows [0, I) of gate_up and the up rows [I, 2I): SwiGLU is alpha 1, no limit (0 or inf: none; an
// AOTInductor package cannot hold an inf argument), up_offset 0 (Qwen3-MoE, Mixtral); gpt-oss's clamped SwiGLU
// alpha 1.702, limit 7, up_offset 1. Weights [E, 2I, H] and [E, H, I] of x's
// dtype (float32, bfloat16); int8 with float32 per-channel scales [E, rows(, 1)] (NxD Inference's ``.scale``); or
// MXFP4, uint8 blocks [E, rows, K / 32, 16] with uint8 E8M0 scales [E, rows, K / 32] (moe_dots.h). Biases [E, rows],
// float32 or x's dtype. Rounding follows transformers' experts in x's dtype: gate_up (+ bias), the activation, down
// (+ bias), each weighted expert output and each sum rounded to the dtype (no-ops in float32); sums in float32.
// models/moe_reference.py holds the same formula in torch ops (``routed_experts_reference``).
//
// How: the T * k (token, choice) pairs are sorted by expert into slots, and each expert the call routes to is read
// once, whatever number of tokens chose it. Experts with up to register_rows slots (every expert of a decode step) run the
// register kernels of moe_dots.h: the threads split the rows of all of them at once, in proportion to each row's
// work (one parallel region for gate_up and one for down per call: a top-8 decode step is two, not sixteen), gate row
// j and up row j read together (two streams), down rows n and n + half likewise. Float and int8 experts with more
// slots (a prefill's popular ones) run GEMMs on the expert's weights: at::linear, int8 through int8_gemm.cpp; MXFP4
// always the register kernels (dequantized first for GEMMs only where the CPU lacks AVX-512). Built by
// neuronpack/kernels/__init__.py; measured by bench/moe.py.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "int8_row.h"
#include "moe_dots.h"

#ifdef NEURONPACK_AVX512
extern "C" __m512 Sleef_expf16_u10(__m512);  // exported by libtorch_cpu (what ATen's exp() calls)
#endif

namespace {

using namespace neuronpack_moe;

// Slots of one expert up to this run the register kernels, more GEMMs; -1 (default): by format, kDefaultRegisterRows
// for float and int8 experts, any number for MXFP4 (set_moe_gemm_rows: tests and benchmarks). A GEMM on MXFP4 needs
// the expert dequantized first, which cost 2.7x the register kernels' time at 512 tokens of gpt-oss-20b's shape (6.2
// against 2.3 s per layer, one loaded core); for bfloat16 the GEMMs win there (Qwen3-30B-A3B's shape: 0.81 against
// 1.14 s), and tie at 41 tokens.
constexpr int64_t kDefaultRegisterRows = 16;
std::atomic<int64_t> register_rows{-1};
constexpr int kChunk = 8;         // rows of x per kernel call
constexpr int64_t kReadCost = 2;  // a weight row's read, in dot products of one slot (for the threads' work split)

enum class Fmt { F32, BF16, I8, FP4 };

// One stacked projection of every expert: N rows of K per expert.
struct Proj {
  Fmt fmt = Fmt::F32;
  at::Tensor weight, scales, bias;  // bias: float32 [E, N] or undefined
  const uint8_t* w = nullptr;       // the weights' bytes
  int64_t row_bytes = 0;
  const float* scale = nullptr;     // I8: [E, N]
  const uint8_t* e8m0 = nullptr;    // FP4: [E, N, K / 32]
  int64_t E = 0, N = 0, K = 0;
  bool bf16_x = false;              // x is bfloat16 (MXFP4 then runs against bfloat16 rows where the CPU can)
  const uint8_t* row(int64_t e, int64_t n) const { return w + (e * N + n) * row_bytes; }
  const uint8_t* block_scales(int64_t e, int64_t n) const { return e8m0 + (e * N + n) * (K / 32); }
};

Proj make_proj(const char* name, const at::Tensor& weight, const std::optional<at::Tensor>& scale,
               const std::optional<at::Tensor>& bias, int64_t E, int64_t N, int64_t K, at::ScalarType dtype) {
  Proj p;
  p.E = E, p.N = N, p.K = K, p.bf16_x = dtype == at::kBFloat16;
  p.weight = weight.contiguous();
  const auto wt = weight.scalar_type();
  const bool has_scale = scale.has_value() && scale->defined();
  if (wt == at::kFloat || wt == at::kBFloat16) {
    TORCH_CHECK(wt == dtype, "routed_experts: ", name, " is ", wt, " but x is ", dtype);
    TORCH_CHECK(weight.numel() == E * N * K, "routed_experts: ", name, " must be [", E, ", ", N, ", ", K, "]");
    p.fmt = wt == at::kFloat ? Fmt::F32 : Fmt::BF16;
    p.row_bytes = K * weight.element_size();
  } else if (wt == at::kChar) {
    TORCH_CHECK(weight.numel() == E * N * K && has_scale && scale->numel() == E * N, "routed_experts: int8 ", name,
                " must be [", E, ", ", N, ", ", K, "] with a float32 scale of ", E * N, " values");
    p.fmt = Fmt::I8;
    p.row_bytes = K;
    p.scales = scale->to(at::kFloat).contiguous().reshape({-1});
    p.scale = p.scales.data_ptr<float>();
  } else {
    TORCH_CHECK(wt == at::kByte && K % 32 == 0 && weight.numel() == E * N * K / 2 && has_scale &&
                    scale->scalar_type() == at::kByte && scale->numel() == E * N * K / 32,
                "routed_experts: ", name, " must be float32, bfloat16, int8 with scales, or MXFP4: blocks uint8 [", E,
                ", ", N, ", ", K / 32, ", 16] with E8M0 scales uint8 [", E, ", ", N, ", ", K / 32, "]");
    p.fmt = Fmt::FP4;
    p.row_bytes = K / 2;
    p.scales = scale->contiguous();
    p.e8m0 = p.scales.data_ptr<uint8_t>();
  }
  p.w = static_cast<const uint8_t*>(p.weight.data_ptr());
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == E * N, "routed_experts: ", name, "'s bias must be [", E, ", ", N, "]");
    p.bias = bias->to(at::kFloat).contiguous();
  }
  return p;
}

// v rounded as a tensor of bfloat16 would hold it (``bf16``), else v.
inline float rounded(float v, bool bf16) { return bf16 ? static_cast<float>(static_cast<at::BFloat16>(v)) : v; }

// The pairs (token, choice) sorted by expert: slots offsets[a] .. offsets[a + 1] are expert experts[a]'s.
struct Routing {
  std::vector<int64_t> experts, offsets, token;  // token: per slot
  std::vector<float> weight;                     // per slot
  std::vector<int64_t> slots_of;                 // [T, k]: each token's slots, ascending (= by expert)
};

Routing route(const at::Tensor& ids_in, const at::Tensor& weights_in, int64_t T, int64_t k, int64_t E) {
  const at::Tensor ids = ids_in.to(at::kLong).contiguous(), weights = weights_in.to(at::kFloat).contiguous();
  const int64_t* id = ids.data_ptr<int64_t>();
  const float* wt = weights.data_ptr<float>();
  std::vector<int64_t> count(E + 1, 0);
  for (int64_t i = 0; i < T * k; ++i) {
    TORCH_CHECK(id[i] >= 0 && id[i] < E, "routed_experts: expert id ", id[i], " is outside 0..", E - 1);
    ++count[id[i] + 1];
  }
  for (int64_t e = 0; e < E; ++e) count[e + 1] += count[e];  // count[e]: expert e's first slot
  Routing r;
  r.token.resize(T * k), r.weight.resize(T * k), r.slots_of.resize(T * k);
  for (int64_t e = 0; e < E; ++e)
    if (count[e + 1] > count[e]) r.experts.push_back(e), r.offsets.push_back(count[e]);
  r.offsets.push_back(T * k);
  std::vector<int64_t> next(count.begin(), count.end() - 1);
  for (int64_t i = 0; i < T * k; ++i) {  // tokens in order: each expert's slots by token
    const int64_t s = next[id[i]]++;
    r.token[s] = i / k, r.weight[s] = wt[i], r.slots_of[i] = s;
  }
  for (int64_t t = 0; t < T; ++t) std::sort(r.slots_of.begin() + t * k, r.slots_of.begin() + (t + 1) * k);
  return r;
}

// -- rows of x in the layout a format's kernel reads --------------------------------------------------------------

// The slots' rows of x as p's kernels read them (moe_dots.h): float32 [S, K] (MXFP4: block-permuted); bfloat16
// [S, K] (bfloat16 weights, vdpbf16ps); MXFP4's 16-bit digits (``fp4_digits``) with each row's step.
enum class Layout { Float, Bf16, Digits };

struct Rows {
  Layout layout = Layout::Float;
  std::vector<float> f, step;
  std::vector<uint16_t> h;
  std::vector<uint8_t> d;
  const uint8_t* data = nullptr;
  int64_t bytes_per_row = 0;
  const void* row(int64_t s) const { return data + s * bytes_per_row; }
};

#ifdef NEURONPACK_AVX512
bool bf16_dot() {
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has;
}
bool int8_dot() {
  static const bool has = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi");
  return has;
}
#endif

// The layout p's kernels read where every row is finite: bfloat16 weights against bfloat16 rows, MXFP4 against
// bfloat16 x as digits, on CPUs with the instructions; float32 otherwise (float32 x keeps MXFP4 exact).
Layout layout_for(const Proj& p) {
#ifdef NEURONPACK_AVX512
  if (p.fmt == Fmt::BF16 && bf16_dot()) return Layout::Bf16;
  if (p.fmt == Fmt::FP4 && p.bf16_x && int8_dot()) return Layout::Digits;
#endif
  (void)p;
  return Layout::Float;
}

// Row x [K] as fp4_digits (moe_dots.h) into out [groups * kDigitGroupBytes]; its step (x ~ step * q). False if x is
// not finite.
bool fp4_digits(const float* x, int64_t K, uint8_t* out, float& step) {
  constexpr float kLevels = 32639.f;  // |q| at most this: both digits fit a signed byte
  float top = 0.f;
  for (int64_t i = 0; i < K; ++i) {
    if (!std::isfinite(x[i])) return false;
    top = std::max(top, std::abs(x[i]));
  }
  step = top > 0.f ? top / kLevels : 1.f;
  const float inv = top > 0.f ? kLevels / top : 0.f;
  const int64_t groups = (K + 127) / 128;
  std::fill_n(out, groups * kDigitGroupBytes, 0);
  for (int64_t i = 0; i < K; ++i) {
    const int64_t group = i / 128, block = (i % 128) / 32, j = i % 32;  // element j of the group's block
    const int32_t q = static_cast<int32_t>(std::nearbyint(x[i] * inv));
    const int32_t d0 = ((q + 128) & 255) - 128, d1 = (q - d0) / 256;  // q = d0 + 256 d1, both in -128 .. 127
    uint8_t* g = out + kDigitGroupBytes * group;
    const int64_t byte = 16 * block + j / 2;  // its weight byte in the group; even j: the low nibble
    g[(j % 2) * 128 + byte] = static_cast<uint8_t>(d0), g[(j % 2) * 128 + 64 + byte] = static_cast<uint8_t>(d1);
    reinterpret_cast<int32_t*>(g + 256)[byte / 4] += kFp4Offset * q;  // the lane's 12 sum(q)
  }
  return true;
}

// src: float32 [S, K] (values of x's dtype) -> the layout p's kernels read.
void layout_rows(const Proj& p, const float* src, int64_t S, int64_t K, Rows& out) {
  out.layout = layout_for(p);
  if (out.layout == Layout::Digits) {
    const int64_t per_row = (K + 127) / 128 * kDigitGroupBytes;
    out.d.resize(S * per_row), out.step.resize(S);
    bool finite = true;
    for (int64_t s = 0; s < S && finite; ++s) finite = fp4_digits(src + s * K, K, out.d.data() + s * per_row, out.step[s]);
    out.data = out.d.data(), out.bytes_per_row = per_row;
    if (finite) return;
    out.layout = Layout::Float;  // an inf or a NaN in x: the float32 lookup carries it through
  }
  if (out.layout == Layout::Bf16) {
    out.h.resize(S * K);
    for (int64_t i = 0; i < S * K; ++i) out.h[i] = static_cast<at::BFloat16>(src[i]).x;  // exact: bfloat16 values
    out.data = reinterpret_cast<const uint8_t*>(out.h.data()), out.bytes_per_row = K * 2;
    return;
  }
  out.f.resize(S * K);
  if (p.fmt == Fmt::FP4) {  // per block of 32: the even elements, then the odd ones
    for (int64_t s = 0; s < S; ++s)
      for (int64_t b = 0; b < K; b += 32)
        for (int i = 0; i < 16; ++i) {
          out.f[s * K + b + i] = src[s * K + b + 2 * i];
          out.f[s * K + b + 16 + i] = src[s * K + b + 2 * i + 1];
        }
  } else {
    std::copy(src, src + S * K, out.f.begin());
  }
  out.data = reinterpret_cast<const uint8_t*>(out.f.data()), out.bytes_per_row = K * 4;
}

#ifdef NEURONPACK_AVX512
// o0[m], o1[m] = rows r0, r1 of expert e against MB rows of x from slot s (consecutive), int8 scales applied.
template <int MB>
void dot_pair(const Proj& p, int64_t e, int64_t r0, int64_t r1, const Rows& rows, int64_t s, float* o0, float* o1) {
  const int64_t K = p.K;
  const void* x = rows.row(s);
  switch (p.fmt) {
    case Fmt::F32:
      dot2<F32, MB>(reinterpret_cast<const float*>(p.row(e, r0)), reinterpret_cast<const float*>(p.row(e, r1)),
                    static_cast<const float*>(x), K, K, o0, o1);
      return;
    case Fmt::BF16: {
      const auto* w0 = reinterpret_cast<const uint16_t*>(p.row(e, r0));
      const auto* w1 = reinterpret_cast<const uint16_t*>(p.row(e, r1));
      if (rows.layout == Layout::Bf16) dot2_bf16<MB>(w0, w1, static_cast<const uint16_t*>(x), K, K, o0, o1);
      else dot2<BF16, MB>(w0, w1, static_cast<const float*>(x), K, K, o0, o1);
      return;
    }
    case Fmt::I8: {
      dot2<I8, MB>(reinterpret_cast<const int8_t*>(p.row(e, r0)), reinterpret_cast<const int8_t*>(p.row(e, r1)),
                   static_cast<const float*>(x), K, K, o0, o1);
      const float s0 = p.scale[e * p.N + r0], s1 = p.scale[e * p.N + r1];
      for (int m = 0; m < MB; ++m) o0[m] *= s0, o1[m] *= s1;
      return;
    }
    case Fmt::FP4:
      if (rows.layout == Layout::Digits)
        dot2_fp4_digits<MB>(p.row(e, r0), p.block_scales(e, r0), p.row(e, r1), p.block_scales(e, r1),
                            static_cast<const uint8_t*>(x), rows.bytes_per_row, K, rows.step.data() + s, o0, o1);
      else
        dot2_fp4<MB>(p.row(e, r0), p.block_scales(e, r0), p.row(e, r1), p.block_scales(e, r1),
                     static_cast<const float*>(x), K, K, o0, o1);
      return;
  }
}

using PairFn = void (*)(const Proj&, int64_t, int64_t, int64_t, const Rows&, int64_t, float*, float*);
constexpr PairFn kPairs[kChunk] = {dot_pair<1>, dot_pair<2>, dot_pair<3>, dot_pair<4>,
                                   dot_pair<5>, dot_pair<6>, dot_pair<7>, dot_pair<8>};

// f(a, r0, r1) for row ranges of the listed experts (index a, each R rows) covering all of them, split among the
// threads in proportion to each row's work (its slots plus its read).
template <class F>
void split_rows(const std::vector<int64_t>& listed, const Routing& r, int64_t R, const F& f) {
  const int64_t A = static_cast<int64_t>(listed.size());
  std::vector<int64_t> start(A + 1, 0), per_row(A);
  for (int64_t i = 0; i < A; ++i) {
    const int64_t a = listed[i];
    per_row[i] = r.offsets[a + 1] - r.offsets[a] + kReadCost;
    start[i + 1] = start[i] + R * per_row[i];
  }
  const int64_t T = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), start[A] / (64 * kReadCost)));
  at::parallel_for(0, T, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t c0 = start[A] * t / T, c1 = start[A] * (t + 1) / T;
      const auto row_at = [&](int64_t i, int64_t c) {  // the first row of expert i starting at or after work c
        return std::clamp<int64_t>((c - start[i] + per_row[i] - 1) / per_row[i], 0, R);
      };
      for (int64_t i = 0; i < A; ++i) {
        if (start[i + 1] <= c0 || start[i] >= c1) continue;
        const int64_t lo = c0 <= start[i] ? 0 : row_at(i, c0), hi = row_at(i, c1);
        if (lo < hi) f(listed[i], lo, hi);
      }
    }
  });
}

// out [S, 2I]: the gate and up rows of the listed experts against their slots' rows of x.
void gate_up_rows(const Proj& p, const std::vector<int64_t>& listed, const Routing& r, const Rows& x, float* out) {
  const int64_t I = p.N / 2;
  split_rows(listed, r, I, [&](int64_t a, int64_t j0, int64_t j1) {
    const int64_t e = r.experts[a], first = r.offsets[a], last = r.offsets[a + 1];
    float g[kChunk], u[kChunk];
    for (int64_t j = j0; j < j1; ++j)
      for (int64_t s = first; s < last; s += kChunk) {
        const int rows = static_cast<int>(std::min<int64_t>(kChunk, last - s));
        kPairs[rows - 1](p, e, j, I + j, x, s, g, u);
        for (int m = 0; m < rows; ++m) out[(s + m) * p.N + j] = g[m], out[(s + m) * p.N + I + j] = u[m];
      }
  });
}

// out [S, H]: the down rows of the listed experts against their slots' activations; rows n and n + half together.
void down_rows(const Proj& p, const std::vector<int64_t>& listed, const Routing& r, const Rows& x, float* out) {
  split_rows(listed, r, p.N, [&](int64_t a, int64_t n0, int64_t n1) {
    const int64_t e = r.experts[a], first = r.offsets[a], last = r.offsets[a + 1], half = (n1 - n0) / 2;
    float y0[kChunk], y1[kChunk];
    for (int64_t i = 0; i < half + (n1 - n0) % 2; ++i) {
      const int64_t n = i < half ? n0 + i : n1 - 1, n2 = i < half ? n + half : n;  // an odd last row: with itself
      for (int64_t s = first; s < last; s += kChunk) {
        const int rows = static_cast<int>(std::min<int64_t>(kChunk, last - s));
        kPairs[rows - 1](p, e, n, n2, x, s, y0, y1);
        for (int m = 0; m < rows; ++m) out[(s + m) * p.N + n] = y0[m], out[(s + m) * p.N + n2] = y1[m];
      }
    }
  });
}
#endif  // NEURONPACK_AVX512

// -- the GEMM path (experts with many slots, and every expert where the CPU lacks AVX-512) ------------------------

// Expert e's MXFP4 rows dequantized to float32 [N, K] (exact).
at::Tensor fp4_dequantized(const Proj& p, int64_t e) {
  at::Tensor out = at::empty({p.N, p.K}, at::TensorOptions().dtype(at::kFloat));
  float* o = out.data_ptr<float>();
  const float* scale = e8m0_table();
  at::parallel_for(0, p.N, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const uint8_t* w = p.row(e, n);
      const uint8_t* s = p.block_scales(e, n);
      for (int64_t i = 0; i < p.K / 2; ++i) {
        o[n * p.K + 2 * i] = kFp4[w[i] & 15] * scale[s[i / 16]];
        o[n * p.K + 2 * i + 1] = kFp4[w[i] >> 4] * scale[s[i / 16]];
      }
    }
  });
  return out;
}

// xs [M, K] (x's dtype) @ expert e's rows .T -> float32 [M, N], int8 scales applied (no bias).
at::Tensor expert_gemm(const Proj& p, int64_t e, const at::Tensor& xs) {
  const at::Tensor w = p.fmt == Fmt::FP4 ? at::Tensor() : p.weight.reshape({p.E, p.N, p.K}).select(0, e);
  if (p.fmt == Fmt::F32 || p.fmt == Fmt::BF16) return at::linear(xs, w).to(at::kFloat);
  if (p.fmt == Fmt::FP4) return at::linear(xs, fp4_dequantized(p, e).to(xs.scalar_type())).to(at::kFloat);
  const at::Tensor scale = p.scales.narrow(0, e * p.N, p.N);  // [N] of the flat [E * N]
  at::Tensor out = at::empty({xs.size(0), p.N}, xs.options());
  if (int8_gemm(xs, w, scale.data_ptr<float>(), p.N, nullptr, out)) return out.to(at::kFloat);
  return at::linear(xs, w.to(xs.scalar_type())).to(at::kFloat).mul_(scale.view({1, -1}));  // an inf or a NaN in x
}

// out rows of the slots of expert index a = expert_gemm of x's rows ``src`` (float32 [S, K], x's dtype values).
void gemm_expert(const Proj& p, const Routing& r, int64_t a, const float* src, at::ScalarType dtype, float* out) {
  const int64_t first = r.offsets[a], M = r.offsets[a + 1] - first;
  const at::Tensor xs = at::from_blob(const_cast<float*>(src + first * p.K), {M, p.K}, at::kFloat).to(dtype);
  const at::Tensor y = expert_gemm(p, r.experts[a], xs).contiguous();
  std::copy(y.data_ptr<float>(), y.data_ptr<float>() + M * p.N, out + first * p.N);
}

int64_t register_limit(const Proj& p) {
  const int64_t set = register_rows.load(std::memory_order_relaxed);
  if (set >= 0) return set;
  return p.fmt == Fmt::FP4 ? std::numeric_limits<int64_t>::max() : kDefaultRegisterRows;
}

// out [S, N] = every slot's rows of its expert (the register kernels or GEMMs by the expert's slot count).
void project(const Proj& p, const Routing& r, const float* src, at::ScalarType dtype, bool gate_up, float* out) {
  std::vector<int64_t> small;
  const int64_t S = r.offsets.back();
  for (int64_t a = 0; a < static_cast<int64_t>(r.experts.size()); ++a) {
#ifdef NEURONPACK_AVX512
    if (r.offsets[a + 1] - r.offsets[a] <= register_limit(p)) {
      small.push_back(a);
      continue;
    }
#endif
    gemm_expert(p, r, a, src, dtype, out);
  }
#ifdef NEURONPACK_AVX512
  if (small.empty()) return;
  thread_local Rows scratch;
  Rows& rows = scratch;  // this thread's (a thread_local named inside the workers would be each worker's own)
  layout_rows(p, src, S, p.K, rows);
  if (gate_up) gate_up_rows(p, small, r, rows, out);
  else down_rows(p, small, r, rows, out);
#endif
}

// Each slot's row of out [S, N] plus its expert's bias, rounded to the dtype.
void add_bias(const Proj& p, const Routing& r, bool bf16, float* out) {
  const float* b = p.bias.defined() ? p.bias.data_ptr<float>() : nullptr;
  for (int64_t a = 0; a < static_cast<int64_t>(r.experts.size()); ++a)
    for (int64_t s = r.offsets[a]; s < r.offsets[a + 1]; ++s)
      for (int64_t n = 0; n < p.N; ++n)
        out[s * p.N + n] = rounded(out[s * p.N + n] + (b ? b[r.experts[a] * p.N + n] : 0.f), bf16);
}

// act [S, I] from gu [S, 2I] (see the top of this file), rounded to the dtype.
void activate(const float* gu, int64_t S, int64_t I, float alpha, float limit, float up_offset, bool bf16,
              float* act) {
  for (int64_t s = 0; s < S; ++s) {
    const float* g = gu + s * 2 * I;
    const float* u = g + I;
    float* o = act + s * I;
    int64_t j = 0;
#ifdef NEURONPACK_AVX512
    const __m512 lim = _mm512_set1_ps(limit), neg = _mm512_set1_ps(-limit), one = _mm512_set1_ps(1.f);
    const __m512 na = _mm512_set1_ps(-alpha), off = _mm512_set1_ps(up_offset);
    for (; j + 16 <= I; j += 16) {  // min / max with the value second: a NaN stays a NaN, as in torch's clamp
      const __m512 gv = _mm512_min_ps(lim, _mm512_loadu_ps(g + j));
      const __m512 uv = _mm512_max_ps(neg, _mm512_min_ps(lim, _mm512_loadu_ps(u + j)));
      const __m512 glu = _mm512_div_ps(gv, _mm512_add_ps(one, Sleef_expf16_u10(_mm512_mul_ps(na, gv))));
      _mm512_storeu_ps(o + j, _mm512_mul_ps(glu, _mm512_add_ps(uv, off)));
    }
#endif
    for (; j < I; ++j) {
      const float gv = std::isnan(g[j]) ? g[j] : std::min(g[j], limit);
      const float uv = std::isnan(u[j]) ? u[j] : std::max(-limit, std::min(u[j], limit));
      o[j] = gv / (1.f + std::exp(-alpha * gv)) * (uv + up_offset);
    }
    if (bf16)
      for (j = 0; j < I; ++j) o[j] = rounded(o[j], true);
  }
}

struct Scratch {
  std::vector<float> xs, gu, act, ys;  // [S, H] x per slot, [S, 2I], [S, I], [S, H]
};

at::Tensor routed_experts(const at::Tensor& x_in, const at::Tensor& expert_ids, const at::Tensor& expert_weights,
                          const at::Tensor& gate_up, const at::Tensor& down,
                          const std::optional<at::Tensor>& gate_up_scale, const std::optional<at::Tensor>& down_scale,
                          const std::optional<at::Tensor>& gate_up_bias, const std::optional<at::Tensor>& down_bias,
                          double alpha, double limit, double up_offset) {
  const auto dtype = x_in.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "routed_experts: x must be float32 or bfloat16");
  TORCH_CHECK(gate_up.dim() >= 3 && down.dim() >= 3, "routed_experts: stacked expert weights [E, rows, ...]");
  const int64_t H = x_in.size(-1), T = x_in.numel() / H, k = expert_ids.size(-1);
  const int64_t E = gate_up.size(0), per_row = down.scalar_type() == at::kByte ? 2 : 1;  // MXFP4: 2 per byte
  const int64_t I = down.size(1) == H ? down.numel() / (E * H) * per_row : 0;
  TORCH_CHECK(I > 0 && gate_up.size(1) == 2 * I && expert_ids.numel() == T * k && expert_weights.numel() == T * k,
              "routed_experts: x [T, H], expert ids and weights [T, k], gate_up [E, 2I, H], down [E, H, I]");
  const Proj pg = make_proj("gate_up", gate_up, gate_up_scale, gate_up_bias, E, 2 * I, H, dtype);
  const Proj pd = make_proj("down", down, down_scale, down_bias, E, H, I, dtype);
  const Routing r = route(expert_ids, expert_weights, T, k, E);
  const int64_t S = T * k;
  const bool bf16 = dtype == at::kBFloat16;
  const at::Tensor x = x_in.reshape({T, H}).to(at::kFloat).contiguous();
  thread_local Scratch scratch;
  // this thread's (a worker naming the thread_local would get its own)
  std::vector<float>&xs = scratch.xs, &gu = scratch.gu, &act = scratch.act, &ys = scratch.ys;
  xs.resize(S * H), gu.resize(S * 2 * I), act.resize(S * I), ys.resize(S * H);
  for (int64_t s = 0; s < S; ++s) std::copy_n(x.data_ptr<float>() + r.token[s] * H, H, xs.data() + s * H);
  project(pg, r, xs.data(), dtype, true, gu.data());
  add_bias(pg, r, bf16, gu.data());
  const float clamp = limit > 0 ? static_cast<float>(limit) : std::numeric_limits<float>::infinity();
  activate(gu.data(), S, I, static_cast<float>(alpha), clamp, static_cast<float>(up_offset), bf16, act.data());
  project(pd, r, act.data(), dtype, false, ys.data());
  add_bias(pd, r, bf16, ys.data());
  at::Tensor y = at::empty(x_in.sizes(), x_in.options());
  at::parallel_for(0, T, 16, [&](int64_t t0, int64_t t1) {  // each token's experts added in expert order
    std::vector<float> acc(H);
    for (int64_t t = t0; t < t1; ++t) {
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t j = 0; j < k; ++j) {
        const int64_t s = r.slots_of[t * k + j];
        for (int64_t n = 0; n < H; ++n) acc[n] = rounded(acc[n] + rounded(ys[s * H + n] * r.weight[s], bf16), bf16);
      }
      if (bf16) {
        auto* o = y.data_ptr<at::BFloat16>() + t * H;
        for (int64_t n = 0; n < H; ++n) o[n] = static_cast<at::BFloat16>(acc[n]);
      } else {
        std::copy(acc.begin(), acc.end(), y.data_ptr<float>() + t * H);
      }
    }
  });
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(neuronpack, m) {
  // experts with more slots than this run GEMMs, the others the register kernels (-1: by format); the old setting
  m.def("set_moe_gemm_rows(int rows) -> int", [](int64_t rows) { return register_rows.exchange(rows); });
  m.def("routed_experts(Tensor x, Tensor expert_ids, Tensor expert_weights, Tensor gate_up, Tensor down, "
        "Tensor? gate_up_scale, Tensor? down_scale, Tensor? gate_up_bias, Tensor? down_bias, "
        "float alpha, float limit, float up_offset) -> Tensor");
}

TORCH_LIBRARY_IMPL(neuronpack, CPU, m) { m.impl("routed_experts", &routed_experts); }
