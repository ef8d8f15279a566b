// CPU kernels for GGUF quantized matrix products with few rows (LLM decode).
//
// y[m, n] = sum_k x[m, k] * W[n, k], W given in its 8- or 4-bit GGUF blocks and
// read once per call: each 32-value block is decoded to float in registers and
// used for every row of x (rows <= kMaxRows), so a decode step moves the bytes
// the file holds (1.06 B/weight for Q8_0, 0.56 for Q4_0) instead of the 4-8 B/weight
// of a dequantized copy. Output rows n are split over XLA's own CPU thread pool
// (the handler's ThreadPool context), so the kernel never competes with a second
// pool for the cores; chunks are taken first come, first served, so a busy core
// slows a call down by its share of the work, not by a whole chunk.
//
// The arithmetic per block is float: block_sum = sum_k x[k] * q[k] (q the block's
// integers), then acc += block_sum * d, the same products as llama.cpp's
// dequantize-then-dot and as custom_calls/qmatmul/reference.py up to float
// summation order. Built by custom_calls/cpu/__init__.py with
// -O3 -march=native; AVX-512 where the machine has it, else AVX2 + FMA + F16C,
// a scalar loop elsewhere.
//
// Handlers (XLA FFI, registered for the CPU platform):
//   maxfx_q8_0_matmul(x f32[..., K], q s8[N, K], d f16[N, K/32]) -> f32[..., N]
//       Q8_0 split as maxfx.nn._q8 keeps it: the int8 values and one scale per 32.
//   maxfx_q4_0_matmul(x f32[..., K], w u8[N, K/32*18]) -> f32[..., N]
//       Q4_0 rows as GGUF stores them: per block a f16 scale, then 16 bytes whose
//       low nibbles are values 0..15 and high nibbles values 16..31, value = nibble - 8.

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kBlock = 32;
constexpr int64_t kQ4Bytes = 18;
constexpr int64_t kMaxRows = 16;
constexpr int64_t kMinRowsPerChunk = 32;

// Whether a product of `weights` values is worth a helper thread: waking one
// costs ~20 us, about what one core spends on 256K weights.
inline bool Worth(int64_t weights) { return weights >= (int64_t{1} << 18); }

inline float HalfToFloat(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      int e = -1;
      uint32_t m = man;
      do { ++e; m <<= 1; } while ((m & 0x400u) == 0);
      bits = sign | ((127 - 15 - e) << 23) | ((m & 0x3FFu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
#endif
}

#if defined(__AVX512F__)
// One block's 32 weights as two vectors of 16 floats (before the block scale).
// AVX-512 halves the conversions and FMAs per weight against AVX2: at one row
// the loop is bound by those, not by memory, so this is the kernel's speed.
struct Block {
  __m512 v[2];
};

inline __m512 Widen(__m128i bytes) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes)); }

inline Block DecodeQ8(const int8_t* q) {
  return {{Widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))), Widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16)))}};
}

inline Block DecodeQ4(const uint8_t* nib) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(nib));
  const __m128i mask = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
  const __m128i lo = _mm_sub_epi8(_mm_and_si128(raw, mask), eight);                     // values 0..15
  const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), mask), eight);  // values 16..31
  return {{Widen(lo), Widen(hi)}};
}

using Acc = __m512;
inline Acc Zero() { return _mm512_setzero_ps(); }
inline float HorizontalSum(Acc v) { return _mm512_reduce_add_ps(v); }

inline Acc BlockDot(const Block& w, const float* xb, float d, Acc acc) {
  __m512 s = _mm512_mul_ps(w.v[0], _mm512_loadu_ps(xb));
  s = _mm512_fmadd_ps(w.v[1], _mm512_loadu_ps(xb + 16), s);
  return _mm512_fmadd_ps(s, _mm512_set1_ps(d), acc);
}
#define MAXFX_QGEMV_SIMD 1
#elif defined(__AVX2__) && defined(__FMA__)
// One block's 32 weights as four vectors of 8 floats (before the block scale).
struct Block {
  __m256 v[4];
};

inline __m256 Widen(__m128i eight_bytes) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eight_bytes)); }

inline Block DecodeQ8(const int8_t* q) {
  Block b;
  for (int i = 0; i < 4; ++i) b.v[i] = Widen(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8 * i)));
  return b;
}

inline Block DecodeQ4(const uint8_t* nib) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(nib));
  const __m128i mask = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
  const __m128i lo = _mm_sub_epi8(_mm_and_si128(raw, mask), eight);                     // values 0..15
  const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), mask), eight);  // values 16..31
  return {{Widen(lo), Widen(_mm_srli_si128(lo, 8)), Widen(hi), Widen(_mm_srli_si128(hi, 8))}};
}

using Acc = __m256;
inline Acc Zero() { return _mm256_setzero_ps(); }

inline float HorizontalSum(Acc v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline Acc BlockDot(const Block& w, const float* xb, float d, Acc acc) {
  __m256 s = _mm256_mul_ps(w.v[0], _mm256_loadu_ps(xb));
  s = _mm256_fmadd_ps(w.v[1], _mm256_loadu_ps(xb + 8), s);
  s = _mm256_fmadd_ps(w.v[2], _mm256_loadu_ps(xb + 16), s);
  s = _mm256_fmadd_ps(w.v[3], _mm256_loadu_ps(xb + 24), s);
  return _mm256_fmadd_ps(s, _mm256_set1_ps(d), acc);
}
#define MAXFX_QGEMV_SIMD 1
#endif

#ifdef MAXFX_QGEMV_SIMD
// Output row n for every row m of x: acc[m] = sum_b d_b * (x[m, block b] . w_b).
// kRows > 0 fixes the row count at compile time (the accumulators then live in
// registers: the one-row case of decode); kRows == 0 takes m_rows at run time.
template <int kRows, typename Decode>
inline void Row(int64_t m_rows, int64_t k_dim, const float* __restrict x, Decode decode, float* __restrict out_m, int64_t stride) {
  const int64_t rows = kRows > 0 ? kRows : m_rows;
  Acc acc[kRows > 0 ? kRows : kMaxRows];
  for (int64_t m = 0; m < rows; ++m) acc[m] = Zero();
  const int64_t blocks = k_dim / kBlock;
  for (int64_t b = 0; b < blocks; ++b) {
    float d;
    const Block w = decode(b, &d);
    for (int64_t m = 0; m < rows; ++m) acc[m] = BlockDot(w, x + m * k_dim + b * kBlock, d, acc[m]);
  }
  for (int64_t m = 0; m < rows; ++m) out_m[m * stride] = HorizontalSum(acc[m]);
}

inline Block Q8Decoder(const int8_t* qrow, const uint16_t* drow, int64_t b, float* d) {
  *d = HalfToFloat(drow[b]);
  return DecodeQ8(qrow + b * kBlock);
}

inline Block Q4Decoder(const uint8_t* row, int64_t b, float* d) {
  const uint8_t* blk = row + b * kQ4Bytes;
  uint16_t h;
  std::memcpy(&h, blk, 2);
  *d = HalfToFloat(h);
  return DecodeQ4(blk + 2);
}

inline void Q8Row(int64_t m_rows, int64_t k_dim, const float* x, const int8_t* qrow, const uint16_t* drow, float* out, int64_t stride) {
  auto decode = [&](int64_t b, float* d) { return Q8Decoder(qrow, drow, b, d); };
  if (m_rows == 1) return Row<1>(1, k_dim, x, decode, out, stride);
  Row<0>(m_rows, k_dim, x, decode, out, stride);
}

inline void Q4Row(int64_t m_rows, int64_t k_dim, const float* x, const uint8_t* row, float* out, int64_t stride) {
  auto decode = [&](int64_t b, float* d) { return Q4Decoder(row, b, d); };
  if (m_rows == 1) return Row<1>(1, k_dim, x, decode, out, stride);
  Row<0>(m_rows, k_dim, x, decode, out, stride);
}
#else
// Portable scalar form of the same arithmetic.
template <typename Decode>
inline void Row(int64_t m_rows, int64_t k_dim, const float* x, Decode decode, float* out_m, int64_t stride) {
  float acc[kMaxRows] = {};
  float w[kBlock];
  for (int64_t b = 0; b < k_dim / kBlock; ++b) {
    const float d = decode(b, w);
    for (int64_t m = 0; m < m_rows; ++m) {
      float s = 0.0f;
      for (int64_t k = 0; k < kBlock; ++k) s += w[k] * x[m * k_dim + b * kBlock + k];
      acc[m] += s * d;
    }
  }
  for (int64_t m = 0; m < m_rows; ++m) out_m[m * stride] = acc[m];
}

inline void Q8Row(int64_t m_rows, int64_t k_dim, const float* x, const int8_t* qrow, const uint16_t* drow, float* out, int64_t stride) {
  Row(m_rows, k_dim, x, [&](int64_t b, float* w) {
    for (int64_t k = 0; k < kBlock; ++k) w[k] = static_cast<float>(qrow[b * kBlock + k]);
    return HalfToFloat(drow[b]);
  }, out, stride);
}

inline void Q4Row(int64_t m_rows, int64_t k_dim, const float* x, const uint8_t* row, float* out, int64_t stride) {
  Row(m_rows, k_dim, x, [&](int64_t b, float* w) {
    const uint8_t* blk = row + b * kQ4Bytes;
    uint16_t h;
    std::memcpy(&h, blk, 2);
    for (int64_t j = 0; j < kBlock / 2; ++j) {
      w[j] = static_cast<float>(static_cast<int>(blk[2 + j] & 0x0F) - 8);
      w[j + kBlock / 2] = static_cast<float>(static_cast<int>(blk[2 + j] >> 4) - 8);
    }
    return HalfToFloat(h);
  }, out, stride);
}
#endif

ffi::Error CheckShapes(int64_t k_dim, int64_t m_rows, const char* name) {
  if (k_dim % kBlock != 0) return ffi::Error::InvalidArgument(std::string(name) + ": K must be a multiple of 32");
  if (m_rows > kMaxRows) return ffi::Error::InvalidArgument(std::string(name) + ": at most 16 rows of x");
  return ffi::Error::Success();
}

ffi::Error Q8_0Impl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S8> q, ffi::Buffer<ffi::F16> d,
                    ffi::ResultBuffer<ffi::F32> y) {
  const auto qd = q.dimensions();
  const int64_t n_dim = qd[0], k_dim = qd[1];
  const int64_t m_rows = k_dim ? static_cast<int64_t>(x.element_count()) / k_dim : 0;
  if (auto e = CheckShapes(k_dim, m_rows, "maxfx_q8_0_matmul"); e.failure()) return e;
  const float* xs = x.typed_data();
  const int8_t* qs = q.typed_data();
  const uint16_t* ds = reinterpret_cast<const uint16_t*>(d.typed_data());
  float* out = y->typed_data();
  const int64_t blocks = k_dim / kBlock;
  maxfx_cpu::ParallelFor(pool, n_dim, kMinRowsPerChunk, Worth(n_dim * k_dim), [&](int64_t n) { Q8Row(m_rows, k_dim, xs, qs + n * k_dim, ds + n * blocks, out + n, n_dim); });
  return ffi::Error::Success();
}

ffi::Error Q4_0Impl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::U8> packed, ffi::ResultBuffer<ffi::F32> y) {
  const auto pd = packed.dimensions();
  const int64_t n_dim = pd[0], row_bytes = pd[1];
  if (row_bytes % kQ4Bytes != 0) return ffi::Error::InvalidArgument("maxfx_q4_0_matmul: row bytes must be a multiple of 18");
  const int64_t k_dim = row_bytes / kQ4Bytes * kBlock;
  const int64_t m_rows = k_dim ? static_cast<int64_t>(x.element_count()) / k_dim : 0;
  if (auto e = CheckShapes(k_dim, m_rows, "maxfx_q4_0_matmul"); e.failure()) return e;
  const float* xs = x.typed_data();
  const uint8_t* ws = packed.typed_data();
  float* out = y->typed_data();
  maxfx_cpu::ParallelFor(pool, n_dim, kMinRowsPerChunk, Worth(n_dim * k_dim), [&](int64_t n) { Q4Row(m_rows, k_dim, xs, ws + n * row_bytes, out + n, n_dim); });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(MaxfxQ8_0Matmul, Q8_0Impl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::F16>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(MaxfxQ4_0Matmul, Q4_0Impl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
