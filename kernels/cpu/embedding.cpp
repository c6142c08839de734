// kernels/cpu/embedding.cpp — the CPU reference of kernels/embedding.h (plain loops or Eigen,
// sums in f64): what the CPU runs, and the yardstick the CUDA kernels are tested against.
#include "kernels/embedding.h"

#include <vector>

#include "core/dispatch.h"
#include "kernels/checks.h"

namespace ffn {

namespace cpu {

void embedding_sum(const Tensor& ids, const Tensor& table, const Tensor& pos, int64_t t,
                   Tensor& out) {
  // The CPU has no 16-bit dtypes: out is table's dtype. Only the named rows are read.
  FFN_DISPATCH_FLOAT(table.dtype(), "embedding", [&]<class T>() {
    const int32_t* id = ids.data<int32_t>();
    const int64_t n = ids.size(0), c = table.size(1);
    const T* tab = table.data<T>();
    const T* p = pos.defined() ? pos.data<T>() : nullptr;
    T* o = out.data<T>();
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < c; ++j)
        o[i * c + j] = static_cast<T>(static_cast<double>(tab[int64_t{id[i]} * c + j]) +
                                      (p ? static_cast<double>(p[(i % t) * c + j]) : 0.0));
  });
}

void embedding_backward(const Tensor& ids, const Tensor& d_out, Tensor& d_table, bool accumulate) {
  // The CPU has no 16-bit dtypes: d_out is d_table's dtype.
  FFN_DISPATCH_FLOAT(d_table.dtype(), "embedding_backward", [&]<class T>() {
    const int32_t* id = ids.data<int32_t>();
    const int64_t n = ids.size(0), c = d_table.size(1), v = d_table.size(0);
    const T* g = d_out.data<T>();
    T* d = d_table.data<T>();
    std::vector<double> acc(static_cast<size_t>(v * c), 0.0);
    std::vector<char> named(static_cast<size_t>(v), 0);
    for (int64_t i = 0; i < n; ++i) {
      named[id[i]] = 1;
      for (int64_t j = 0; j < c; ++j)
        acc[int64_t{id[i]} * c + j] += static_cast<double>(g[i * c + j]);
    }
    // Accumulating, rows no id names keep their bits and the others are old + Σ, rounded once.
    for (int64_t r = 0; r < v; ++r) {
      if (accumulate && !named[r]) continue;
      for (int64_t j = 0; j < c; ++j)
        d[r * c + j] = static_cast<T>((accumulate ? static_cast<double>(d[r * c + j]) : 0.0) +
                                      acc[r * c + j]);
    }
  });
}

void position_grad(const Tensor& d_out, int64_t t, Tensor& d_pos) {
  FFN_DISPATCH_FLOAT(d_pos.dtype(), "position_grad", [&]<class T>() {
    const int64_t n = d_out.size(0), c = d_out.size(1), rows = d_pos.size(0);
    const T* g = d_out.data<T>();
    std::vector<double> acc(static_cast<size_t>(rows * c), 0.0);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < c; ++j) acc[(i % t) * c + j] += static_cast<double>(g[i * c + j]);
    T* d = d_pos.data<T>();
    for (int64_t k = 0; k < rows * c; ++k) d[k] = static_cast<T>(acc[k]);
  });
}

}  // namespace cpu
}  // namespace ffn
