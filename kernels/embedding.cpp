// kernels/embedding.cpp — front door of kernels/embedding.h: argument checks, then the
// CPU reference (kernels/cpu/) or the CUDA kernels (kernels/cuda/; a CPU-only build links
// kernels/cuda_stub.cpp, which throws "built without CUDA").
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
    return cuda::embedding(ids, tc, out);
  }
  cpu::embedding(ids, tc, out);
}

void embedding_backward(const Tensor& ids, const Tensor& d_out, Tensor& d_table, bool check_ids) {
  detail::check_matrix(d_out, "embedding_backward", "d_out");
  validate(ids, d_table, d_out, "embedding_backward", "d_table", "d_out", check_ids);
  if (d_table.is_cuda()) {
    return cuda::embedding_backward(ids, d_out.contiguous(), d_table);
  }
  cpu::embedding_backward(ids, d_out.contiguous(), d_table);
}

}  // namespace ffn
