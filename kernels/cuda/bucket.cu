// kernels/cuda/bucket.cu — a gradient bucket's pack and mean passes on the GPU
// (kernels/bucket.h), on the stream the caller names. The pack is a copy per part; one mean
// launch covers up to kParts parts: a table of them goes by value, each thread takes 16-byte
// groups of elements (vector loads where a part's address and slot offset allow, element by
// element otherwise) and finds its part by binary search over the groups' prefix.
#include <algorithm>
#include <cstdint>

#include "core/cuda/check.h"
#include "core/cuda/context.h"
#include "core/cuda/types.cuh"
#include "core/dispatch.h"
#include "kernels/bucket.h"

namespace ffn::cuda {

namespace {

constexpr int kParts = 32;
constexpr int kThreads = 512;

struct PartTable {
  void* ptr[kParts];
  int64_t off[kParts];        // in the slot, elements
  int64_t n[kParts];          // elements
  int64_t first[kParts + 1];  // prefix of the parts' groups
  uint32_t vec_ok;            // bit k: part k's pointer and offset are 16-byte aligned
  int count;
};

__device__ __forceinline__ int find_part(const PartTable& t, int64_t g) {
  int lo = 0, hi = t.count - 1;
  while (lo < hi) {  // the last k with first[k] <= g
    const int mid = (lo + hi + 1) / 2;
    if (t.first[mid] <= g)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// Each thread takes kUnroll groups a stride apart and issues all their loads of one rank
// before it sums them: several 16-byte loads in flight per thread.
constexpr int kUnroll = 4;

template <class T>
__global__ void __launch_bounds__(kThreads)
    mean_kernel(const __grid_constant__ PartTable t, const T* slots, int64_t slot, int world,
                bool average) {
  using A = acc_t<T>;
  constexpr int V = 16 / sizeof(T);
  const int64_t total = t.first[t.count];
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t g0 = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; g0 < total;
       g0 += stride * kUnroll) {
    int k[kUnroll];
    int64_t e[kUnroll];
    bool vec[kUnroll], live[kUnroll];
    A acc[kUnroll][V];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t g = g0 + u * stride;
      live[u] = g < total;
      k[u] = live[u] ? find_part(t, g) : 0;
      e[u] = live[u] ? (g - t.first[k[u]]) * V : 0;
      vec[u] = live[u] && (t.vec_ok >> k[u] & 1u) && e[u] + V <= t.n[k[u]];
#pragma unroll
      for (int j = 0; j < V; ++j) acc[u][j] = 0;
    }
    for (int r = 0; r < world; ++r) {  // rank order: every rank sums alike
      uint4 w[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (vec[u]) w[u] = *reinterpret_cast<const uint4*>(slots + r * slot + t.off[k[u]] + e[u]);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (vec[u]) {
          const T* v = reinterpret_cast<const T*>(&w[u]);
#pragma unroll
          for (int j = 0; j < V; ++j) acc[u][j] += to_acc(v[j]);
        } else if (live[u]) {
          const T* s = slots + r * slot + t.off[k[u]] + e[u];
          for (int j = 0; j < V && e[u] + j < t.n[k[u]]; ++j) acc[u][j] += to_acc(s[j]);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (!live[u]) continue;
      if (average)
#pragma unroll
        for (int j = 0; j < V; ++j) acc[u][j] /= static_cast<A>(world);
      T* out = static_cast<T*>(t.ptr[k[u]]) + e[u];
      if (vec[u]) {
        uint4 w;
        T* v = reinterpret_cast<T*>(&w);
#pragma unroll
        for (int j = 0; j < V; ++j) v[j] = from_acc<T>(acc[u][j]);
        *reinterpret_cast<uint4*>(out) = w;
      } else {
        for (int j = 0; j < V && e[u] + j < t.n[k[u]]; ++j) out[j] = from_acc<T>(acc[u][j]);
      }
    }
  }
}

// Calls launch(table, groups) for each run of up to kParts parts. `slot_aligned`: the slot's
// base and (for mean) the slot size keep 16-byte alignment, so only each part's own pointer
// and offset decide.
template <class F>
void for_tables(const std::vector<Tensor>& parts, const std::vector<int64_t>& offsets,
                bool slot_aligned, const F& launch) {
  const size_t es = dtype_size(parts[0].dtype());
  const int64_t per = static_cast<int64_t>(16 / es);
  for (size_t k0 = 0; k0 < parts.size(); k0 += kParts) {
    PartTable t{};
    t.count = static_cast<int>(std::min<size_t>(kParts, parts.size() - k0));
    for (int k = 0; k < t.count; ++k) {
      const Tensor& p = parts[k0 + k];
      t.ptr[k] = p.data_ptr();
      t.off[k] = offsets[k0 + k];
      t.n[k] = p.numel();
      t.first[k + 1] = t.first[k] + (t.n[k] + per - 1) / per;
      const bool ok = slot_aligned && reinterpret_cast<uintptr_t>(t.ptr[k]) % 16 == 0 &&
                      (t.off[k] * static_cast<int64_t>(es)) % 16 == 0;
      t.vec_ok |= static_cast<uint32_t>(ok) << k;
    }
    if (t.first[t.count] > 0) launch(t, t.first[t.count]);
  }
}

unsigned blocks(int64_t groups) {
  return grid_for((groups + kUnroll - 1) / kUnroll, kThreads);
}

cudaStream_t stream_or_compute(void* s, int dev) {
  return s ? static_cast<cudaStream_t>(s) : stream(dev);
}

}  // namespace

// The pack is one device-to-device copy per part: the copy engines do it, no SM is taken
// from the kernels running beside it (Note [Copy-engine gradient reduction]).
void bucket_pack(const std::vector<Tensor>& parts, const std::vector<int64_t>& offsets,
                 Tensor& flat, void* s) {
  const int dev = flat.device().index;
  DeviceGuard guard(dev);
  const cudaStream_t st = stream_or_compute(s, dev);
  char* base = static_cast<char*>(flat.data_ptr());
  const size_t es = dtype_size(flat.dtype());
  for (size_t k = 0; k < parts.size(); ++k)
    if (parts[k].numel() > 0)
      FFN_CHECK_CUDA(cudaMemcpyAsync(base + static_cast<size_t>(offsets[k]) * es,
                                     parts[k].data_ptr(), parts[k].nbytes(),
                                     cudaMemcpyDeviceToDevice, st));
}

void bucket_mean(const Tensor& slots, int64_t world, const std::vector<int64_t>& offsets,
                 std::vector<Tensor>& parts, bool average) {
  const int dev = slots.device().index;
  DeviceGuard guard(dev);
  const int64_t slot = slots.numel() / world;
  const size_t es = dtype_size(slots.dtype());
  const bool aligned = reinterpret_cast<uintptr_t>(slots.data_ptr()) % 16 == 0 &&
                       (slot * static_cast<int64_t>(es)) % 16 == 0;
  FFN_DISPATCH_ALL(slots.dtype(), "bucket_mean", [&]<class H>() {
    using T = device_t<H>;
    for_tables(parts, offsets, aligned, [&](const PartTable& t, int64_t groups) {
      mean_kernel<T><<<blocks(groups), kThreads, 0, stream(dev)>>>(
          t, static_cast<const T*>(slots.data_ptr()), slot, static_cast<int>(world), average);
      FFN_CHECK_LAUNCH();
    });
  });
}

}  // namespace ffn::cuda
