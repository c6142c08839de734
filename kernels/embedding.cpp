// kernels/embedding.cpp — front door of kernels/embedding.h: argument checks, then the
// CPU reference (kernels/cpu/) or the CUDA kernels (kernels/cuda/; a CPU-only build links
// kernels/cuda_stub.cpp, which throws "built without CUDA").
#include "kernels/embedding.h"

#include <vector>

#include "core/dispatch.h"
#include "kernels/checks.h"

namespace ffn {

namespace {
// rows: [N, C] rows of table_like's dtype or, for a 16-bit table, fp32 (kernels/embedding.h).
void check_rows(const Tensor& rows, const Tensor& table_like, int64_t n, const char* op,
                const char* rows_name) {
  const DType want = table_like.dtype();
  const DType dt = rows.defined() ? rows.dtype() : want;
  const bool wide = is_half(want) && dt == acc_dtype(want);
  detail::check_like(rows, wide ? rows : table_like, {n, table_like.size(1)}, op, rows_name);
  FFN_CHECK(dt == want || wide, "[", op, "] ", rows_name, " is ", dtype_name(dt),
            " but the table is ", dtype_name(want), " (only fp32 rows go with a 16-bit table)");
  check_same_device(rows, table_like, op, rows_name, "table");
}

void validate(const Tensor& ids, const Tensor& table_like, const Tensor& rows, const char* op,
              const char* table_name, const char* rows_name, bool check_ids = true) {
  detail::check_matrix(table_like, op, table_name);
  check_dim(ids, 1, op, "ids");
  FFN_CHECK(is_float(table_like.dtype()), "[", op, "] ", table_name, " must be a float tensor");
  check_same_device(ids, table_like, op, "ids", table_name);
  check_rows(rows, table_like, ids.size(0), op, rows_name);
  detail::check_indices(ids, table_like.size(0), op, "ids", check_ids);
}

// pos [P, C] like table, 1 ≤ t ≤ P, n a multiple of t.
void check_positions(const Tensor& pos, const Tensor& table_like, int64_t t, int64_t n,
                     const char* op) {
  detail::check_matrix(pos, op, "pos");
  FFN_CHECK(pos.dtype() == table_like.dtype() && pos.size(1) == table_like.size(1), "[", op,
            "] pos must be [P, ", table_like.size(1), "] ", dtype_name(table_like.dtype()),
            ", got ", pos.desc());
  check_same_device(pos, table_like, op, "pos", "table");
  FFN_CHECK(t >= 1 && t <= pos.size(0) && n % t == 0, "[", op, "] t=", t,
            " must be in [1, ", pos.size(0), "] (pos's rows) and divide the ", n, " ids");
}
}  // namespace

void embedding(const Tensor& ids, const Tensor& table, Tensor& out, bool check_ids) {
  embedding_sum(ids, table, Tensor(), 0, out, check_ids);
}

void embedding_sum(const Tensor& ids, const Tensor& table, const Tensor& pos, int64_t t,
                   Tensor& out, bool check_ids) {
  const char* op = pos.defined() ? "embedding_sum" : "embedding";
  validate(ids, table, out, op, "table", "out", check_ids);
  if (pos.defined()) check_positions(pos, table, t, ids.size(0), op);
  const Tensor tc = table.contiguous();
  const Tensor pc = pos.defined() ? pos.contiguous() : Tensor();
  if (out.is_cuda()) return cuda::embedding_sum(ids, tc, pc, t, out);
  cpu::embedding_sum(ids, tc, pc, t, out);
}

void embedding_backward(const Tensor& ids, const Tensor& d_out, Tensor& d_table, bool check_ids,
                        bool accumulate) {
  detail::check_matrix(d_out, "embedding_backward", "d_out");
  const Tensor dc = d_out.contiguous();
  validate(ids, d_table, dc, "embedding_backward", "d_table", "d_out", check_ids);
  if (d_table.is_cuda()) return cuda::embedding_backward(ids, dc, d_table, accumulate);
  cpu::embedding_backward(ids, dc, d_table, accumulate);
}

void position_grad(const Tensor& d_out, int64_t t, Tensor& d_pos) {
  detail::check_matrix(d_out, "position_grad", "d_out");
  detail::check_matrix(d_pos, "position_grad", "d_pos");
  FFN_CHECK(d_pos.is_contiguous() && is_float(d_pos.dtype()),
            "[position_grad] d_pos must be a contiguous float matrix, got ", d_pos.desc());
  const Tensor dc = d_out.contiguous();
  check_rows(dc, d_pos, dc.size(0), "position_grad", "d_out");
  FFN_CHECK(t >= 1 && t <= d_pos.size(0) && dc.size(0) % t == 0, "[position_grad] t=", t,
            " must be in [1, ", d_pos.size(0), "] (d_pos's rows) and divide d_out's ",
            dc.size(0), " rows");
  if (d_pos.is_cuda()) return cuda::position_grad(dc, t, d_pos);
  cpu::position_grad(dc, t, d_pos);
}

}  // namespace ffn
