// kernels/cpu/checks.cpp — argument checks shared by the fused elementwise ops.
#include <cmath>

#include "kernels/checks.h"

namespace ffn::detail {

void check_dropout(const DropoutSpec& d, const char* op) {
  FFN_CHECK(std::isfinite(d.p) && d.p >= 0.0f && d.p <= 1.0f, "[", op,
            "] dropout p must be in [0, 1], got ", d.p);
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

}  // namespace ffn::detail
