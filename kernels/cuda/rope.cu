// kernels/cuda/rope.cu — rotary position embeddings on a qkv tensor (kernels/rope.h). One thread
// per (row, head, i < D/2) pair: the q and k pairs rotated with cos/sin from a [T, D/2] table,
// the value pairs copied. The table is computed in f64 on the host once per (device, T, D,
// base) and kept.
#include <cmath>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/rowwise.cuh"
#include "kernels/rope.h"

namespace ffn::cuda {

namespace {

template <class T>
__global__ void __launch_bounds__(256)
    rope_kernel(const T* x, T* y, const float2* table, int64_t pairs, int t, int slots,
                int rotated_slots, int half, float sign) {
  using A = acc_t<T>;
  for (int64_t p = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; p < pairs;
       p += int64_t{gridDim.x} * blockDim.x) {
    const int i = static_cast<int>(p % half);
    const int64_t head_row = p / half;  // (b·T + t)·slots + slot
    const int slot = static_cast<int>(head_row % slots);
    const int64_t row = head_row / slots;
    const int64_t base = row * slots * 2 * half + int64_t{slot} * 2 * half;
    const A x1 = to_acc(x[base + i]), x2 = to_acc(x[base + i + half]);
    if (slot >= rotated_slots) {
      y[base + i] = x[base + i];
      y[base + i + half] = x[base + i + half];
      continue;
    }
    const float2 cs = table[static_cast<int64_t>(row % t) * half + i];
    const A c = cs.x, s = sign * cs.y;  // rope.cuh's rope_rotate, in A (f64 for f64 tensors)
    y[base + i] = from_acc<T>(x1 * c - x2 * s);
    y[base + i + half] = from_acc<T>(x2 * c + x1 * s);
  }
}

}  // namespace

const Tensor& rope_table(int dev, int64_t t, int64_t d, double base) {
  static std::mutex mu;
  static std::map<std::tuple<int, int64_t, int64_t, double>, Tensor> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_tuple(dev, t, d, base);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const int64_t half = d / 2;
  std::vector<double> v(static_cast<size_t>(t * half * 2));
  for (int64_t ti = 0; ti < t; ++ti)
    for (int64_t i = 0; i < half; ++i) {
      const double theta = static_cast<double>(ti) *
                           std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(d));
      v[static_cast<size_t>((ti * half + i) * 2)] = std::cos(theta);
      v[static_cast<size_t>((ti * half + i) * 2 + 1)] = std::sin(theta);
    }
  Tensor table = Tensor::from_vector(v, {t * half * 2}, DType::f32, Device::cuda(dev));
  return cache.emplace(key, std::move(table)).first->second;
}

void rope(const Tensor& qkv, int64_t heads, int64_t kv_heads, double base, bool inverse,
          Tensor& out) {
  const int dev = qkv.device().index;
  DeviceGuard guard(dev);
  const int64_t b = qkv.size(0), t = qkv.size(1), slots = heads + 2 * kv_heads;
  const int64_t d = qkv.size(2) / slots, half = d / 2;
  const int64_t pairs = b * t * slots * half;
  if (pairs == 0) return;
  const Tensor& table = rope_table(dev, t, d, base);
  FFN_DISPATCH_ALL(qkv.dtype(), "rope", [&]<class H>() {
    using T = device_t<H>;
    rope_kernel<T><<<grid_for(pairs, 256), 256, 0, stream(dev)>>>(
        dptr<T>(qkv), dptr<T>(out), static_cast<const float2*>(table.data_ptr()), pairs,
        static_cast<int>(t), static_cast<int>(slots), static_cast<int>(heads + kv_heads),
        static_cast<int>(half), inverse ? -1.0f : 1.0f);
    FFN_CHECK_LAUNCH();
  });
}

}  // namespace ffn::cuda
