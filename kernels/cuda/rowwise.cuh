// kernels/cuda/rowwise.cuh — the launch framework shared by the fused elementwise
// kernels (bias_dropout, bias_act_dropout, glu): a 2-D tiling of an [M, N]
// problem with in-kernel dropout masks and deterministic column sums (db).
//
// Note [Deterministic column sums]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Backward kernels reduce db = Σ_rows in the kernel that already reads the rows,
// without float atomics, in two fixed-order stages:
//  1. block (x, y) covers columns [x·32·VEC, …) and the row chunk y; its 8 warps
//     take rows ty, ty+8, … and sum them in that order (Op::kUnroll rows are loaded
//     at once, but added in row order); the 8 warp sums are added in warp order and
//     written to partials[y][column];
//  2. reduce_partials sums partials over y: for each column, 8 lanes take chunks
//     g, g+8, g+16, … (g = 0…7) in order, and their 8 sums are added in g order.
// Chunking depends only on (M, N), never on the GPU or the vector width, so the
// same shapes give bit-identical sums on any device and with or without 16-byte
// vectors (the vector width only changes which thread owns a column).
#pragma once

#include <cuda_runtime.h>

#include "core/cuda/check.h"
#include "core/cuda/context.h"
#include "core/cuda/types.cuh"
#include "core/dispatch.h"
#include "core/philox.h"
#include "core/tensor.h"

namespace ffn::cuda {

constexpr int kRowwiseWarps = 8;

// Products and sums rounded as the CPU reference rounds them (no FMA contraction): the
// residual add (dropout_add.cu, layer_norm.cu's fused add) equals the CPU's bit for bit.
__device__ __forceinline__ float mul_rn(float a, float b) {
  return __fmul_rn(a, b);
}
__device__ __forceinline__ double mul_rn(double a, double b) {
  return __dmul_rn(a, b);
}
__device__ __forceinline__ float add_rn(float a, float b) {
  return __fadd_rn(a, b);
}
__device__ __forceinline__ double add_rn(double a, double b) {
  return __dadd_rn(a, b);
}

// VEC consecutive elements as one aligned access (16 bytes for VEC·sizeof(T) = 16).
template <class T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
  T v[VEC];
};

template <int VEC, class T, class A>
__device__ __forceinline__ void load_vec(const T* p, A (&out)[VEC]) {
  const Pack<T, VEC> pk = *reinterpret_cast<const Pack<T, VEC>*>(p);
#pragma unroll
  for (int j = 0; j < VEC; ++j) out[j] = static_cast<A>(to_acc(pk.v[j]));
}

// Note [Vector stores]
// ~~~~~~~~~~~~~~~~~~~~
// store_vec writes its VEC values (into global memory) with one 16-, 8- or 4-byte store:
// 16-bit values packed in pairs by one conversion each (pack2, the same rounding as
// from_acc), floats and doubles as float4 / float2 / double2, stored through __stwb (an
// st.global.wb of the whole word). A plain assignment of the word, or of a Pack of converted
// values, left the width to the compiler, and in the rowwise kernels it split every 16-byte
// store into four 4-byte ones (st.global.u32, or st.global.v2.u16, in the PTX; the loads
// stayed 16 bytes wide). The GLU backward pass then wrote 2.2× its bytes' worth of L2 sectors
// and ran bound by L2 (90% of its throughput, DRAM at 56%) at 2.7 TB/s, against a copy's 4.0
// (ncu, session 52, bench/RESULTS.md).
template <int VEC, class T, class A>
__device__ __forceinline__ void store_vec(T* p, const A (&in)[VEC]) {
  constexpr bool k16 = std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>;
  if constexpr (k16 && std::is_same_v<A, float> && (VEC == 8 || VEC == 4 || VEC == 2)) {
    uint32_t w[VEC / 2];
#pragma unroll
    for (int j = 0; j < VEC / 2; ++j) w[j] = pack2<T>(in[2 * j], in[2 * j + 1]);
    if constexpr (VEC == 8)
      __stwb(reinterpret_cast<uint4*>(p), make_uint4(w[0], w[1], w[2], w[3]));
    else if constexpr (VEC == 4)
      __stwb(reinterpret_cast<uint2*>(p), make_uint2(w[0], w[1]));
    else
      __stwb(reinterpret_cast<unsigned int*>(p), w[0]);
  } else if constexpr (std::is_same_v<T, float> && VEC == 4) {
    __stwb(reinterpret_cast<float4*>(p), make_float4(from_acc<T>(in[0]), from_acc<T>(in[1]),
                                                     from_acc<T>(in[2]), from_acc<T>(in[3])));
  } else if constexpr (std::is_same_v<T, float> && VEC == 2) {
    __stwb(reinterpret_cast<float2*>(p), make_float2(from_acc<T>(in[0]), from_acc<T>(in[1])));
  } else if constexpr (std::is_same_v<T, double> && VEC == 2) {
    __stwb(reinterpret_cast<double2*>(p), make_double2(from_acc<T>(in[0]), from_acc<T>(in[1])));
  } else {
    Pack<T, VEC> pk;
#pragma unroll
    for (int j = 0; j < VEC; ++j) pk.v[j] = from_acc<T>(in[j]);
    *reinterpret_cast<Pack<T, VEC>*>(p) = pk;
  }
}

// Loads columns [c0, c0+VEC) of each valid row (ok[u]) of a row-major matrix with
// leading dimension ld: the ops issue all their loads with this before computing.
template <int VEC, int U, class T, class A>
__device__ __forceinline__ void load_rows(const T* base, int64_t ld, int64_t c0,
                                          const int64_t (&rows)[U], const bool (&ok)[U],
                                          A (&out)[U][VEC]) {
#pragma unroll
  for (int u = 0; u < U; ++u)
    if (ok[u]) load_vec<VEC>(base + rows[u] * ld + c0, out[u]);
}

// Bias entries [c0, c0+VEC), or zeros when there is no bias.
template <int VEC, class T, class A>
__device__ __forceinline__ void load_bias(const T* b, int64_t c0, A (&out)[VEC]) {
#pragma unroll
  for (int j = 0; j < VEC; ++j) out[j] = A(0);
  if (b) load_vec<VEC>(b + c0, out);
}

// Dropout multipliers for elements [i0, i0+VEC) of one call (Note [Dropout RNG]).
// VEC divides 8 and i0 % VEC == 0, so the VEC draws come from one Philox block.
struct DeviceMask {
  PhiloxKeys keys;
  uint64_t offset;
  const uint64_t* shift;  // DropoutSpec::offset_shift (Note [CUDA graph step]), or nullptr
  uint32_t thr;
  float scale;
  bool active;

  static DeviceMask from(const DropoutSpec& d) {
    return {PhiloxKeys::from(d.seed), d.offset, d.offset_shift, d.threshold(), d.scale(),
            d.active()};
  }

  // The call's Philox offset: `offset`, plus a captured step's shift when there is one.
  __device__ __forceinline__ uint64_t off() const {
    return shift ? offset + __ldg(reinterpret_cast<const unsigned long long*>(shift)) : offset;
  }

  // This mask with the shift added once (Note [CUDA graph step]): a kernel that draws many
  // blocks takes it before its loops, so factors() reads no shift per block there (where
  // off() is called inside a loop, ptxas may keep its load there).
  __device__ __forceinline__ DeviceMask resolved() const {
    DeviceMask m = *this;
    m.offset = off();
    m.shift = nullptr;
    return m;
  }

  template <int VEC, class A>
  __device__ __forceinline__ void factors(int64_t i0, A (&f)[VEC]) const {
    static_assert(8 % VEC == 0, "a vector must not straddle two Philox blocks");
    if (!active) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) f[j] = A(1);
      return;
    }
    const uint64_t i = static_cast<uint64_t>(i0);
    const U32x4 r = philox_block(keys, off(), i >> 3);
    if constexpr (VEC == 8) {  // i % 8 == 0: word and half are compile-time
#pragma unroll
      for (int j = 0; j < 8; ++j)
        f[j] = ((r.v[j >> 1] >> (16 * (j & 1))) & 0xffffu) >= thr ? A(scale) : A(0);
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) f[j] = mask_draw(r, i + j) >= thr ? A(scale) : A(0);
    }
  }
};

// The row chunking of Note [Deterministic column sums]: a function of (M, N) only.
struct RowChunks {
  int64_t chunks = 1;
  int64_t rows_per_chunk = 1;
};
inline RowChunks row_chunks(int64_t m, int64_t n) {
  const int64_t col_tiles = std::max<int64_t>(1, (n + 255) / 256);
  const int64_t max_chunks = std::max<int64_t>(1, 2048 / col_tiles);
  RowChunks rc;
  rc.chunks = std::min<int64_t>(std::max<int64_t>(1, (m + 63) / 64), max_chunks);
  rc.rows_per_chunk = std::max<int64_t>(1, (m + rc.chunks - 1) / rc.chunks);
  rc.chunks = std::max<int64_t>(1, (m + rc.rows_per_chunk - 1) / rc.rows_per_chunk);
  return rc;
}

// Op contract: `static constexpr int kSums` (VEC-wide column sums per thread: 0, 1 or 2),
// `static constexpr int kUnroll` (rows per apply; 2 unless registers run out), `using A`
// (math type) and
//   template <int VEC, int U>
//   __device__ void apply(const int64_t (&rows)[U], const bool (&ok)[U], int64_t col0,
//                         A (&acc)[max(kSums, 1)][VEC]) const;
// which handles U rows at once (rows[u] valid where ok[u]): it should issue every load
// first and add to acc in u order, so the sum order is the plain row order.
// Partial sums of set s and column c go to partials[chunk · (kSums·N) + s·N + c].
// Memory-bound kernels want occupancy: at least 3 blocks (24 warps) per SM, ≤ 85 registers.
constexpr int kMinBlocksPerSm = 3;

template <class Op, int VEC>
__global__ void __launch_bounds__(32 * kRowwiseWarps, kMinBlocksPerSm)
    rowwise_kernel(Op op, int64_t m, int64_t n, int64_t rows_per_chunk, typename Op::A* partials) {
  using A = typename Op::A;
  constexpr int kS = Op::kSums > 0 ? Op::kSums : 1;
  constexpr int U = Op::kUnroll;
  A acc[kS][VEC];
#pragma unroll
  for (int s = 0; s < kS; ++s)
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc[s][j] = A(0);
  const int64_t c0 = (int64_t{blockIdx.x} * 32 + threadIdx.x) * VEC;
  const int64_t r_begin = int64_t{blockIdx.y} * rows_per_chunk;
  const int64_t r_end = min(m, r_begin + rows_per_chunk);
  if (c0 < n)
    for (int64_t r = r_begin + threadIdx.y; r < r_end; r += kRowwiseWarps * U) {
      int64_t rows[U];
      bool ok[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        rows[u] = r + u * kRowwiseWarps;
        ok[u] = rows[u] < r_end;
      }
      op.template apply<VEC, U>(rows, ok, c0, acc);
    }
  if constexpr (Op::kSums > 0) {
    if (partials == nullptr) return;
    __shared__ A sm[kRowwiseWarps][Op::kSums][32 * VEC];
#pragma unroll
    for (int s = 0; s < Op::kSums; ++s)
#pragma unroll
      for (int j = 0; j < VEC; ++j) sm[threadIdx.y][s][threadIdx.x * VEC + j] = acc[s][j];
    __syncthreads();
    const int tid = threadIdx.y * 32 + threadIdx.x;
    for (int idx = tid; idx < Op::kSums * 32 * VEC; idx += 32 * kRowwiseWarps) {
      const int s = idx / (32 * VEC), col = idx % (32 * VEC);
      const int64_t c = int64_t{blockIdx.x} * 32 * VEC + col;
      if (c >= n) continue;
      A sum = A(0);
#pragma unroll
      for (int w = 0; w < kRowwiseWarps; ++w) sum += sm[w][s][col];
      partials[int64_t{blockIdx.y} * Op::kSums * n + s * n + c] = sum;
    }
  }
}

// Where reduce_partials_kernel writes column c of its `width`: out[c], or, split into up to
// three outputs of `part` columns each, outs[c / part][c % part] (a null output is skipped),
// so sums of several tensors land in their own tensors without copies.
template <class T>
struct PartialsOut {
  T* outs[3] = {nullptr, nullptr, nullptr};
  int64_t part = 0;  // 0: one output, outs[0], of all `width` columns
  PartialsOut() = default;
  PartialsOut(T* out) : outs{out, nullptr, nullptr} {}  // NOLINT: the one-output case
  PartialsOut(T* a, T* b, T* c, int64_t p) : outs{a, b, c}, part(p) {}
  __device__ __forceinline__ T* at(int64_t c) const {
    if (part == 0) return outs[0] + c;
    const int64_t k = c / part;  // picked by selects: a run-time index would use local memory
    T* o = k == 0 ? outs[0] : k == 1 ? outs[1] : outs[2];
    return o ? o + (c - k * part) : nullptr;
  }
};

// Block: 32 columns × 8 chunk groups (Note [Deterministic column sums], stage 2).
template <class A, class T>
__global__ void __launch_bounds__(256)
    reduce_partials_kernel(const A* partials, int64_t chunks, int64_t width, PartialsOut<T> out) {
  __shared__ A part[8][32];
  const int64_t c = int64_t{blockIdx.x} * 32 + threadIdx.x;
  A sum = A(0);
  if (c < width)
    for (int64_t y = threadIdx.y; y < chunks; y += 8) sum += partials[y * width + c];
  part[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < width) {
    A total = part[0][threadIdx.x];
#pragma unroll
    for (int g = 1; g < 8; ++g) total += part[g][threadIdx.x];
    if (T* o = out.at(c)) *o = from_acc<T>(total);
  }
}

// True when every pointer is 16-byte aligned and n is a multiple of `vec`.
inline bool can_vectorize(int vec, int64_t n, std::initializer_list<const void*> ptrs) {
  if (vec <= 1 || n % vec != 0) return false;
  for (const void* p : ptrs)
    if (p && reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

// Runs `op` over [m, n] (n = the column count the op iterates over) with the 16-byte
// vector path when `aligned` (see can_vectorize), and reduces the op's column sums
// into `sums` (kSums·n elements of type T; null to skip).
template <class T, class Op>
void launch_rowwise(const Op& op, bool aligned, int64_t m, int64_t n, int device, T* sums) {
  using A = typename Op::A;
  constexpr int kVec = 16 / sizeof(T);
  constexpr int kSums = Op::kSums;
  cudaStream_t stream = cuda::stream(device);
  const RowChunks rc = row_chunks(m, n);
  Tensor partials;
  A* part = nullptr;
  if (kSums > 0 && sums && m > 0 && n > 0) {
    partials = Tensor::empty({rc.chunks * kSums * n}, dtype_of<A>(), Device::cuda(device));
    part = static_cast<A*>(partials.data_ptr());
  }
  const dim3 block(32, kRowwiseWarps);
  if (m > 0 && n > 0) {
    if (aligned) {
      const dim3 grid(static_cast<unsigned>((n / kVec + 31) / 32),
                      static_cast<unsigned>(rc.chunks));
      rowwise_kernel<Op, kVec><<<grid, block, 0, stream>>>(op, m, n, rc.rows_per_chunk, part);
    } else {
      const dim3 grid(static_cast<unsigned>((n + 31) / 32), static_cast<unsigned>(rc.chunks));
      rowwise_kernel<Op, 1><<<grid, block, 0, stream>>>(op, m, n, rc.rows_per_chunk, part);
    }
    FFN_CHECK_LAUNCH();
  }
  if (kSums > 0 && sums) {
    const int64_t width = kSums * n;
    if (width == 0) return;
    if (m == 0) {  // an empty sum is 0 (all-zero bits are +0 in every float type)
      FFN_CHECK_CUDA(cudaMemsetAsync(sums, 0, width * sizeof(T), stream));
      return;
    }
    reduce_partials_kernel<A, T><<<static_cast<unsigned>((width + 31) / 32), dim3(32, 8), 0,
                                   stream>>>(part, rc.chunks, width, sums);
    FFN_CHECK_LAUNCH();
  }
}

// Calls f.template operator()<X, T>() with T = narrow's device type and X = wide's: T
// itself, or fp32 for a 16-bit T (the mixed-precision residual stream; the ops' front doors
// allow no other pair).
template <class F>
void dispatch_mixed(const Tensor& wide, const Tensor& narrow, const char* op, F&& f) {
  FFN_DISPATCH_ALL(narrow.dtype(), op, [&]<class H>() {
    using T = device_t<H>;
    if (wide.dtype() == narrow.dtype())
      f.template operator()<T, T>();
    else if constexpr (sizeof(T) == 2)
      f.template operator()<float, T>();
  });
}

template <class T>
T* dptr(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.data_ptr()) : nullptr;
}
template <class T>
T* dptr(Tensor* t) {
  return t ? static_cast<T*>(t->data_ptr()) : nullptr;
}

}  // namespace ffn::cuda
