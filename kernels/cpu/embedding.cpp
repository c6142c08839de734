// kernels/cpu/embedding.cpp — the CPU reference of kernels/embedding.h (plain loops or Eigen,
// sums in f64): what the CPU runs, and the yardstick the CUDA kernels are tested against.
#include "kernels/embedding.h"

#include <vector>

#include "core/dispatch.h"
#include "kernels/checks.h"

namespace ffn {

namespace cpu {

namespace {
// Row-major values as f64 (any float dtype; rows in fp32 beside a 16-bit table included).
std::vector<double> as_f64(const Tensor& t) { return t.to(DType::f64).to_vector(); }
}  // namespace

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
  const int32_t* id = ids.data<int32_t>();
  const int64_t n = ids.size(0), c = d_table.size(1), v = d_table.size(0);
  const std::vector<double> g = as_f64(d_out);
  std::vector<double> acc(static_cast<size_t>(v * c), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < c; ++j) acc[int64_t{id[i]} * c + j] += g[i * c + j];
  if (accumulate) {
    // Rows no id names keep their bits; the others are old + Σ, rounded once.
    std::vector<double> old = as_f64(d_table);
    std::vector<char> named(static_cast<size_t>(v), 0);
    for (int64_t i = 0; i < n; ++i) named[id[i]] = 1;
    for (int64_t r = 0; r < v; ++r)
      for (int64_t j = 0; j < c; ++j)
        acc[r * c + j] = named[r] ? old[r * c + j] + acc[r * c + j] : old[r * c + j];
  }
  d_table.copy_(Tensor::from_vector(acc, {v, c}, DType::f64));
}

void position_grad(const Tensor& d_out, int64_t t, Tensor& d_pos) {
  const int64_t n = d_out.size(0), c = d_out.size(1), rows = d_pos.size(0);
  const std::vector<double> g = as_f64(d_out);
  std::vector<double> acc(static_cast<size_t>(rows * c), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < c; ++j) acc[(i % t) * c + j] += g[i * c + j];
  d_pos.copy_(Tensor::from_vector(acc, {rows, c}, DType::f64));
}

}  // namespace cpu
}  // namespace ffn
