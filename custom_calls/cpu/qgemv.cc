// CPU kernels for GGUF Q8_0 / Q4_0 / Q4_K matrix products (LLM decode and prefill).
//
// y[m, n] = sum_k x[m, k] * W[n, k], W given in its 8- or 4-bit GGUF blocks and
// read once per call, so a decode step moves the bytes the file holds (1.06 B per
// weight for Q8_0, 0.56 for Q4_0) instead of the 4-8 B of a dequantized copy.
//
// Each row of x is first quantized to int16 per 32 values (d = max|x| / 32767
// in float32, q = round(x / d)), then each block's dot product is exact integer
// arithmetic and the result is sum_b d_w[b] * d_x[b] * (q_w[b] . q_x[b]). The
// integer dots run on AVX-512 VNNI (vpdpwssd: 32 products per instruction) or,
// on CPUs without it (AMD Zen 2/3, older Intel), AVX2 (vpmaddwd + vpaddd: 16 per
// two), which keeps one core fast enough to stream weights from memory; a float
// kernel spends ~4 instructions per 16 weights widening bytes to floats.
// Rounding x to 16 bits changes a product by at most 2^-16 of each block's
// largest |x| times the weights, ~100x below float16 rounding and far below
// llama.cpp's 8-bit activations, so greedy tokens match float products
// (custom_calls/qmatmul/reference.py) on the test models.
//
// Output rows n are split over XLA's own CPU thread pool (parallel.h). Built by
// custom_calls/cpu/__init__.py with -O3 -march=native; the VNNI path needs
// AVX512F/BW/VL + AVX512_VNNI, the AVX2 path AVX2 + FMA + F16C (x86-64-v3);
// elsewhere a scalar loop gives the same numbers (slowly: MaxfxQgemvIsFast()
// says which, and the dispatch prefers XLA then).
//
// Handlers (XLA FFI, registered for the CPU platform):
//   maxfx_q8_0_matmul(x f32[..., K], q s8[N, K], d f16[N, K/32]) -> f32[..., N]
//       Q8_0 split as maxfx.nn._q8 keeps it: the int8 values and one scale per 32.
//   maxfx_q4_0_matmul(x f32[..., K], w u8[N, K/32*18]) -> f32[..., N]
//       Q4_0 rows as GGUF stores them: per block a f16 scale, then 16 bytes whose
//       low nibbles are values 0..15 and high nibbles values 16..31, value = nibble - 8.
//   maxfx_f32_matmul(x f32[M, K], w f32[N, K]) -> f32[M, N]
//       Float weights for a few rows of x (decode). XLA runs such a product on one
//       thread (two only when another independent product runs beside it), so a
//       layer's chain of projections read ~14 GB/s; this splits the weight rows
//       over the pool and reads each once for all rows of x, prefetching ahead.
//   maxfx_q4_k_matmul(x f32[..., K], w u8[N, K/256*144]) -> f32[..., N]
//       Q4_K rows as GGUF stores them: per 256 values f16 d and dmin, 12 bytes of
//       6-bit scales and mins for the 8 sub-blocks of 32, then 128 nibble bytes;
//       value = d * scale_j * nibble - dmin * min_j. The min term of a sub-block is
//       min_j times the sum of its 32 activations (kept per block when x is quantized).

#include <immintrin.h>

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "simd.h"
#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kBlock = 32;
constexpr int64_t kQ4Bytes = 18;
constexpr int64_t kSuper = 256;  // Q4_K: values per super-block (8 sub-blocks of 32)
constexpr int64_t kQ4KBytes = 144;
constexpr int64_t kMaxRows = 16;
// Quantized products take the one-accumulator-per-row path for at most this many
// rows of x: its cost grows with every row (4 instructions per row and block, the
// accumulators spill past a few rows), while the blocked product's lanes cover 16
// rows at once. Measured on a 4608x576 Q8_0 weight (AVX-512 VNNI, 2 cores): 1 row
// 0.25 ms, 4 rows 0.64 ms, 8 rows 2.5 ms, 16 rows 3.1 ms one per row; 1.0-2.2 ms blocked.
constexpr int64_t kFewQuantizedRows = 4;
constexpr int64_t kMinRowsPerChunk = 32;

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define MAXFX_QGEMV_VNNI 1
#define MAXFX_QGEMV_SIMD 1
#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__linux__)
#define MAXFX_QGEMV_AMX 1
#endif
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define MAXFX_QGEMV_AVX2 1
#define MAXFX_QGEMV_SIMD 1
#endif

#ifdef MAXFX_QGEMV_SIMD
// The vector operations the kernels are written in, for the one instruction set
// this library is built for: AVX-512 VNNI (16 lanes; an int16 pair dot is one
// vpdpwssd) or AVX2 (8 lanes, as on AMD Zen 2/3 and older Intel cores: vpmaddwd
// then vpaddd). Both add the same exact int32 pair products, so the two builds
// differ only in the order of the float sums.
struct Vec {
#ifdef MAXFX_QGEMV_VNNI
  using F = __m512;
  using I = __m512i;
  static constexpr int kLanes = 16;
  static F Zero() { return _mm512_setzero_ps(); }
  static I ZeroI() { return _mm512_setzero_si512(); }
  static F Set1(float v) { return _mm512_set1_ps(v); }
  static I Set1I(int32_t v) { return _mm512_set1_epi32(v); }
  static F Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static I LoadI(const void* p) { return _mm512_loadu_si512(p); }
  static void StoreI(void* p, I v) { _mm512_storeu_si512(p, v); }
  // The first n < kLanes floats at p, zeros after.
  static F LoadPartial(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), p); }
  static F Fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F Mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F Add(F a, F b) { return _mm512_add_ps(a, b); }
  static F Sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F ToFloat(I v) { return _mm512_cvtepi32_ps(v); }
  static float Sum(F v) { return _mm512_reduce_add_ps(v); }
  // acc + (a[2i] * b[2i] + a[2i+1] * b[2i+1]) per int32 lane i of int16 pairs.
  static I DotPairs(I acc, I a, I b) { return _mm512_dpwssd_epi32(acc, a, b); }
#else
  using F = __m256;
  using I = __m256i;
  static constexpr int kLanes = 8;
  static F Zero() { return _mm256_setzero_ps(); }
  static I ZeroI() { return _mm256_setzero_si256(); }
  static F Set1(float v) { return _mm256_set1_ps(v); }
  static I Set1I(int32_t v) { return _mm256_set1_epi32(v); }
  static F Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static I LoadI(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static void StoreI(void* p, I v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
  static F LoadPartial(const float* p, int64_t n) {
    return _mm256_maskload_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
  }
  static F Fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F Mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F Add(F a, F b) { return _mm256_add_ps(a, b); }
  static F Sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F ToFloat(I v) { return _mm256_cvtepi32_ps(v); }
  static float Sum(F v) { return maxfx_cpu::Sum8(v); }
  // The empty asm keeps the sum in a register: left free, GCC reassociates a
  // block's adds into a tree and spills every product to the stack first (2-3x slower).
  static I DotPairs(I acc, I a, I b) {
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
    asm("" : "+x"(acc));
    return acc;
  }
#endif
  // Vectors of int16 per block of 32 values.
  static constexpr int kPerBlock = kBlock / (2 * kLanes);
};

// One block's 32 weight values as int16, kPerBlock vectors.
struct Block16 {
  Vec::I v[Vec::kPerBlock];
};
#endif

// Whether a product of `weights` values is worth a helper thread: waking one
// costs ~20 us; from 64K weights on (a 192 x 576 projection, ~10 us on one core)
// splitting measured faster in a decode step.
inline bool Worth(int64_t weights) { return weights >= (int64_t{1} << 16); }

// One row of x quantized per 32 values: int16 values, float32 block scales and
// each block's value sum times its scale (what a weight format's min multiplies).
struct QuantizedRow {
  const int16_t* q;
  const float* scale;
  const float* sum;
};

constexpr float kInt16Max = 32767.0f;

// Quantizes x[K] into q, scale and sum (resized here); rounds to nearest even.
QuantizedRow QuantizeRow(const float* x, int64_t k_dim, std::vector<int16_t>& q, std::vector<float>& scale, std::vector<float>& sum) {
  const int64_t blocks = k_dim / kBlock;
  q.resize(k_dim);
  scale.resize(blocks);
  sum.resize(blocks);
  for (int64_t b = 0; b < blocks; ++b) {
    const float* xb = x + b * kBlock;
    int16_t* qb = q.data() + b * kBlock;
#ifdef MAXFX_QGEMV_VNNI
    const __m512 lo = _mm512_loadu_ps(xb), hi = _mm512_loadu_ps(xb + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
    const __m512 inv = _mm512_set1_ps(amax != 0.0f ? kInt16Max / amax : 0.0f);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb), _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(lo, inv))));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb + 16), _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(hi, inv))));
#else
    float amax = 0.0f;
    for (int64_t j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float inv = amax != 0.0f ? kInt16Max / amax : 0.0f;
    for (int64_t j = 0; j < kBlock; ++j) qb[j] = static_cast<int16_t>(std::nearbyint(xb[j] * inv));
#endif
    scale[b] = amax / kInt16Max;
    int32_t total = 0;
    for (int64_t j = 0; j < kBlock; ++j) total += qb[j];
    sum[b] = static_cast<float>(total) * scale[b];
  }
  return {q.data(), scale.data(), sum.data()};
}

// How far ahead of the block being read the kernel asks for weight bytes: a
// software prefetch ~1.5 KB ahead lifts one core's read rate from DRAM from
// ~6 to ~8-9 GB/s on the machine it was tuned on (the hardware prefetcher alone
// leaves the core waiting). Rows of a chunk are consecutive, so reading ahead
// past the end of a row fetches the next one.
constexpr int64_t kPrefetchBytes = 1536;

// A weight row's blocks: Value(b, j) is the integer value j of block b, Scale(b) its scale.
// Formats with kHasMin also subtract Min(b) * (block b's activation sum).
struct Q8Row {
  static constexpr bool kHasMin = false;
  const int8_t* q;
  const uint16_t* d;
  int32_t Value(int64_t b, int64_t j) const { return q[b * kBlock + j]; }
  float Scale(int64_t b) const { return maxfx_cpu::HalfToFloat(d[b]); }
  // The whole row (its K value bytes and K/32 scales).
  void PrefetchAll(int64_t k_dim) const {
    for (int64_t i = 0; i < k_dim; i += 64) _mm_prefetch(reinterpret_cast<const char*>(q + i), _MM_HINT_T0);
    for (int64_t i = 0; i < k_dim / kBlock; i += 32) _mm_prefetch(reinterpret_cast<const char*>(d + i), _MM_HINT_T0);
  }
  // Blocks b and b + 1: 64 value bytes and 4 scale bytes.
  void Prefetch(int64_t b) const {
    _mm_prefetch(reinterpret_cast<const char*>(q + b * kBlock + kPrefetchBytes), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(d + b + kPrefetchBytes / 16), _MM_HINT_T0);
  }
};

struct Q4Row {
  static constexpr bool kHasMin = false;
  const uint8_t* blocks;
  int32_t Value(int64_t b, int64_t j) const {
    const uint8_t v = blocks[b * kQ4Bytes + 2 + j % 16];
    return (j < 16 ? (v & 0x0F) : (v >> 4)) - 8;
  }
  float Scale(int64_t b) const {
    uint16_t h;
    std::memcpy(&h, blocks + b * kQ4Bytes, 2);
    return maxfx_cpu::HalfToFloat(h);
  }
  // The whole row (K / 32 * 18 bytes).
  void PrefetchAll(int64_t k_dim) const {
    for (int64_t i = 0; i < k_dim / kBlock * kQ4Bytes; i += 64) _mm_prefetch(reinterpret_cast<const char*>(blocks + i), _MM_HINT_T0);
  }
  // Blocks b and b + 1: 36 bytes.
  void Prefetch(int64_t b) const { _mm_prefetch(reinterpret_cast<const char*>(blocks + b * kQ4Bytes + kPrefetchBytes), _MM_HINT_T0); }
};

// Q4_K: block b is sub-block b % 8 of super-block b / 8; sub-blocks 2c and 2c + 1
// are the low and high nibbles of the super-block's bytes 32c .. 32c + 31.
struct Q4KRow {
  static constexpr bool kHasMin = true;
  const uint8_t* blocks;
  const uint8_t* Super(int64_t b) const { return blocks + (b / 8) * kQ4KBytes; }
  const uint8_t* Nibbles(int64_t b) const { return Super(b) + 16 + 32 * ((b % 8) / 2); }
  int32_t Value(int64_t b, int64_t j) const {
    const uint8_t v = Nibbles(b)[j];
    return (b % 2) ? (v >> 4) : (v & 0x0F);
  }
  // The 6-bit scale (min = false) or min (min = true) of sub-block j, as GGML packs them.
  static int32_t Six(const uint8_t* s, int64_t j, bool min) {
    if (j < 4) return s[j + (min ? 4 : 0)] & 63;
    return min ? (s[j + 4] >> 4) | ((s[j] >> 6) << 4) : (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
  }
  float Half(int64_t b, int64_t offset) const {
    uint16_t h;
    std::memcpy(&h, Super(b) + offset, 2);
    return maxfx_cpu::HalfToFloat(h);
  }
  float Scale(int64_t b) const { return Half(b, 0) * static_cast<float>(Six(Super(b) + 4, b % 8, false)); }
  float Min(int64_t b) const { return Half(b, 2) * static_cast<float>(Six(Super(b) + 4, b % 8, true)); }
  void PrefetchAll(int64_t k_dim) const {
    for (int64_t i = 0; i < k_dim / kSuper * kQ4KBytes; i += 64) _mm_prefetch(reinterpret_cast<const char*>(blocks + i), _MM_HINT_T0);
  }
  // Blocks b and b + 1: 36 bytes on average (144 per 8 blocks).
  void Prefetch(int64_t b) const { _mm_prefetch(reinterpret_cast<const char*>(blocks + b * kQ4KBytes / 8 + kPrefetchBytes), _MM_HINT_T0); }
};

template <typename W>
inline float MinOf(const W& w, int64_t b) {
  if constexpr (W::kHasMin) {
    return w.Min(b);
  } else {
    return 0.0f;
  }
}

#ifdef MAXFX_QGEMV_SIMD
// Block b's 32 values as int16.
inline Block16 LoadBlock(const Q8Row& w, int64_t b) {
  Block16 out;
#ifdef MAXFX_QGEMV_VNNI
  out.v[0] = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.q + b * kBlock)));
#else
  out.v[0] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.q + b * kBlock)));
  out.v[1] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.q + b * kBlock + 16)));
#endif
  return out;
}

inline Block16 LoadBlock(const Q4Row& w, int64_t b) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.blocks + b * kQ4Bytes + 2));
  const __m128i mask = _mm_set1_epi8(0x0F), lo = _mm_and_si128(raw, mask), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
  Block16 out;
#ifdef MAXFX_QGEMV_VNNI
  out.v[0] = _mm512_sub_epi16(_mm512_cvtepu8_epi16(_mm256_set_m128i(hi, lo)), _mm512_set1_epi16(8));
#else
  out.v[0] = _mm256_sub_epi16(_mm256_cvtepu8_epi16(lo), _mm256_set1_epi16(8));
  out.v[1] = _mm256_sub_epi16(_mm256_cvtepu8_epi16(hi), _mm256_set1_epi16(8));
#endif
  return out;
}

inline Block16 LoadBlock(const Q4KRow& w, int64_t b) {
  __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.Nibbles(b)));
  if (b % 2) raw = _mm256_srli_epi16(raw, 4);
  raw = _mm256_and_si256(raw, _mm256_set1_epi8(0x0F));
  Block16 out;
#ifdef MAXFX_QGEMV_VNNI
  out.v[0] = _mm512_cvtepu8_epi16(raw);
#else
  out.v[0] = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(raw));
  out.v[1] = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(raw, 1));
#endif
  return out;
}

// The int32 pair sums of one block's dot product with x's int16 values at xq.
inline Vec::I BlockDot(const Block16& w, const int16_t* xq) {
  Vec::I dot = Vec::ZeroI();
  for (int v = 0; v < Vec::kPerBlock; ++v) dot = Vec::DotPairs(dot, w.v[v], Vec::LoadI(xq + 2 * Vec::kLanes * v));
  return dot;
}

// Output n for every row m of x. kRows > 0 fixes the row count at compile time
// (the accumulators then live in registers: the one-row case of decode).
template <int kRows, typename W>
inline void Row(int64_t m_rows, int64_t k_dim, const QuantizedRow* x, const W& w, float* __restrict out_m, int64_t stride) {
  const int64_t rows = kRows > 0 ? kRows : m_rows;
  const int64_t blocks = k_dim / kBlock;
  // Two accumulator sets, for even and odd blocks: with one row, one set would
  // make every block wait for the previous block's add.
  Vec::F acc[2][kRows > 0 ? kRows : kMaxRows];
  float offset[kRows > 0 ? kRows : kMaxRows] = {};  // sum_b Min(b) * (block b's activation sum)
  for (int64_t m = 0; m < rows; ++m) acc[0][m] = acc[1][m] = Vec::Zero();
  auto step = [&](int64_t b, Vec::F* a) {
    const Block16 wb = LoadBlock(w, b);
    const Vec::F dw = Vec::Set1(w.Scale(b));
    for (int64_t m = 0; m < rows; ++m) {
      const Vec::I dot = BlockDot(wb, x[m].q + b * kBlock);
      a[m] = Vec::Fmadd(Vec::Mul(Vec::ToFloat(dot), dw), Vec::Set1(x[m].scale[b]), a[m]);
    }
    if constexpr (W::kHasMin) {
      const float mw = w.Min(b);
      for (int64_t m = 0; m < rows; ++m) offset[m] += mw * x[m].sum[b];
    }
  };
  int64_t b = 0;
  for (; b + 2 <= blocks; b += 2) {
    w.Prefetch(b);
    step(b, acc[0]);
    step(b + 1, acc[1]);
  }
  if (b < blocks) step(b, acc[0]);
  for (int64_t m = 0; m < rows; ++m) out_m[m * stride] = Vec::Sum(Vec::Add(acc[0][m], acc[1][m])) - offset[m];
}

template <typename W>
inline void Product(int64_t m_rows, int64_t k_dim, const QuantizedRow* x, const W& w, float* out, int64_t stride) {
  switch (m_rows) {  // a fixed row count keeps the accumulators in registers
    case 1: return Row<1>(1, k_dim, x, w, out, stride);
    case 2: return Row<2>(2, k_dim, x, w, out, stride);
    case 3: return Row<3>(3, k_dim, x, w, out, stride);
    case 4: return Row<4>(4, k_dim, x, w, out, stride);
    default: return Row<0>(m_rows, k_dim, x, w, out, stride);
  }
}
#else
// Portable form of the same arithmetic (integer block dots, then the scales).
template <typename W>
inline void Product(int64_t m_rows, int64_t k_dim, const QuantizedRow* x, const W& w, float* out, int64_t stride) {
  for (int64_t m = 0; m < m_rows; ++m) {
    float acc = 0.0f;
    for (int64_t b = 0; b < k_dim / kBlock; ++b) {
      int32_t dot = 0;
      for (int64_t j = 0; j < kBlock; ++j) dot += w.Value(b, j) * x[m].q[b * kBlock + j];
      acc += static_cast<float>(dot) * w.Scale(b) * x[m].scale[b] - MinOf(w, b) * x[m].sum[b];
    }
    out[m * stride] = acc;
  }
}
#endif

#ifdef MAXFX_QGEMV_SIMD
// ─── Many rows of x (prefill): a blocked product ────────────────────────────
//
// Lanes run over rows of x (16 per vector with AVX-512, 8 with AVX2), so a weight pair (w[n, k], w[n, k+1]) is one
// int32 broadcast and needs no transposing: only x, quantized once per call, is
// repacked. A work item is 16 output columns: their weight rows are decoded to
// int16 once (L1/L2-resident), then every tile of x meets them a few columns at
// a time: 8 accumulators (with AVX-512, tiles of 32 rows: 2 vectors x 4 columns;
// of 16 rows, batched decode: 1 vector x 8 columns, so 9-16 rows do not pay for
// 32; AVX2 tiles of 16 rows are 2 vectors x 4 columns), and per block a float
// multiply-add with both sides' scales.
constexpr int64_t kMaxTileM = 32;  // rows of x per tile
constexpr int64_t kGroupN = 16;  // output columns per work item

// x as tiles of tile_m rows: per tile, pairs[K/2][tile_m] (int16 pairs (x[m, 2p], x[m, 2p+1])
// as int32), scales[K/32][tile_m] and sums[K/32][tile_m] (QuantizedRow::sum); rows past
// m_rows are zero.
struct PackedX {
  int64_t tiles, k_dim, tile_m;
  std::vector<int32_t> pairs;
  std::vector<float> scales, sums;
  const int32_t* Pairs(int64_t t) const { return pairs.data() + t * (k_dim / 2) * tile_m; }
  const float* Scales(int64_t t) const { return scales.data() + t * (k_dim / kBlock) * tile_m; }
  const float* Sums(int64_t t) const { return sums.data() + t * (k_dim / kBlock) * tile_m; }
};

void PackX(ffi::ThreadPool pool, const float* xs, int64_t m_rows, int64_t k_dim, int64_t tile_m, PackedX& px) {
  const int64_t half = k_dim / 2, blocks = k_dim / kBlock;
  px.tiles = (m_rows + tile_m - 1) / tile_m;
  px.k_dim = k_dim;
  px.tile_m = tile_m;
  px.pairs.resize(px.tiles * half * tile_m);
  px.scales.resize(px.tiles * blocks * tile_m);
  px.sums.resize(px.tiles * blocks * tile_m);
  // One tile per work item: a tile's lanes share cache lines, so one core writes them all.
  maxfx_cpu::ParallelFor(pool, px.tiles, 1, Worth(m_rows * k_dim), [&](int64_t t) {
    int32_t* pairs = px.pairs.data() + t * half * tile_m;
    float* scales = px.scales.data() + t * blocks * tile_m;
    float* sums = px.sums.data() + t * blocks * tile_m;
    std::vector<int16_t> q;
    std::vector<float> scale, sum;
    for (int64_t i = 0; i < tile_m; ++i) {  // row i of the tile into lane i
      if (t * tile_m + i < m_rows) {
        QuantizeRow(xs + (t * tile_m + i) * k_dim, k_dim, q, scale, sum);
      } else {  // past the last row: zeros (the buffers are reused across calls)
        q.assign(k_dim, 0);
        scale.assign(blocks, 0.0f);
        sum.assign(blocks, 0.0f);
      }
      for (int64_t p = 0; p < half; ++p) std::memcpy(pairs + p * tile_m + i, q.data() + 2 * p, 4);
      for (int64_t b = 0; b < blocks; ++b) {
        scales[b * tile_m + i] = scale[b];
        sums[b * tile_m + i] = sum[b];
      }
    }
  });
}

// One block b of a tile: out[c][i] += d_x[i] * d_w[c] * (x[i] . w[c]) over the
// block's 32 values, for the tile's Vec::kLanes * kVecs rows i and kCols weight rows w[c].
template <int kVecs, int kCols>
inline void KernelBlock(const int32_t* __restrict xp, const float* __restrict dx, const int16_t* const* w, const float* dw, float* __restrict out) {
  constexpr int64_t kTileM = Vec::kLanes * kVecs;
  Vec::I acc[kCols][kVecs];
  for (int c = 0; c < kCols; ++c)
    for (int v = 0; v < kVecs; ++v) acc[c][v] = Vec::ZeroI();
  // Unrolled: in a loop GCC copies every accumulator twice per pass.
#pragma GCC unroll 16
  for (int64_t p = 0; p < kBlock / 2; ++p) {
    Vec::I xv[kVecs];
    for (int v = 0; v < kVecs; ++v) xv[v] = Vec::LoadI(xp + p * kTileM + Vec::kLanes * v);
    for (int c = 0; c < kCols; ++c) {
      int32_t pair;
      std::memcpy(&pair, w[c] + 2 * p, 4);
      const Vec::I wv = Vec::Set1I(pair);
      for (int v = 0; v < kVecs; ++v) acc[c][v] = Vec::DotPairs(acc[c][v], xv[v], wv);
    }
  }
  for (int c = 0; c < kCols; ++c) {
    const Vec::F s = Vec::Set1(dw[c]);
    float* o = out + c * kTileM;
    for (int v = 0; v < kVecs; ++v) {
      const Vec::F d = Vec::Load(dx + Vec::kLanes * v);
      Vec::Store(o + Vec::kLanes * v, Vec::Fmadd(Vec::Mul(Vec::ToFloat(acc[c][v]), d), s, Vec::Load(o + Vec::kLanes * v)));
    }
  }
}

// The blocked product over tiles of kTileM rows of x.
template <int kTileM, typename RowOf>
void ManyRows(ffi::ThreadPool pool, const float* xs, int64_t m_rows, int64_t k_dim, int64_t n_dim, const RowOf& row_of, float* out) {
  constexpr int kVecs = kTileM / Vec::kLanes;
  static_assert(kTileM <= kMaxTileM && kTileM % Vec::kLanes == 0);
  constexpr int kKernelN = 8 / kVecs;  // columns per microkernel call: 8 accumulators
  thread_local PackedX px;  // the calling thread's; helpers only read it
  PackX(pool, xs, m_rows, k_dim, kTileM, px);
  const int64_t blocks = k_dim / kBlock, groups = (n_dim + kGroupN - 1) / kGroupN;
  const PackedX& x = px;  // the helpers must read the caller's px, not their own thread_local one
  maxfx_cpu::ParallelFor(pool, groups, 1, Worth(m_rows * n_dim * k_dim / 16), [&](int64_t g) {
    thread_local std::vector<int16_t> wbuf;
    thread_local std::vector<float> dbuf, mbuf;
    wbuf.resize(kGroupN * k_dim);
    dbuf.resize(kGroupN * blocks);
    mbuf.resize(kGroupN * blocks);
    const int64_t n0 = g * kGroupN, cols = std::min(kGroupN, n_dim - n0);
    for (int64_t c = 0; c < cols; ++c) {
      const auto w = row_of(n0 + c);
      for (int64_t b = 0; b < blocks; ++b) {
        const Block16 wb = LoadBlock(w, b);
        for (int v = 0; v < Vec::kPerBlock; ++v) Vec::StoreI(wbuf.data() + c * k_dim + b * kBlock + 2 * Vec::kLanes * v, wb.v[v]);
        dbuf[c * blocks + b] = w.Scale(b);
        mbuf[c * blocks + b] = MinOf(w, b);
      }
    }
    std::fill(wbuf.begin() + cols * k_dim, wbuf.end(), 0);  // past the last column: zero rows
    std::fill(dbuf.begin() + cols * blocks, dbuf.end(), 0.0f);
    std::fill(mbuf.begin() + cols * blocks, mbuf.end(), 0.0f);
    // The next group's weights (usually this thread's next item) load while this one computes.
    for (int64_t n = n0 + kGroupN; n < std::min(n0 + 2 * kGroupN, n_dim); ++n) row_of(n).PrefetchAll(k_dim);
    // Block by block, all the group's columns: the tile's slice of x for a block
    // (2 KB) stays in L1 while every column meets it.
    alignas(64) float acc[kGroupN * kMaxTileM];
    for (int64_t t = 0; t < x.tiles; ++t) {
      std::fill(acc, acc + kGroupN * kTileM, 0.0f);
      const int32_t* xp = x.Pairs(t);
      const float* dx = x.Scales(t);
      using W = decltype(row_of(0));
      if constexpr (W::kHasMin) {  // minus Min(b) times the block's activation sums, per column
        const float* sx = x.Sums(t);
        for (int64_t c = 0; c < cols; ++c) {
          for (int v = 0; v < kVecs; ++v) {
            Vec::F m = Vec::Zero();
            for (int64_t b = 0; b < blocks; ++b) m = Vec::Fmadd(Vec::Set1(mbuf[c * blocks + b]), Vec::Load(sx + b * kTileM + Vec::kLanes * v), m);
            Vec::Store(acc + c * kTileM + Vec::kLanes * v, Vec::Sub(Vec::Zero(), m));
          }
        }
      }
      for (int64_t b = 0; b < blocks; ++b) {
        for (int64_t c0 = 0; c0 < cols; c0 += kKernelN) {  // past the last column: zero rows (computed, not stored)
          const int16_t* w[kKernelN];
          float dw[kKernelN];
          for (int64_t c = 0; c < kKernelN; ++c) {
            w[c] = wbuf.data() + (c0 + c) * k_dim + b * kBlock;
            dw[c] = dbuf[(c0 + c) * blocks + b];
          }
          KernelBlock<kVecs, kKernelN>(xp + b * (kBlock / 2) * kTileM, dx + b * kTileM, w, dw, acc + c0 * kTileM);
        }
      }
      // Row by row: the group's columns of a row are one cache line of y, which
      // only this work item writes (column by column, the cores would share lines).
      for (int64_t i = 0; i < kTileM && t * kTileM + i < m_rows; ++i) {
        float* __restrict row = out + (t * kTileM + i) * n_dim + n0;
        for (int64_t c = 0; c < cols; ++c) row[c] = acc[c * kTileM + i];
      }
    }
  });
}
#endif

#ifdef MAXFX_QGEMV_AMX
// ─── Many rows of x on Intel AMX (Sapphire Rapids and later) ────────────────
//
// AMX's tile multiply (TDPB*D: 16x16 int32 results from 16x64 and 16x64 int8
// tiles, 1024 products per cycle) makes the integer dots of a batched decode step
// ~free next to the vector path's 32 per cycle (vpdpwssd), so a 16-row step costs
// little more than reading the weights. AMX multiplies int8 only: each int16 value
// of x is split exactly into q = 256 * hi + lo (hi signed, lo in 0..255), one tile
// product for each half (TDPBSSD for hi, TDPBSUD for the unsigned lo), and
// 256 * C_hi + C_lo is the same int32 block dot the vector path adds, so the
// numbers are those of the VNNI path up to the order of float sums.
//
// A tile product here is one block (K = 32: the scales change every block):
// A = 16 weight rows (output columns n) x 32 int8, read in place for Q8_0 (rows
// are K bytes apart) or from a decoded copy for the 4-bit formats; B = 16 rows of
// x in AMX's pair-interleaved layout (packed once per call). The 16x16 int32
// result C[n][m] goes to L1 and vector code applies d_w[n] * d_x[m] into float
// accumulators, one 16-lane vector per output column n.
constexpr int64_t kAmxRows = 16;  // rows of x per B tile (its 16 int32 columns)
constexpr int64_t kAmxTileBytes = kBlock * kAmxRows;  // one block's B tile: 8 rows of 64 bytes

// arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): Linux lets a process use the
// 8 KB of tile registers only once asked (once per process, for all its threads).
bool AmxPermitted() {
  static const bool ok = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  return ok;
}

// Whether AMX is used (MaxfxQgemvUseAmx switches it, for side-by-side timing).
std::atomic<bool> g_use_amx{true};

// The palette-1 tile shapes: 0-1 C (hi, lo), 2 A (weights), 3-4 B (x hi, x lo).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  TileConfig() {
    for (int t : {0, 1}) colsb[t] = kAmxRows * 4, rows[t] = kGroupN;
    colsb[2] = kBlock, rows[2] = kGroupN;
    for (int t : {3, 4}) colsb[t] = kAmxRows * 4, rows[t] = kBlock / 4;
  }
};

// x for AMX: per tile of 16 rows and block b, the high and low bytes of the int16
// values as B tiles (row r holds k = 4r .. 4r + 3 of every row m: byte 4m + j is
// k = 4r + j), and the tile's scales[b][16] and sums[b][16]; rows past m_rows are zero.
struct AmxX {
  int64_t tiles, blocks;
  std::vector<int8_t> hi;
  std::vector<uint8_t> lo;
  std::vector<float> scales, sums;
  const int8_t* Hi(int64_t t, int64_t b) const { return hi.data() + (t * blocks + b) * kAmxTileBytes; }
  const uint8_t* Lo(int64_t t, int64_t b) const { return lo.data() + (t * blocks + b) * kAmxTileBytes; }
  const float* Scales(int64_t t, int64_t b) const { return scales.data() + (t * blocks + b) * kAmxRows; }
  const float* Sums(int64_t t, int64_t b) const { return sums.data() + (t * blocks + b) * kAmxRows; }
};

void PackAmxX(ffi::ThreadPool pool, const float* xs, int64_t m_rows, int64_t k_dim, AmxX& px) {
  px.tiles = (m_rows + kAmxRows - 1) / kAmxRows;
  px.blocks = k_dim / kBlock;
  const int64_t n_blocks = px.tiles * px.blocks;
  px.hi.assign(n_blocks * kAmxTileBytes, 0);
  px.lo.assign(n_blocks * kAmxTileBytes, 0);
  px.scales.assign(n_blocks * kAmxRows, 0.0f);
  px.sums.assign(n_blocks * kAmxRows, 0.0f);
  maxfx_cpu::ParallelFor(pool, px.tiles, 1, Worth(m_rows * k_dim), [&](int64_t t) {
    std::vector<int16_t> q;
    std::vector<float> scale, sum;
    for (int64_t i = 0; i < kAmxRows && t * kAmxRows + i < m_rows; ++i) {
      QuantizeRow(xs + (t * kAmxRows + i) * k_dim, k_dim, q, scale, sum);
      for (int64_t b = 0; b < px.blocks; ++b) {
        const __m512i v = _mm512_loadu_si512(q.data() + b * kBlock);
        alignas(32) int8_t hi[kBlock];
        alignas(32) uint8_t lo[kBlock];
        _mm256_store_si256(reinterpret_cast<__m256i*>(hi), _mm512_cvtepi16_epi8(_mm512_srai_epi16(v, 8)));
        _mm256_store_si256(reinterpret_cast<__m256i*>(lo), _mm512_cvtepi16_epi8(v));  // the low byte as 0..255
        int8_t* th = px.hi.data() + (t * px.blocks + b) * kAmxTileBytes;
        uint8_t* tl = px.lo.data() + (t * px.blocks + b) * kAmxTileBytes;
        for (int64_t r = 0; r < kBlock / 4; ++r) {
          std::memcpy(th + r * 64 + 4 * i, hi + 4 * r, 4);
          std::memcpy(tl + r * 64 + 4 * i, lo + 4 * r, 4);
        }
        px.scales[(t * px.blocks + b) * kAmxRows + i] = scale[b];
        px.sums[(t * px.blocks + b) * kAmxRows + i] = sum[b];
      }
    }
  });
}

// The product over AMX tiles: work items of 16 output columns, as ManyRows.
template <typename RowOf>
void AmxRows(ffi::ThreadPool pool, const float* xs, int64_t m_rows, int64_t k_dim, int64_t n_dim, const RowOf& row_of, float* out) {
  using W = decltype(row_of(0));
  thread_local AmxX px;  // the calling thread's; helpers only read it
  PackAmxX(pool, xs, m_rows, k_dim, px);
  const AmxX& x = px;  // the helpers must read the caller's px, not their own thread_local one
  const int64_t blocks = k_dim / kBlock, groups = (n_dim + kGroupN - 1) / kGroupN;
  maxfx_cpu::ParallelFor(pool, groups, 1, Worth(m_rows * n_dim * k_dim / 16), [&](int64_t g) {
    static const TileConfig config;
    _tile_loadconfig(&config);
    thread_local std::vector<int8_t> wbuf;
    thread_local std::vector<float> dbuf, mbuf;
    dbuf.resize(kGroupN * blocks);
    mbuf.resize(kGroupN * blocks);
    const int64_t n0 = g * kGroupN, cols = std::min(kGroupN, n_dim - n0);
    // The group's weights as 16 rows of int8 `stride` bytes apart: Q8_0 in place
    // (a full group), else decoded (zero rows past the last column).
    const int8_t* a = nullptr;
    int64_t stride = k_dim;
    if constexpr (std::is_same_v<W, Q8Row>) {
      if (cols == kGroupN) a = row_of(n0).q;
    }
    if (a == nullptr) {
      wbuf.assign(kGroupN * k_dim, 0);
      for (int64_t c = 0; c < cols; ++c) {
        const auto w = row_of(n0 + c);
        for (int64_t b = 0; b < blocks; ++b) _mm256_storeu_si256(reinterpret_cast<__m256i*>(wbuf.data() + c * k_dim + b * kBlock), _mm512_cvtepi16_epi8(LoadBlock(w, b).v[0]));
      }
      a = wbuf.data();
    }
    for (int64_t c = 0; c < kGroupN; ++c) {
      for (int64_t b = 0; b < blocks; ++b) {
        dbuf[b * kGroupN + c] = c < cols ? row_of(n0 + c).Scale(b) : 0.0f;
        mbuf[b * kGroupN + c] = c < cols ? MinOf(row_of(n0 + c), b) : 0.0f;
      }
    }
    // The next group's weights (usually this thread's next item) load while this one computes.
    for (int64_t n = n0 + kGroupN; n < std::min(n0 + 2 * kGroupN, n_dim); ++n) row_of(n).PrefetchAll(k_dim);
    alignas(64) int32_t c_hi[kGroupN * kAmxRows], c_lo[kGroupN * kAmxRows];
    for (int64_t t = 0; t < x.tiles; ++t) {
      __m512 acc[kGroupN];
      for (int64_t c = 0; c < kGroupN; ++c) acc[c] = _mm512_setzero_ps();
      for (int64_t b = 0; b < blocks; ++b) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_loadd(2, a + b * kBlock, stride);
        _tile_loadd(3, x.Hi(t, b), 64);
        _tile_loadd(4, x.Lo(t, b), 64);
        _tile_dpbssd(0, 2, 3);
        _tile_dpbsud(1, 2, 4);
        _tile_stored(0, c_hi, 64);
        _tile_stored(1, c_lo, 64);
        const __m512 dx = _mm512_loadu_ps(x.Scales(t, b));
        const float* dw = dbuf.data() + b * kGroupN;
#pragma GCC unroll 16
        for (int64_t c = 0; c < kGroupN; ++c) {
          const __m512i dot = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(c_hi + c * kAmxRows), 8), _mm512_load_si512(c_lo + c * kAmxRows));
          acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dx, _mm512_set1_ps(dw[c])), acc[c]);
        }
        if constexpr (W::kHasMin) {  // minus Min(b) times the block's activation sums
          const __m512 sx = _mm512_loadu_ps(x.Sums(t, b));
          const float* mw = mbuf.data() + b * kGroupN;
          for (int64_t c = 0; c < kGroupN; ++c) acc[c] = _mm512_fnmadd_ps(_mm512_set1_ps(mw[c]), sx, acc[c]);
        }
      }
      // acc[c] holds column n0 + c for the tile's 16 rows: transposed into y's rows.
      alignas(64) float tile[kGroupN * kAmxRows];
      for (int64_t c = 0; c < kGroupN; ++c) _mm512_store_ps(tile + c * kAmxRows, acc[c]);
      for (int64_t i = 0; i < kAmxRows && t * kAmxRows + i < m_rows; ++i) {
        float* __restrict row = out + (t * kAmxRows + i) * n_dim + n0;
        for (int64_t c = 0; c < cols; ++c) row[c] = tile[c * kAmxRows + i];
      }
    }
    _tile_release();
  });
}
#endif

// Quantizes the rows of x (on the calling thread; the helpers only read them)
// and runs `row_product(n, rows)` for every output n over the pool.
template <typename RowProduct>
void FewRows(ffi::ThreadPool pool, const float* xs, int64_t m_rows, int64_t k_dim, int64_t n_dim, const RowProduct& row_product) {
  thread_local std::vector<int16_t> q[kMaxRows];
  thread_local std::vector<float> scale[kMaxRows], sum[kMaxRows];
  QuantizedRow rows[kMaxRows];
  for (int64_t m = 0; m < m_rows; ++m) rows[m] = QuantizeRow(xs + m * k_dim, k_dim, q[m], scale[m], sum[m]);
  maxfx_cpu::ParallelFor(pool, n_dim, kMinRowsPerChunk, Worth(n_dim * k_dim), [&](int64_t n) { row_product(n, rows); });
}

// y = x @ W.T for weight rows row_of(n): the one-accumulator-per-row product up
// to kFewQuantizedRows rows of x (decode of a few sequences), the blocked one
// beyond (batched decode, prefill).
template <typename RowOf>
void Matmul(ffi::ThreadPool pool, const float* xs, int64_t m_rows, int64_t k_dim, int64_t n_dim, const RowOf& row_of, float* out) {
#ifdef MAXFX_QGEMV_AMX
  if (m_rows > kFewQuantizedRows && g_use_amx.load(std::memory_order_relaxed) && AmxPermitted()) return AmxRows(pool, xs, m_rows, k_dim, n_dim, row_of, out);
#endif
#ifdef MAXFX_QGEMV_SIMD
  if (m_rows > 16) return ManyRows<32>(pool, xs, m_rows, k_dim, n_dim, row_of, out);
  if (m_rows > kFewQuantizedRows) return ManyRows<16>(pool, xs, m_rows, k_dim, n_dim, row_of, out);
#endif
  for (int64_t m0 = 0; m0 < m_rows; m0 += kMaxRows) {
    const int64_t rows = std::min(kMaxRows, m_rows - m0);
    FewRows(pool, xs + m0 * k_dim, rows, k_dim, n_dim, [&](int64_t n, const QuantizedRow* x) { Product(rows, k_dim, x, row_of(n), out + m0 * n_dim + n, n_dim); });
  }
}

ffi::Error Q8_0Impl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S8> q, ffi::Buffer<ffi::F16> d,
                    ffi::ResultBuffer<ffi::F32> y) {
  const auto qd = q.dimensions();
  const int64_t n_dim = qd[0], k_dim = qd[1];
  if (k_dim % kBlock != 0) return ffi::Error::InvalidArgument("maxfx_q8_0_matmul: K must be a multiple of 32");
  const int64_t m_rows = k_dim ? static_cast<int64_t>(x.element_count()) / k_dim : 0;
  const int8_t* qs = q.typed_data();
  const uint16_t* ds = reinterpret_cast<const uint16_t*>(d.typed_data());
  const int64_t blocks = k_dim / kBlock;
  Matmul(pool, x.typed_data(), m_rows, k_dim, n_dim, [&](int64_t n) { return Q8Row{qs + n * k_dim, ds + n * blocks}; }, y->typed_data());
  return ffi::Error::Success();
}

ffi::Error Q4_0Impl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::U8> packed, ffi::ResultBuffer<ffi::F32> y) {
  const auto pd = packed.dimensions();
  const int64_t n_dim = pd[0], row_bytes = pd[1];
  if (row_bytes % kQ4Bytes != 0) return ffi::Error::InvalidArgument("maxfx_q4_0_matmul: row bytes must be a multiple of 18");
  const int64_t k_dim = row_bytes / kQ4Bytes * kBlock;
  const int64_t m_rows = k_dim ? static_cast<int64_t>(x.element_count()) / k_dim : 0;
  const uint8_t* ws = packed.typed_data();
  Matmul(pool, x.typed_data(), m_rows, k_dim, n_dim, [&](int64_t n) { return Q4Row{ws + n * row_bytes}; }, y->typed_data());
  return ffi::Error::Success();
}

// Output n of x @ w.T for up to kMaxRows rows of x: two accumulator sets per row
// (the two vector halves of each 2 * Vec::kLanes floats), the tail loaded partially.
template <int kRows>
inline void F32Row(int64_t m_rows, int64_t k_dim, const float* __restrict xs, const float* __restrict w, float* __restrict out_m, int64_t stride) {
  const int64_t rows = kRows > 0 ? kRows : m_rows;
#ifdef MAXFX_QGEMV_SIMD
  constexpr int64_t kLanes = Vec::kLanes;
  Vec::F acc[2][kRows > 0 ? kRows : kMaxRows];
  for (int64_t m = 0; m < rows; ++m) acc[0][m] = acc[1][m] = Vec::Zero();
  int64_t k = 0;
  for (; k + 2 * kLanes <= k_dim; k += 2 * kLanes) {
    _mm_prefetch(reinterpret_cast<const char*>(w + k) + kPrefetchBytes, _MM_HINT_T0);
    if constexpr (kLanes == 16) _mm_prefetch(reinterpret_cast<const char*>(w + k) + kPrefetchBytes + 64, _MM_HINT_T0);
    const Vec::F w0 = Vec::Load(w + k), w1 = Vec::Load(w + k + kLanes);
    for (int64_t m = 0; m < rows; ++m) {
      acc[0][m] = Vec::Fmadd(w0, Vec::Load(xs + m * k_dim + k), acc[0][m]);
      acc[1][m] = Vec::Fmadd(w1, Vec::Load(xs + m * k_dim + k + kLanes), acc[1][m]);
    }
  }
  for (; k < k_dim; k += kLanes) {
    const int64_t n = std::min(kLanes, k_dim - k);
    const Vec::F wv = Vec::LoadPartial(w + k, n);
    for (int64_t m = 0; m < rows; ++m) acc[0][m] = Vec::Fmadd(wv, Vec::LoadPartial(xs + m * k_dim + k, n), acc[0][m]);
  }
  for (int64_t m = 0; m < rows; ++m) out_m[m * stride] = Vec::Sum(Vec::Add(acc[0][m], acc[1][m]));
#else
  for (int64_t m = 0; m < rows; ++m) {
    float acc = 0.0f;
    for (int64_t k = 0; k < k_dim; ++k) acc += xs[m * k_dim + k] * w[k];
    out_m[m * stride] = acc;
  }
#endif
}

ffi::Error F32Impl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w, ffi::ResultBuffer<ffi::F32> y) {
  const auto wd = w.dimensions();
  const int64_t n_dim = wd[0], k_dim = wd[1];
  const int64_t m_rows = k_dim ? static_cast<int64_t>(x.element_count()) / k_dim : 0;
  const float* xs = x.typed_data();
  const float* ws = w.typed_data();
  float* out = y->typed_data();
  for (int64_t m0 = 0; m0 < m_rows; m0 += kMaxRows) {
    const int64_t rows = std::min(kMaxRows, m_rows - m0);
    const float* xm = xs + m0 * k_dim;
    float* om = out + m0 * n_dim;
    maxfx_cpu::ParallelFor(pool, n_dim, kMinRowsPerChunk, Worth(n_dim * k_dim), [&](int64_t n) {
      if (rows == 1) return F32Row<1>(1, k_dim, xm, ws + n * k_dim, om + n, n_dim);
      F32Row<0>(rows, k_dim, xm, ws + n * k_dim, om + n, n_dim);
    });
  }
  return ffi::Error::Success();
}

ffi::Error Q4_KImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::U8> packed, ffi::ResultBuffer<ffi::F32> y) {
  const auto pd = packed.dimensions();
  const int64_t n_dim = pd[0], row_bytes = pd[1];
  if (row_bytes % kQ4KBytes != 0) return ffi::Error::InvalidArgument("maxfx_q4_k_matmul: row bytes must be a multiple of 144");
  const int64_t k_dim = row_bytes / kQ4KBytes * kSuper;
  const int64_t m_rows = k_dim ? static_cast<int64_t>(x.element_count()) / k_dim : 0;
  const uint8_t* ws = packed.typed_data();
  Matmul(pool, x.typed_data(), m_rows, k_dim, n_dim, [&](int64_t n) { return Q4KRow{ws + n * row_bytes}; }, y->typed_data());
  return ffi::Error::Success();
}

}  // namespace

// Whether the kernels were built with a vector path, AVX-512 VNNI or AVX2 (else
// the scalar loop, slower than XLA).
extern "C" int MaxfxQgemvIsFast() {
#ifdef MAXFX_QGEMV_SIMD
  return 1;
#else
  return 0;
#endif
}

// Which path products of more than kFewQuantizedRows rows take: 3 AMX, 2 AVX-512
// VNNI, 1 AVX2, 0 the scalar loop.
extern "C" int MaxfxQgemvPath() {
#if defined(MAXFX_QGEMV_AMX)
  if (g_use_amx.load() && AmxPermitted()) return 3;
#endif
#if defined(MAXFX_QGEMV_VNNI)
  return 2;
#elif defined(MAXFX_QGEMV_AVX2)
  return 1;
#else
  return 0;
#endif
}

// Switches the AMX path on or off (for timing it beside the VNNI path in one
// process); returns whether it was on (0 also when the build has none).
extern "C" int MaxfxQgemvUseAmx(int on) {
#if defined(MAXFX_QGEMV_AMX)
  return g_use_amx.exchange(on != 0) ? 1 : 0;
#else
  (void)on;
  return 0;
#endif
}

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

XLA_FFI_DEFINE_HANDLER_SYMBOL(MaxfxQ4_KMatmul, Q4_KImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(MaxfxF32Matmul, F32Impl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
