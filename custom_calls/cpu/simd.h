// The conversion and reduction both of maxfx's CPU kernels use: HalfToFloat (IEEE
// float16 bits to float) and, with AVX, Sum8 (the sum of a vector's 8 floats).
#ifndef MAXFX_CUSTOM_CALLS_CPU_SIMD_H_
#define MAXFX_CUSTOM_CALLS_CPU_SIMD_H_

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace maxfx_cpu {

// One value: F16C's conversion where the build has it, else the bit-level one.
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

#if defined(__AVX__)
inline float Sum8(__m256 v) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}
#endif

}  // namespace maxfx_cpu

#endif  // MAXFX_CUSTOM_CALLS_CPU_SIMD_H_
