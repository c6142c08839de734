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
// (seed, offset, i). Each Philox4x32-10 call yields 8 16-bit draws:
//   r    = philox4x32_10(counter = {lo(i/8), hi(i/8), lo(offset), hi(offset)},
//                        key     = {lo(seed), hi(seed)})
//   u16  = bits [16·(i%2), 16·(i%2)+16) of r[(i%8)/2]
//   keep = u16 >= threshold,  threshold = round(p · 65536)   (an integer in [0, 65536])
// so p = 0 keeps everything, p = 1 drops everything, and p is honoured to within
// 2^-17 (7.6e-6). Kept values are scaled by 1/(1-p) (0 when p = 1, never inf/NaN).
// Consequences relied on elsewhere:
//  * the mask is never stored: backward kernels regenerate it from the spec;
//  * it does not depend on grid/block shape, thread count or device;
//  * every dropout call takes a fresh offset from its Generator (Generator::next_offset),
//    so two calls never share a mask, and saving (seed, offset) is enough to replay one;
//  * 16-bit draws halve the Philox work per element against one 32-bit word each,
//    which matters: the fused kernels are otherwise close to ALU-bound.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/dtype.h"  // FFN_HD
#include "core/error.h"

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

// Philox's key schedule (the 10 round keys) for one seed, precomputed once per kernel
// launch instead of once per call.
struct PhiloxKeys {
  uint32_t k0[10], k1[10];
  FFN_HD static PhiloxKeys from(uint64_t seed) {
    PhiloxKeys k;
    uint32_t a = static_cast<uint32_t>(seed), b = static_cast<uint32_t>(seed >> 32);
    for (int r = 0; r < 10; ++r) {
      k.k0[r] = a;
      k.k1[r] = b;
      a += 0x9E3779B9u;
      b += 0xBB67AE85u;
    }
    return k;
  }
};

// Rounds kFirst..9 of philox4x32_10 with the key schedule given (kFirst > 0: Note [Philox
// prefix]).
template <int kFirst>
FFN_HD U32x4 philox_rounds(U32x4 c, const PhiloxKeys& k) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = kFirst; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo32(0xD2511F53u, c.v[0], hi0, lo0);
    mulhilo32(0xCD9E8D57u, c.v[2], hi1, lo1);
    c = U32x4{{hi1 ^ c.v[1] ^ k.k0[round], lo1, hi0 ^ c.v[3] ^ k.k1[round], lo0}};
  }
  return c;
}

// Same function as philox4x32_10 with the key schedule given.
FFN_HD U32x4 philox4x32_10(U32x4 c, const PhiloxKeys& k) {
  return philox_rounds<0>(c, k);
}

// The four random words of block `block` of stream (seed, offset).
FFN_HD U32x4 philox_block(uint64_t seed, uint64_t offset, uint64_t block) {
  return philox4x32_10(U32x4{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                              static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32)}},
                       static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}
FFN_HD U32x4 philox_block(const PhiloxKeys& keys, uint64_t offset, uint64_t block) {
  return philox4x32_10(U32x4{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                              static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32)}},
                       keys);
}

// Note [Philox prefix]
// ~~~~~~~~~~~~~~~~~~~~~
// Two of a block's 20 products depend only on the keys, the offset and the block index's
// high word: round 0 multiplies counter word 2 (lo(offset)) and round 1 multiplies the word
// round 0 built from that product, hi(block) and k0[0]. A kernel that draws many blocks of
// one stream computes them once (philox_prefix) and each block from there (philox_block with
// the prefix): the same four words, 18 products a block. On Hopper the products are what
// costs in the GEMMs whose activation warps draw the mask: their IMAD.WIDEs slow the
// consumer's tensor-core mainloop (Note [Activation warpgroup]). Blocks whose index has a
// nonzero high word (from 2^35 elements) redo round 1's product for that word.
struct PhiloxPrefix {
  uint32_t p;   // hi(offset) ^ k1[0]: xored into round 0's first product's high half
  uint32_t q;   // lo(M1 · lo(offset)) ^ k0[1]: round 1's word 0 is hi(product) ^ q
  uint32_t r;   // hi(M0 · u0) ^ k1[1], for hi(block) = 0
  uint32_t s;   // lo(M0 · u0), for hi(block) = 0
  uint32_t u0;  // hi(M1 · lo(offset)) ^ k0[0]: round 0's word 0 is u0 ^ hi(block)
};

FFN_HD PhiloxPrefix philox_prefix(const PhiloxKeys& k, uint64_t offset) {
  uint32_t hi1, lo1, hi0, lo0;
  mulhilo32(0xCD9E8D57u, static_cast<uint32_t>(offset), hi1, lo1);
  const uint32_t u0 = hi1 ^ k.k0[0];
  mulhilo32(0xD2511F53u, u0, hi0, lo0);
  return {static_cast<uint32_t>(offset >> 32) ^ k.k1[0], lo1 ^ k.k0[1], hi0 ^ k.k1[1], lo0, u0};
}

// philox_block(keys, offset, block) with pre = philox_prefix(keys, offset).
FFN_HD U32x4 philox_block(const PhiloxKeys& k, const PhiloxPrefix& pre, uint64_t block) {
  uint32_t hi0, lo0, hi1, lo1, r = pre.r, s = pre.s;
  const uint32_t bhi = static_cast<uint32_t>(block >> 32);
  if (bhi != 0) {  // round 1's first product for this high word
    mulhilo32(0xD2511F53u, pre.u0 ^ bhi, hi0, lo0);
    r = hi0 ^ k.k1[1];
    s = lo0;
  }
  mulhilo32(0xD2511F53u, static_cast<uint32_t>(block), hi0, lo0);  // round 0
  mulhilo32(0xCD9E8D57u, hi0 ^ pre.p, hi1, lo1);                   // round 1
  return philox_rounds<2>(U32x4{{hi1 ^ pre.q, lo1, r ^ lo0, s}}, k);
}

// The 16-bit draw of element i from its block's words (Note [Dropout RNG]).
FFN_HD uint32_t mask_draw(const U32x4& r, uint64_t i) {
  return (r.v[(i & 7) >> 1] >> (16 * (i & 1))) & 0xffffu;
}

// Note [Dropout probability]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// p is the probability of dropping an element and lies in [0, 1]: p = 0 keeps everything
// (no mask is drawn), p = 1 drops everything (scale() is 0, so outputs and gradients are 0).
// That one range is checked where a value enters: at config load (model.dropout, with the
// config's message), in the layer constructors and at the kernel front doors
// (check_dropout_p, with the op's name).
constexpr bool dropout_p_valid(double p) {
  return p >= 0.0 && p <= 1.0;  // false for NaN
}
inline void check_dropout_p(double p, const char* who) {
  FFN_CHECK(dropout_p_valid(p), "[", who, "] dropout p must be in [0, 1], got ", p);
}

// One dropout call; see Note [Dropout RNG].
struct DropoutSpec {
  float p = 0.0f;
  uint64_t seed = 0;
  uint64_t offset = 0;
  // Device memory the GPU kernels add to `offset` when set: the calls of a step captured
  // into a CUDA graph, replayed with each step's shift (Note [CUDA graph step]). Never set
  // for the CPU (keep() ignores it).
  const uint64_t* offset_shift = nullptr;

  FFN_HD bool active() const { return p > 0.0f; }
  FFN_HD uint32_t threshold() const {
    return static_cast<uint32_t>(static_cast<double>(p) * 65536.0 + 0.5);
  }
  FFN_HD float scale() const { return p < 1.0f ? 1.0f / (1.0f - p) : 0.0f; }
  // Host-side single-element query (the reference; kernels unroll this per block).
  FFN_HD bool keep(uint64_t i) const {
    if (!active()) return true;
    return mask_draw(philox_block(seed, offset, i >> 3), i) >= threshold();
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
