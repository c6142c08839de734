// core/philox.h — Philox4x32-10, the counter-based RNG behind dropout and random fills.
//
// Header-only and usable from host and device code, so the CPU reference and the
// CUDA kernels draw bit-identical numbers. Checked against Random123's known-answer
// vectors (tests/test_core.cpp) and, on a GPU, against cuRAND's curand_Philox4x32_10.
//
// Note [Dropout RNG]
// ~~~~~~~~~~~~~~~~~~
// A dropout call is described by DropoutSpec {p, seed, offset}. Whether element i
// (the flat row-major index into the call's tensor) is kept is a pure function of
// (seed, offset, i):
//   r    = philox4x32_10(counter = {lo(i/4), hi(i/4), lo(offset), hi(offset)},
//                        key     = {lo(seed), hi(seed)})[i % 4]
//   keep = r >= threshold,  threshold = floor(p * 2^32)   (a 64-bit integer)
// so p = 0 keeps everything and p = 1 drops everything. Kept values are scaled by
// 1/(1-p) (0 when p = 1, never inf/NaN). Consequences relied on elsewhere:
//  * the mask is never stored: backward kernels regenerate it from the spec;
//  * it does not depend on grid/block shape, thread count or device;
//  * every dropout call takes a fresh offset from its Generator (Generator::next_offset),
//    so two calls never share a mask, and saving (seed, offset) is enough to replay one.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/dtype.h"  // FFN_HD

namespace ffn {

struct U32x4 {
  uint32_t v[4];
};

FFN_HD void mulhilo32(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
#if defined(__CUDA_ARCH__)
  hi = __umulhi(a, b);
  lo = a * b;
#else
  const uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
#endif
}

FFN_HD U32x4 philox4x32_10(U32x4 c, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo32(kM0, c.v[0], hi0, lo0);
    mulhilo32(kM1, c.v[2], hi1, lo1);
    c = U32x4{{hi1 ^ c.v[1] ^ k0, lo1, hi0 ^ c.v[3] ^ k1, lo0}};
    k0 += kW0;
    k1 += kW1;
  }
  return c;
}

// The four random words for elements [4*block, 4*block+4) of stream (seed, offset).
FFN_HD U32x4 philox_block(uint64_t seed, uint64_t offset, uint64_t block) {
  return philox4x32_10(U32x4{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                              static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32)}},
                       static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// One dropout call; see Note [Dropout RNG].
struct DropoutSpec {
  float p = 0.0f;
  uint64_t seed = 0;
  uint64_t offset = 0;

  FFN_HD bool active() const { return p > 0.0f; }
  FFN_HD uint64_t threshold() const {
    return static_cast<uint64_t>(static_cast<double>(p) * 4294967296.0);
  }
  FFN_HD float scale() const { return p < 1.0f ? 1.0f / (1.0f - p) : 0.0f; }
  // Host-side single-element query (the reference; kernels unroll this per block).
  FFN_HD bool keep(uint64_t i) const {
    if (!active()) return true;
    const U32x4 r = philox_block(seed, offset, i >> 2);
    return r.v[i & 3] >= threshold();
  }
};

// Uniform in (0, 1] from one random word (never 0, so log() is finite).
FFN_HD float u32_to_unit_open0(uint32_t r) {
  return (static_cast<float>(r >> 8) + 1.0f) * (1.0f / 16777216.0f);
}

// Standard normals for elements [4*block, 4*block+4) of stream (seed, offset): Box-Muller
// on word pairs (0,1) and (2,3). Used by random fills on host and device; the words are
// bit-identical there, the normals may differ in the last bit (host and device libm).
FFN_HD void philox_normal4(uint64_t seed, uint64_t offset, uint64_t block, float out[4]) {
  const U32x4 r = philox_block(seed, offset, block);
  for (int j = 0; j < 4; j += 2) {
    const float u1 = u32_to_unit_open0(r.v[j]);
    const float u2 = static_cast<float>(r.v[j + 1] >> 8) * (1.0f / 16777216.0f);
    const float rad = sqrtf(-2.0f * logf(u1));
    const float ang = 6.283185307179586f * u2;
    out[j] = rad * cosf(ang);
    out[j + 1] = rad * sinf(ang);
  }
}

}  // namespace ffn
