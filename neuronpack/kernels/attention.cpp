// neuronpack's decode attention: one query token per row against its cached keys and values and its own, in one
// pass. A decode step's layer graph calls it once per layer (models/llama.py, Attention with ``kernel`` set).
//
// torch.ops.neuronpack.decode_attention(q [B, kv, g, hd], k [B, kv, 1, hd], v [B, kv, 1, hd],
//     k_past [B, kv, L, hd], v_past [B, kv, L, hd], past bool [B, 1, 1, L], scale) -> [B, kv, g, hd] in q's dtype:
// the g query heads of each KV head attend to the L cached positions ``past`` allows and, always, to the token's own
// key; the cache rows may be a slice of a longer cache (any stride between positions). The formula is the one
// Attention runs in torch ops (``attention_reference`` below): scores rounded to the dtype, scaled in it, softmax in
// float32 (rounding as ATen's: see ``probabilities``), probabilities rounded to the dtype, and the cached and own
// parts of the weighted sum each rounded to the dtype before they are added. Accumulation is in float32, in this
// kernel's order (torch's matmul and sum have theirs: tests/kernels/test_decode_attention.py, ``decode_case``).
//
// Why a kernel: Inductor's loops for this sum each score across the lanes of one vector and divide by the softmax's
// sum inside the weighted sum (~2 ms of an 8-row SmolLM2 step at ~60 cached positions). Here 16 cached positions
// are scored at a time and their sums come out of one shuffle tree (simd.h), the exponentials are vectorised, and
// the weighted sum reads each value row once per 16 lanes of hd. float32 and bfloat16 with AVX-512; any other case
// runs the reference.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>
#include <type_traits>
#include <vector>

#include "simd.h"

#ifdef NEURONPACK_AVX512
extern "C" __m512 Sleef_expf16_u10(__m512);  // exported by libtorch_cpu (what ATen's and Inductor's exp() call)
#endif

namespace {

// The formula in ATen ops: what the kernel computes, for the cases it does not take.
at::Tensor attention_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& k_past,
                               const at::Tensor& v_past, const at::Tensor& past, double scale) {
  const auto dtype = q.scalar_type();
  const auto scores = [&](const at::Tensor& keys) {
    return at::matmul(q.to(at::kFloat), keys.to(at::kFloat).transpose(-1, -2)).to(dtype).mul(scale).to(at::kFloat);
  };
  const int64_t L = k_past.size(2);
  const at::Tensor s = at::cat({scores(k_past).masked_fill(past.logical_not(), -std::numeric_limits<float>::infinity()),
                                scores(k)}, -1);
  const at::Tensor p = at::softmax(s, -1).to(dtype);
  const auto weighted = [&](const at::Tensor& probs, const at::Tensor& values) {
    return at::matmul(probs.to(at::kFloat), values.to(at::kFloat)).to(dtype);
  };
  return weighted(p.narrow(-1, 0, L), v_past) + weighted(p.narrow(-1, L, 1), v);
}

#ifdef NEURONPACK_AVX512
using namespace neuronpack_simd;

template <class E>
inline __m512 to_dtype(__m512 x) {  // float32 values rounded to E's precision
  if constexpr (std::is_same_v<E, BF16>) return round_bf16(x);
  return x;
}

// The cache rows a step reads were evicted by the weights it streamed since the last step, and one (row, KV head)'s
// keys lie far from the next one's: the hardware prefetcher does not get ahead of them, and each block of 16 keys
// waited for memory. So keys and values are prefetched kAheadBytes ahead, and the next (row, KV head)'s
// first positions while this one is computed (8 rows of SmolLM2 at ~115 cached positions, 30 layers from cold
// caches: 3.8-3.9 -> 2.8-3.0 ms in bfloat16; one row 0.71 -> 0.58 ms).
constexpr int64_t kAheadBytes = 8192;

inline int64_t ahead_rows(int64_t row_bytes) { return std::max<int64_t>(16, kAheadBytes / row_bytes); }

// Prefetch (into L1) positions [from, to) of a cache row: ``bytes`` of each, ``stride`` elements apart.
template <class T>
inline void prefetch_positions(const T* p, int64_t stride, int64_t from, int64_t to, int64_t bytes) {
  for (int64_t j = from; j < to; ++j) {
    const char* row = reinterpret_cast<const char*>(p + j * stride);
    for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(row + b, _MM_HINT_T0);
  }
}

// One (row, KV head): scores of one query head ``qh`` against the L cached keys (``kp``, ``stride`` elements apart)
// and its own key ``kn``, into ``s`` [L + 1], masked by ``allowed`` [L], then the softmax's probabilities in place.
// ``ahead``: prefetch the keys kAheadBytes on (for the first query head of a KV head: the others find them
// in the cache).
template <class E>
void probabilities(const typename E::T* qh, const typename E::T* kp, int64_t stride, const typename E::T* kn,
                   const bool* allowed, int64_t L, int64_t D, float scale, float* s, bool ahead) {
  const __m512 vscale = _mm512_set1_ps(scale), minus_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const auto finish = [&](__m512 dots) { return to_dtype<E>(_mm512_mul_ps(to_dtype<E>(dots), vscale)); };
  const int64_t row_bytes = D * static_cast<int64_t>(sizeof(typename E::T)), rows = ahead_rows(row_bytes);
  for (int64_t j0 = 0; j0 < L; j0 += 16) {
    if (ahead) prefetch_positions(kp, stride, std::min(L, j0 + rows), std::min(L, j0 + rows + 16), row_bytes);
    __m512 acc[16];
    for (int u = 0; u < 16; ++u) acc[u] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d += 16) {
      const __mmask16 m = tail_mask16(D - d);
      const __m512 qd = E::load(qh + d, m);
      for (int u = 0; u < 16; ++u) {  // past the last position: its row again (discarded), so u stays a constant
        const int64_t j = std::min<int64_t>(j0 + u, L - 1);
        acc[u] = _mm512_fmadd_ps(qd, E::load(kp + j * stride + d, m), acc[u]);
      }
    }
    const __mmask16 lanes = tail_mask16(L - j0);
    const __m128i flags = _mm_maskz_loadu_epi8(lanes, allowed + j0);
    const __mmask16 keep = _mm_test_epi8_mask(flags, flags);
    _mm512_mask_storeu_ps(s + j0, lanes, _mm512_mask_blend_ps(keep, minus_inf, finish(sum16(acc))));
  }
  __m512 own = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; d += 16) {
    const __mmask16 m = tail_mask16(D - d);
    own = _mm512_fmadd_ps(E::load(qh + d, m), E::load(kn + d, m), own);
  }
  s[L] = _mm512_cvtss_f32(finish(_mm512_set1_ps(_mm512_reduce_add_ps(own))));
  // The softmax rounds as torch.softmax over the last dimension of a float32 tensor does with AVX-512 (ATen's
  // SoftMaxKernel.cpp, _vec_softmax_lastdim, its sum by at::vec::reduce_all): exp(s - max) by Sleef's u10 exp; their
  // sum, for fewer than 16 terms from the first to the last one by one, else 16 lanes of partial sums (the last
  // block's missing lanes add nothing) reduced by halves (lane i + lane i^8, then i^4, i^2, i^1: the pairs of
  // _mm512_reduce_add_ps); then each exponential times the sum's reciprocal. Dividing by the sum instead moves about
  // one probability in six by a float32 ulp, the shuffle tree's sum of fewer than 16 terms one in forty: rounded to
  // bfloat16, about 0.3% of test_decode_attention's random cases then differed from the formula by an ulp.
  const int64_t n = L + 1;
  __m512 top = minus_inf;
  for (int64_t j = 0; j < n; j += 16) top = _mm512_max_ps(top, _mm512_mask_loadu_ps(minus_inf, tail_mask16(n - j), s + j));
  const __m512 vtop = _mm512_set1_ps(_mm512_reduce_max_ps(top));
  __m512 total = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {  // masked-off lanes read -inf: exp gives 0
    const __mmask16 m = tail_mask16(n - j);
    const __m512 e = Sleef_expf16_u10(_mm512_sub_ps(_mm512_mask_loadu_ps(minus_inf, m, s + j), vtop));
    _mm512_mask_storeu_ps(s + j, m, e);
    total = _mm512_add_ps(total, e);
  }
  float sum = s[0];
  if (n < 16)
    for (int64_t j = 1; j < n; ++j) sum += s[j];
  else
    sum = _mm512_reduce_add_ps(total);
  const __m512 inverse = _mm512_set1_ps(1.0f / sum);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = tail_mask16(n - j);
    _mm512_mask_storeu_ps(s + j, m, to_dtype<E>(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, s + j), inverse)));
  }
}

// out [hd] = p[0..L) . v_past rows + p[L] * v_own, each part rounded to the dtype, then their sum.
template <class E>
void weighted(const float* p, const typename E::T* vp, int64_t stride, const typename E::T* vn, int64_t L, int64_t D,
              typename E::T* out, bool ahead) {
  if (ahead) {  // the values past the first kAheadBytes (those were prefetched with the keys): all of them, now
    const int64_t row_bytes = D * static_cast<int64_t>(sizeof(typename E::T));
    prefetch_positions(vp, stride, std::min(L, ahead_rows(row_bytes)), L, row_bytes);
  }
  for (int64_t d = 0; d < D; d += 16) {
    const __mmask16 m = tail_mask16(D - d);
    __m512 a[4];  // four chains: one FMA's latency per position otherwise
    for (int c = 0; c < 4; ++c) a[c] = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 4 <= L; j += 4)
      for (int c = 0; c < 4; ++c)
        a[c] = _mm512_fmadd_ps(_mm512_set1_ps(p[j + c]), E::load(vp + (j + c) * stride + d, m), a[c]);
    for (; j < L; ++j) a[0] = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), E::load(vp + j * stride + d, m), a[0]);
    const __m512 past = _mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3]));
    const __m512 own = to_dtype<E>(_mm512_mul_ps(_mm512_set1_ps(p[L]), E::load(vn + d, m)));
    const __m512 y = to_dtype<E>(_mm512_add_ps(to_dtype<E>(past), own));
    if constexpr (std::is_same_v<E, BF16>)
      _mm256_mask_storeu_epi16(out + d, m, _mm512_cvtepi32_epi16(bf16_bits(y)));
    else
      _mm512_mask_storeu_ps(out + d, m, y);
  }
}

template <class E>
void attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& k_past,
            const at::Tensor& v_past, const at::Tensor& past, double scale, at::Tensor& out) {
  using T = typename E::T;
  const int64_t B = q.size(0), H = q.size(1), G = q.size(2), D = q.size(3), L = k_past.size(2);
  const T* qd = reinterpret_cast<const T*>(q.data_ptr());
  const T* kd = reinterpret_cast<const T*>(k.data_ptr());
  const T* vd = reinterpret_cast<const T*>(v.data_ptr());
  const T* kpd = reinterpret_cast<const T*>(k_past.data_ptr());
  const T* vpd = reinterpret_cast<const T*>(v_past.data_ptr());
  const bool* allowed = past.data_ptr<bool>();
  T* od = reinterpret_cast<T*>(out.data_ptr());
  const int64_t row_bytes = D * static_cast<int64_t>(sizeof(T));
  const auto cache_rows = [&](const at::Tensor& t, const T* data, int64_t i) {
    return data + (i / H) * t.stride(0) + (i % H) * t.stride(1);
  };
  const auto prefetch_start = [&](int64_t i) {  // the first positions of (row, KV head) i's keys and values
    const int64_t n = std::min(L, ahead_rows(row_bytes));
    prefetch_positions(cache_rows(k_past, kpd, i), k_past.stride(2), 0, n, row_bytes);
    prefetch_positions(cache_rows(v_past, vpd, i), v_past.stride(2), 0, n, row_bytes);
  };
  at::parallel_for(0, B * H, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> s(L + 1);
    prefetch_start(i0);
    for (int64_t i = i0; i < i1; ++i) {
      if (i + 1 < i1) prefetch_start(i + 1);
      const T* kp = cache_rows(k_past, kpd, i);
      const T* vp = cache_rows(v_past, vpd, i);
      const bool* allowed_b = allowed + (i / H) * L;
      for (int64_t g = 0; g < G; ++g) {
        probabilities<E>(qd + (i * G + g) * D, kp, k_past.stride(2), kd + i * D, allowed_b, L, D,
                         static_cast<float>(scale), s.data(), g == 0);
        weighted<E>(s.data(), vp, v_past.stride(2), vd + i * D, L, D, od + (i * G + g) * D, g == 0);
      }
    }
  });
}
#endif  // NEURONPACK_AVX512

at::Tensor decode_attention(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                            const at::Tensor& k_past, const at::Tensor& v_past, const at::Tensor& past_in,
                            double scale) {
#ifdef NEURONPACK_AVX512
  const auto dtype = q_in.scalar_type();
  const int64_t B = q_in.size(0), H = q_in.size(1), D = q_in.size(3), L = k_past.size(2);
  const bool fits = (dtype == at::kFloat || dtype == at::kBFloat16) && q_in.dim() == 4 && q_in.device().is_cpu() &&
                    L > 0 && D > 0 &&
                    [&] {
                      for (const at::Tensor* t : {&k_in, &v_in, &k_past, &v_past})
                        if (t->scalar_type() != dtype || t->dim() != 4 || t->size(0) != B || t->size(1) != H ||
                            t->size(3) != D || t->stride(3) != 1)
                          return false;
                      return k_in.size(2) == 1 && v_in.size(2) == 1 && v_past.size(2) == L &&
                             past_in.scalar_type() == at::kBool && past_in.numel() == B * L;
                    }();
  if (fits) {
    const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
    const at::Tensor past = past_in.contiguous();
    at::Tensor out = at::empty(q.sizes(), q.options());
    if (dtype == at::kFloat)
      attend<F32>(q, k, v, k_past, v_past, past, scale, out);
    else
      attend<BF16>(q, k, v, k_past, v_past, past, scale, out);
    return out;
  }
#endif
  return attention_reference(q_in, k_in, v_in, k_past, v_past, past_in, scale);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(neuronpack, m) {
  m.def("decode_attention(Tensor q, Tensor k, Tensor v, Tensor k_past, Tensor v_past, Tensor past, float scale) "
        "-> Tensor");
}

TORCH_LIBRARY_IMPL(neuronpack, CPU, m) { m.impl("decode_attention", &decode_attention); }
