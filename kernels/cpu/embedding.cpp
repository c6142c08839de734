// kernels/cpu/embedding.cpp — front door and CPU reference of embedding / embedding_backward.
#include "kernels/embedding.h"

#include <vector>

#include "core/dispatch.h"
#include "kernels/checks.h"

namespace ffn {

namespace {
void validate(const Tensor& ids, const Tensor& table_like, const Tensor& rows, const char* op,
              const char* table_name, const char* rows_name, bool check_ids = true) {
  detail::check_matrix(table_like, op, table_name);
  check_dim(ids, 1, op, "ids");
  FFN_CHECK(is_float(table_like.dtype()), "[", op, "] ", table_name, " must be a float tensor");
  check_same_device(ids, table_like, op, "ids", table_name);
  detail::check_like(rows, table_like, {ids.size(0), table_like.size(1)}, op, rows_name);
  detail::check_indices(ids, table_like.size(0), op, "ids", check_ids);
}
}  // namespace

void embedding(const Tensor& ids, const Tensor& table, Tensor& out, bool check_ids) {
  validate(ids, table, out, "embedding", "table", "out", check_ids);
  const Tensor tc = table.contiguous();
  if (out.is_cuda()) {
#if FFN_WITH_CUDA
    return cuda::embedding(ids, tc, out);
#endif
  }
  cpu::embedding(ids, tc, out);
}

void embedding_backward(const Tensor& ids, const Tensor& d_out, Tensor& d_table, bool check_ids) {
  detail::check_matrix(d_out, "embedding_backward", "d_out");
  validate(ids, d_table, d_out, "embedding_backward", "d_table", "d_out", check_ids);
  if (d_table.is_cuda()) {
#if FFN_WITH_CUDA
    return cuda::embedding_backward(ids, d_out.contiguous(), d_table);
#endif
  }
  cpu::embedding_backward(ids, d_out.contiguous(), d_table);
}

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
