// CPU kernel for one query per row against a paged KV cache (LLM decode).
//
// o[b, h, g] = sum_l softmax_l(scale * q[b, h, g] . k[b, h, l]) v[b, h, l] over
// the visible keys l in [lo[b], hi[b]) (clamped to the table; none visible: o = 0).
// The causal mask, valid lengths and sliding windows of a decode step are all
// such a range, which custom_calls/attention/cpu.py computes. A dense cache
// [B, L, Hkv, D] runs it too, with row b's cache as its one page (read in place).
//
// Why a kernel: as XLA ops a layer's decode attention is ~9 small thunks
// (scores, mask, max, exp, sums, division, values), and the products run as
// YNNPACK fusions that wake a pool thread each (~20-50 us per call, 30 layers a
// token). Here one call reads each key and value row once for all G query heads
// that share it (grouped-query attention), in float32 as the jnp reference does
// (custom_calls/attention/reference.py, equal up to summation order; with AVX2
// the softmax's exp is a polynomial within 2 ulp of expf).
//
// A decode step's keys and values come from memory (the pool is larger than the
// caches and the weights streamed between layers evict it), so the kernel is
// bound by that read: each key row is loaded once for the G queries that share
// it, rows kAhead keys ahead are prefetched, and a batch of fewer rows than
// threads splits each row by KV head. On a 2-core AMD EPYC (Zen 3), 16 rows x 170
// keys x 3 KV heads of 64 (4.2 MB per layer) went from 1.0 to 0.8 ms on one
// core with these; a one-row step from 76 to 62 us.
//
// Handler (XLA FFI, CPU):
//   maxfx_paged_decode_attention(q f32[B, H, G, D], k [P, S, H, D], v [P, S, H, Dv] (both f32 or both f16),
//                                table s32[B, W], lo s32[B], hi s32[B]; scale f32) -> f32[B, H, G, Dv]
// It reads row b's key l from page table[b, l / S], slot l % S, in place: the
// generation engine's KV pool is never gathered into a dense window (that copy
// cost more than the attention itself).

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "simd.h"
#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define MAXFX_ATTENTION_AVX2 1
using maxfx_cpu::Sum8;

// exp(x) per lane: 2^n * p(r) with x = n ln 2 + r, |r| <= ln 2 / 2, and p Cephes'
// degree-7 polynomial (within 2 ulp of expf over the float range; here x <= 0,
// a score minus its row's maximum). Clamped to [-87.3, 88.7] so 2^n stays a
// normal float; a NaN goes through (max/min return their second operand on NaN).
inline __m256 Exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_set1_ps(88.7f), _mm256_max_ps(_mm256_set1_ps(-87.3f), x));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
#endif

// A stored key or value: float32, or float16 bits (a pool kept in half precision).
using Half = uint16_t;
inline float ToFloat(float x) { return x; }
inline float ToFloat(Half x) { return maxfx_cpu::HalfToFloat(x); }
#ifdef MAXFX_ATTENTION_AVX2
inline __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 Load8(const Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
#endif

// The pool is far larger than the caches, and a row's keys sit in pages spread
// over it: asking for key row j + kAhead while row j is used keeps a few misses
// in flight (the hardware prefetcher only follows a page's consecutive rows).
constexpr int64_t kAhead = 4;

template <class T>
inline void Prefetch(const T* p, int64_t n) {
  for (int64_t i = 0; i < n; i += 64 / sizeof(T)) _mm_prefetch(reinterpret_cast<const char*>(p + i), _MM_HINT_T0);
}

// Queries per pass of `Scores`: each key row is loaded once for this many queries.
constexpr int64_t kQueriesPerPass = 8;

// out[g * stride] = scale * (q_g . k) for the g_count queries q_g = q + g * d
// sharing one key row k (the query heads of one KV head).
template <class T>
inline void Scores(int64_t g_count, int64_t d, const float* __restrict q, const T* __restrict k, float scale, float* out, int64_t stride) {
  for (int64_t g0 = 0; g0 < g_count; g0 += kQueriesPerPass) {
    const int64_t gn = std::min(kQueriesPerPass, g_count - g0);
    const float* qg = q + g0 * d;
    float sums[kQueriesPerPass] = {};
    int64_t i = 0;
#ifdef MAXFX_ATTENTION_AVX2
    __m256 acc[kQueriesPerPass];
    for (int64_t g = 0; g < gn; ++g) acc[g] = _mm256_setzero_ps();
    for (; i + 8 <= d; i += 8) {
      const __m256 kv = Load8(k + i);
      for (int64_t g = 0; g < gn; ++g) acc[g] = _mm256_fmadd_ps(_mm256_loadu_ps(qg + g * d + i), kv, acc[g]);
    }
    for (int64_t g = 0; g < gn; ++g) sums[g] = Sum8(acc[g]);
#endif
    for (; i < d; ++i)
      for (int64_t g = 0; g < gn; ++g) sums[g] += qg[g * d + i] * ToFloat(k[i]);
    for (int64_t g = 0; g < gn; ++g) out[(g0 + g) * stride] = sums[g] * scale;
  }
}

// out[:dv] = sum_j p[j] * value(j)[:dv] over `keys` value rows, 64 output values
// at a time held in registers (each value row read once per query).
template <class Value>
void WeightedSum(int64_t keys, int64_t dv, const float* __restrict p, Value value, float* __restrict out) {
  int64_t c = 0;
#ifdef MAXFX_ATTENTION_AVX2
  constexpr int64_t kChunk = 64;
  for (; c + kChunk <= dv; c += kChunk) {
    __m256 acc[kChunk / 8];
    for (auto& a : acc) a = _mm256_setzero_ps();
    for (int64_t j = 0; j < keys; ++j) {
      const auto* vj = value(j) + c;
      if (j + kAhead < keys) Prefetch(value(j + kAhead) + c, kChunk);
      const __m256 pj = _mm256_set1_ps(p[j]);
      for (int64_t u = 0; u < kChunk / 8; ++u) acc[u] = _mm256_fmadd_ps(pj, Load8(vj + 8 * u), acc[u]);
    }
    for (int64_t u = 0; u < kChunk / 8; ++u) _mm256_storeu_ps(out + c + 8 * u, acc[u]);
  }
#endif
  std::fill(out + c, out + dv, 0.0f);
  for (int64_t j = 0; j < keys && c < dv; ++j) {
    const auto* vj = value(j);
    for (int64_t i = c; i < dv; ++i) out[i] += p[j] * ToFloat(vj[i]);
  }
}

// Each of `rows` score rows of `keys` becomes exp(s - max) / sum (in place).
void Softmax(float* s, int64_t rows, int64_t keys) {
  for (int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * keys;
    const float m = *std::max_element(sr, sr + keys);
    float sum = 0.0f;
    int64_t j = 0;
#ifdef MAXFX_ATTENTION_AVX2
    __m256 total = _mm256_setzero_ps();
    for (; j + 8 <= keys; j += 8) {
      const __m256 e = Exp8(_mm256_sub_ps(_mm256_loadu_ps(sr + j), _mm256_set1_ps(m)));
      _mm256_storeu_ps(sr + j, e);
      total = _mm256_add_ps(total, e);
    }
    sum = Sum8(total);
#endif
    for (; j < keys; ++j) sum += (sr[j] = std::exp(sr[j] - m));
    const float inv = 1.0f / sum;
    for (j = 0; j < keys; ++j) sr[j] *= inv;
  }
}

// One row of the paged kernel: the queries of KV heads [h0, h1) (G each) against
// the row's visible keys [lo, hi). A page holds its keys as [page_size, H, D], so
// with every head in one call each key row's heads are read together, one pass
// over each page in memory order; a call per head (a row split over the threads
// when the batch has fewer rows than threads) reads its own slices of them.
template <class T>
void PagedRow(int64_t h, int64_t h0, int64_t h1, int64_t g_count, int64_t d, int64_t dv, int64_t ps, int64_t pages, const int32_t* row_pages,
              int64_t lo, int64_t hi, const float* q, const T* k, const T* v, float scale, float* out) {
  const int64_t queries = (h1 - h0) * g_count;
  q += h0 * g_count * d;
  out += h0 * g_count * dv;
  std::fill(out, out + queries * dv, 0.0f);
  lo = std::max<int64_t>(lo, 0);
  const int64_t keys = hi - lo;
  if (keys <= 0) return;
  // Slot of each visible key, page by page (one division per page); pages clamped into the pool as the reference's gather clamps.
  std::vector<int64_t> slot(keys);
  for (int64_t l = lo; l < hi;) {
    const int64_t page = std::clamp<int64_t>(row_pages[l / ps], 0, pages - 1), off = l % ps, n = std::min(ps - off, hi - l);
    for (int64_t i = 0; i < n; ++i) slot[l - lo + i] = page * ps + off + i;
    l += n;
  }
  std::vector<float> s(queries * keys);  // scores [head, g, key], then probabilities
  for (int64_t j = 0; j < keys; ++j) {
    const T* kj = k + slot[j] * h * d;
    if (j + kAhead < keys) Prefetch(k + slot[j + kAhead] * h * d + h0 * d, (h1 - h0) * d);
    for (int64_t head = h0; head < h1; ++head) {
      Scores(g_count, d, q + (head - h0) * g_count * d, kj + head * d, scale, s.data() + (head - h0) * g_count * keys + j, keys);
    }
  }
  Softmax(s.data(), queries, keys);
  for (int64_t i = 0; i < queries; ++i) {
    const T* vh = v + (h0 + i / g_count) * dv;  // this query's KV head in each value row
    WeightedSum(keys, dv, s.data() + i * keys, [&](int64_t j) { return vh + slot[j] * h * dv; }, out + i * dv);
  }
}

ffi::Error PagedDecodeAttentionImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                                    ffi::Buffer<ffi::S32> table, ffi::Buffer<ffi::S32> lo, ffi::Buffer<ffi::S32> hi, float scale,
                                    ffi::ResultBuffer<ffi::F32> out) {
  const auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions(), td = table.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || vd.size() != 4 || td.size() != 2) {
    return ffi::Error::InvalidArgument("maxfx_paged_decode_attention: q, k, v must be rank 4 and table rank 2");
  }
  const int64_t b_count = qd[0], h = qd[1], g = qd[2], d = qd[3], pages = kd[0], ps = kd[1], dv = vd[3], width = td[1];
  if (kd[2] != h || kd[3] != d || vd[0] != pages || vd[1] != ps || vd[2] != h || td[0] != b_count || lo.element_count() != b_count ||
      hi.element_count() != b_count) {
    return ffi::Error::InvalidArgument("maxfx_paged_decode_attention: q [B, H, G, D], k [P, S, H, D], v [P, S, H, Dv], table [B, W], lo and hi [B] disagree");
  }
  const auto kt = k.element_type();
  if (v.element_type() != kt || (kt != ffi::DataType::F32 && kt != ffi::DataType::F16)) {
    return ffi::Error::InvalidArgument("maxfx_paged_decode_attention: k and v pages must both be float32 or both float16");
  }
  const float* qs = q.typed_data();
  const int32_t *tab = table.typed_data(), *los = lo.typed_data(), *his = hi.typed_data();
  float* os = out->typed_data();
  const int64_t work = b_count * h * g * width * ps * (d + dv);
  // A work item is a row, or one KV head of a row when the rows are too few to keep every thread busy.
  const int64_t split = b_count >= 2 * std::max<int64_t>(1, pool.num_threads()) ? 1 : h;
  auto run = [&](const auto* ks, const auto* vs) {
    maxfx_cpu::ParallelFor(pool, b_count * split, 1, work >= (int64_t{1} << 18), [&](int64_t item) {
      const int64_t b = item / split, h0 = item % split * h / split, h1 = (item % split + 1) * h / split;
      PagedRow(h, h0, h1, g, d, dv, ps, pages, tab + b * width, los[b], std::min<int64_t>(his[b], width * ps), qs + b * h * g * d, ks, vs, scale,
               os + b * h * g * dv);
    });
  };
  if (kt == ffi::DataType::F16) {
    run(static_cast<const Half*>(k.untyped_data()), static_cast<const Half*>(v.untyped_data()));
  } else {
    run(static_cast<const float*>(k.untyped_data()), static_cast<const float*>(v.untyped_data()));
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(MaxfxPagedDecodeAttention, PagedDecodeAttentionImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Attr<float>("scale")
                                  .Ret<ffi::Buffer<ffi::F32>>());
