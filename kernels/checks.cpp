// kernels/cpu/checks.cpp — argument checks shared by the fused elementwise ops.
#include <cmath>

#include "kernels/checks.h"

#include "kernels/embedding.h"

namespace ffn::detail {

void check_dropout(const DropoutSpec& d, const char* op) {
  check_dropout_p(d.p, op);  // Note [Dropout probability]
}

bool dense16(const Tensor& t) {
  return t.is_contiguous() && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

void check_matrix(const Tensor& t, const char* op, const char* name) {
  check_defined(t, op, name);
  check_dim(t, 2, op, name);
}

void check_like(const Tensor& t, const Tensor& ref, const Shape& shape, const char* op,
                const char* name) {
  check_defined(t, op, name);
  check_shape(t, shape, op, name);
  check_same_device(t, ref, op, name, "the input");
  check_same_dtype(t, ref, op, name, "the input");
  FFN_CHECK(t.is_contiguous(), "[", op, "] output ", name, " must be contiguous");
}

void check_linear(const DropoutSpec& d, const Tensor& a, const Tensor& w, bool nt, const char* op,
                  const char* a_name, const char* free, bool shape_ok) {
  check_dropout(d, op);
  check_matrix(a, op, a_name);
  check_matrix(w, op, "w");
  const int64_t k = a.size(1);
  FFN_CHECK((nt ? w.size(1) : w.size(0)) == k && shape_ok, "[", op, "] ", a_name, " is [",
            a.size(0), ", ", k, "] but w is ", shape_str(w.shape()), " (expected [",
            nt ? free : std::to_string(k), ", ", nt ? std::to_string(k) : free, "])");
  check_like(w, a, w.shape(), op, "w");
}

void check_indices(const Tensor& ids, int64_t limit, const char* op, const char* name,
                   bool check_range) {
  check_defined(ids, op, name);
  FFN_CHECK(ids.dtype() == DType::i32, "[", op, "] ", name, " must be i32, got ",
            dtype_name(ids.dtype()));
  FFN_CHECK(ids.is_contiguous(), "[", op, "] ", name, " must be contiguous");
  if (!check_range) return;
  int64_t bad = -1;
  if (ids.is_cuda()) {
    bad = cuda::first_bad_index(ids, limit);
  } else {
    const int32_t* p = ids.data<int32_t>();
    for (int64_t i = 0; i < ids.numel() && bad < 0; ++i)
      if (p[i] < 0 || p[i] >= limit) bad = i;
  }
  if (bad >= 0) {
    const int64_t value = static_cast<int64_t>(ids.reshape({-1}).narrow(0, bad, 1).item());
    FFN_THROW("[", op, "] ", name, "[", bad, "]=", value, " is out of range [0, ", limit, ")");
  }
}

}  // namespace ffn::detail
