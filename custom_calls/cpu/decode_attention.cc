// CPU kernel for one query per row against a head-major KV cache (LLM decode).
//
// o[b, h, g] = sum_l softmax_l(scale * q[b, h, g] . k[b, h, l]) v[b, h, l] over
// the visible keys l in [lo[b], hi[b]) (clamped to the cache; none visible: o = 0).
// The causal mask, valid lengths and sliding windows of a decode step are all
// such a range, which custom_calls/attention/cpu.py computes.
//
// Why a kernel: as XLA ops a layer's decode attention is ~9 small thunks
// (scores, mask, max, exp, sums, division, values), and the products run as
// YNNPACK fusions that wake a pool thread each (~20-50 us per call, 30 layers a
// token). Here one call reads each key and value row once for all G query heads
// that share it (grouped-query attention), in float32 as the jnp reference does
// (custom_calls/attention/reference.py, equal up to summation order).
//
// Handlers (XLA FFI, CPU):
//   maxfx_decode_attention(q f32[B, H, G, D], k f32[B, H, L, D], v f32[B, H, L, Dv],
//                          lo s32[B], hi s32[B]; scale f32) -> f32[B, H, G, Dv]
//   maxfx_paged_decode_attention(q f32[B, H, G, D], k f32[P, S, H, D], v f32[P, S, H, Dv],
//                                table s32[B, W], lo s32[B], hi s32[B]; scale f32) -> f32[B, H, G, Dv]
// The paged one reads row b's key l from page table[b, l / S], slot l % S, in
// place: the generation engine's KV pool is never gathered into a dense window
// (that copy cost more than the attention itself).

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

inline float Dot(const float* __restrict a, const float* __restrict b, int64_t n) {
  int64_t i = 0;
  float s = 0.0f;
#if defined(__AVX512F__)
  __m512 acc = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
  s = _mm512_reduce_add_ps(acc);
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  s = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
#endif
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// out += p * x (the compiler vectorizes this loop).
inline void Axpy(float* __restrict out, float p, const float* __restrict x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] += p * x[i];
}

struct Dims {
  int64_t b, h, g, l, d, dv;
};

// Each of `rows` score rows of `keys` becomes exp(s - max); returns 1 / sum per row.
std::vector<float> Softmax(float* s, int64_t rows, int64_t keys) {
  std::vector<float> inv(rows);
  for (int64_t i = 0; i < rows; ++i) {
    float* si = s + i * keys;
    const float m = *std::max_element(si, si + keys);
    float sum = 0.0f;
    for (int64_t j = 0; j < keys; ++j) sum += (si[j] = std::exp(si[j] - m));
    inv[i] = 1.0f / sum;
  }
  return inv;
}

// One (row, KV head): its G queries against the visible keys; key(l) and value(l)
// point at key and value row l (a dense cache or a page of the pool).
template <class Key, class Value>
void Head(int64_t g_count, int64_t d, int64_t dv, int64_t length, const float* q, Key key, Value value, int64_t lo, int64_t hi,
          float scale, float* out) {
  std::fill(out, out + g_count * dv, 0.0f);
  lo = std::max<int64_t>(lo, 0);
  hi = std::min<int64_t>(hi, length);
  const int64_t keys = hi - lo;
  if (keys <= 0) return;
  std::vector<float> s(g_count * keys);  // scores, then probabilities
  for (int64_t j = 0; j < keys; ++j) {
    const float* kj = key(lo + j);
    for (int64_t g = 0; g < g_count; ++g) s[g * keys + j] = Dot(q + g * d, kj, d) * scale;
  }
  const std::vector<float> inv = Softmax(s.data(), g_count, keys);
  for (int64_t j = 0; j < keys; ++j) {
    const float* vj = value(lo + j);
    for (int64_t g = 0; g < g_count; ++g) Axpy(out + g * dv, s[g * keys + j] * inv[g], vj, dv);
  }
}

ffi::Error DecodeAttentionImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                               ffi::Buffer<ffi::S32> lo, ffi::Buffer<ffi::S32> hi, float scale, ffi::ResultBuffer<ffi::F32> out) {
  const auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || vd.size() != 4) return ffi::Error::InvalidArgument("maxfx_decode_attention: q, k, v must be rank 4");
  const Dims n{qd[0], qd[1], qd[2], kd[2], qd[3], vd[3]};
  if (kd[0] != n.b || kd[1] != n.h || kd[3] != n.d || vd[0] != n.b || vd[1] != n.h || vd[2] != n.l ||
      lo.element_count() != n.b || hi.element_count() != n.b) {
    return ffi::Error::InvalidArgument("maxfx_decode_attention: q [B, H, G, D], k [B, H, L, D], v [B, H, L, Dv], lo and hi [B] disagree");
  }
  const float *qs = q.typed_data(), *ks = k.typed_data(), *vs = v.typed_data();
  const int32_t *los = lo.typed_data(), *his = hi.typed_data();
  float* os = out->typed_data();
  const int64_t work = n.b * n.h * n.g * n.l * (n.d + n.dv);  // multiply-adds at most
  maxfx_cpu::ParallelFor(pool, n.b * n.h, 1, work >= (int64_t{1} << 20), [&](int64_t bh) {
    const int64_t b = bh / n.h;
    const float *k0 = ks + bh * n.l * n.d, *v0 = vs + bh * n.l * n.dv;
    Head(n.g, n.d, n.dv, n.l, qs + bh * n.g * n.d, [&](int64_t l) { return k0 + l * n.d; }, [&](int64_t l) { return v0 + l * n.dv; },
         los[b], his[b], scale, os + bh * n.g * n.dv);
  });
  return ffi::Error::Success();
}

// One row of the paged kernel: all H x G queries against its visible keys [lo, hi).
// A page holds its keys as [page_size, H, D], so each key row's H heads are read
// together, one pass over each page in memory order: per-head passes over the
// interleaved heads read each cache line three times from memory once the weights
// streamed between layers have evicted the pool (3x slower than the dense kernel).
void PagedRow(int64_t h, int64_t g_count, int64_t d, int64_t dv, int64_t ps, int64_t pages, const int32_t* row_pages, int64_t lo, int64_t hi,
              const float* q, const float* k, const float* v, float scale, float* out) {
  const int64_t queries = h * g_count;
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
    const float* kj = k + slot[j] * h * d;
    for (int64_t head = 0; head < h; ++head)
      for (int64_t g = 0; g < g_count; ++g) s[(head * g_count + g) * keys + j] = Dot(q + (head * g_count + g) * d, kj + head * d, d) * scale;
  }
  const std::vector<float> inv = Softmax(s.data(), queries, keys);
  for (int64_t j = 0; j < keys; ++j) {
    const float* vj = v + slot[j] * h * dv;
    for (int64_t head = 0; head < h; ++head)
      for (int64_t g = 0; g < g_count; ++g) {
        const int64_t i = head * g_count + g;
        Axpy(out + i * dv, s[i * keys + j] * inv[i], vj + head * dv, dv);
      }
  }
}

ffi::Error PagedDecodeAttentionImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
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
  const float *qs = q.typed_data(), *ks = k.typed_data(), *vs = v.typed_data();
  const int32_t *tab = table.typed_data(), *los = lo.typed_data(), *his = hi.typed_data();
  float* os = out->typed_data();
  const int64_t work = b_count * h * g * width * ps * (d + dv);
  maxfx_cpu::ParallelFor(pool, b_count, 1, work >= (int64_t{1} << 20), [&](int64_t b) {
    PagedRow(h, g, d, dv, ps, pages, tab + b * width, los[b], std::min<int64_t>(his[b], width * ps), qs + b * h * g * d, ks, vs, scale,
             os + b * h * g * dv);
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(MaxfxDecodeAttention, DecodeAttentionImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Attr<float>("scale")
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(MaxfxPagedDecodeAttention, PagedDecodeAttentionImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Attr<float>("scale")
                                  .Ret<ffi::Buffer<ffi::F32>>());
