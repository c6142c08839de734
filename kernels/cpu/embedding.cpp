// kernels/cpu/embedding.cpp — the CPU reference of kernels/embedding.h (plain loops or Eigen,
// sums in f64): what the CPU runs, and the yardstick the CUDA kernels are tested against.
#include "kernels/embedding.h"

#include <vector>

#include "core/dispatch.h"
#include "kernels/checks.h"

namespace ffn {

namespace cpu {

void embedding(const Tensor& ids, const Tensor& table, Tensor& out) {
  FFN_DISPATCH_FLOAT(table.dtype(), "embedding", [&]<class T>() {
    const int32_t* id = ids.data<int32_t>();
    const int64_t n = ids.size(0), c = table.size(1);
    const T* t = table.data<T>();
    T* o = out.data<T>();
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < c; ++j) o[i * c + j] = t[int64_t{id[i]} * c + j];
  });
}

void embedding_backward(const Tensor& ids, const Tensor& d_out, Tensor& d_table) {
  FFN_DISPATCH_FLOAT(d_table.dtype(), "embedding_backward", [&]<class T>() {
    const int32_t* id = ids.data<int32_t>();
    const int64_t n = ids.size(0), c = d_table.size(1), v = d_table.size(0);
    const T* g = d_out.data<T>();
    std::vector<double> acc(static_cast<size_t>(v * c), 0.0);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < c; ++j) acc[int64_t{id[i]} * c + j] += static_cast<double>(g[i * c + j]);
    T* d = d_table.data<T>();
    for (int64_t k = 0; k < v * c; ++k) d[k] = static_cast<T>(acc[k]);
  });
}

}  // namespace cpu
}  // namespace ffn
