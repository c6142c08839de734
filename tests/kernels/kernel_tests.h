// tests/kernels/kernel_tests.h — what the per-stem kernel tests (tests/kernels/test_<op>.cpp,
// CPU reference and CUDA cases of one op side by side) share: shapes, dtypes, the GPU, and
// small tensor builders. The GPU-vs-reference rule is check_against_reference
// (tests/test_util.h).
#pragma once

#include <utility>
#include <vector>

#include "core/tensor.h"
#include "tests/test_util.h"

namespace ffn::test {

// CPU reference shapes: 1×1, odd, and past one 256-wide tile (docs/design.md).
inline const Shape kCpuShapes[] = {{1, 1}, {7, 13}, {129, 257}};
// GPU (M, N): hidden sizes 1, 3, 7, 1600, 4097 and an aligned 4096; M = 1; zero sizes.
inline const std::pair<int64_t, int64_t> kGpuShapes[] = {
    {1, 1}, {37, 3}, {5, 7}, {33, 1600}, {9, 4097}, {64, 4096}, {1, 4096}, {0, 64}, {6, 0}};
inline const Device kGpu = Device::cuda(0);
inline const DType kGpuDtypes[] = {DType::f32, DType::bf16, DType::f16};

// The values a dt tensor actually holds, as f64 (inputs are rounded once to dt).
inline Tensor exact(const Tensor& x64, DType dt) {
  return x64.to(dt).to(DType::f64);
}

// Unaligned twin of a GPU tensor: same values, data pointer off by one element.
inline Tensor misaligned(const Tensor& t) {
  Tensor big = Tensor::empty({t.numel() + 1}, t.dtype(), t.device());
  Tensor view = big.narrow(0, 1, t.numel()).reshape(t.shape());
  view.copy_(t);
  return view;
}

// i32 ids on a device.
inline Tensor ids_of(const std::vector<double>& v, Device d = Device::cpu()) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, DType::i32, d);
}
// n deterministic, repeating ids in [0, v).
inline Tensor ids(int64_t n, int64_t v, uint64_t seed) {
  std::vector<double> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    x[i] = static_cast<double>((i * 7919 + static_cast<int64_t>(seed) * 31 + i * i) % v);
  return Tensor::from_vector(x, {n}, DType::i32);
}

// Naive triple loop: the GEMM reference's reference.
inline Tensor naive_gemm(const Tensor& a, bool ta, const Tensor& b, bool tb) {
  const auto va = a.to_vector(), vb = b.to_vector();
  const int64_t m = ta ? a.size(1) : a.size(0), k = ta ? a.size(0) : a.size(1);
  const int64_t n = tb ? b.size(0) : b.size(1);
  std::vector<double> c(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double x = ta ? va[p * a.size(1) + i] : va[i * a.size(1) + p];
        const double y = tb ? vb[j * b.size(1) + p] : vb[p * b.size(1) + j];
        s += x * y;
      }
      c[i * n + j] = s;
    }
  return Tensor::from_vector(c, {m, n}, DType::f64);
}

}  // namespace ffn::test
