// kernels/cross_entropy.cpp — front door of kernels/cross_entropy.h: argument checks, then the
// CPU reference (kernels/cpu/) or the CUDA kernels (kernels/cuda/; a CPU-only build links
// kernels/cuda_stub.cpp, which throws "built without CUDA").
#include "kernels/cross_entropy.h"

#include <cmath>
#include <limits>

#include "core/dispatch.h"
#include "kernels/checks.h"

namespace ffn {

namespace {
void check_acc(const Tensor& t, const Tensor& logits, const Shape& shape, const char* op,
               const char* name) {
  check_defined(t, op, name);
  check_shape(t, shape, op, name);
  check_same_device(t, logits, op, name, "logits");
  FFN_CHECK(t.dtype() == acc_dtype(logits.dtype()), "[", op, "] ", name, " must be ",
            dtype_name(acc_dtype(logits.dtype())), ", got ", dtype_name(t.dtype()));
  FFN_CHECK(t.is_contiguous(), "[", op, "] ", name, " must be contiguous");
}
// The number of classes (all columns for classes == 0), checked.
int64_t check_common(const Tensor& logits, const Tensor& targets, const char* op,
                     bool check_range, int64_t classes) {
  detail::check_matrix(logits, op, "logits");
  FFN_CHECK(is_float(logits.dtype()), "[", op, "] logits must be a float tensor");
  FFN_CHECK(logits.size(1) > 0, "[", op, "] logits have 0 classes");
  FFN_CHECK(classes >= 0 && classes <= logits.size(1), "[", op, "] classes=", classes,
            " must be in [0, ", logits.size(1), "] (the logits' columns; 0: all)");
  if (classes == 0) classes = logits.size(1);
  check_defined(targets, op, "targets");
  check_shape(targets, {logits.size(0)}, op, "targets");
  check_same_device(targets, logits, op, "targets", "logits");
  detail::check_indices(targets, classes, op, "targets", check_range);
  return classes;
}
}  // namespace

void cross_entropy(const Tensor& logits, const Tensor& targets, Tensor& loss, Tensor& lse,
                   bool check_targets, int64_t classes) {
  classes = check_common(logits, targets, "cross_entropy", check_targets, classes);
  FFN_CHECK(logits.size(0) > 0, "[cross_entropy] the mean over 0 rows is undefined");
  check_acc(loss, logits, {}, "cross_entropy", "loss");
  check_acc(lse, logits, {logits.size(0)}, "cross_entropy", "lse");
  const Tensor lc = logits.contiguous();
  if (lc.is_cuda()) {
    return cuda::cross_entropy(lc, targets, loss, lse, classes);
  }
  cpu::cross_entropy(lc, targets, loss, lse, classes);
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            const Tensor& d_loss, Tensor& d_logits, int64_t classes) {
  const char* op = "cross_entropy_backward";
  // The forward checked the values.
  classes = check_common(logits, targets, op, /*check_range=*/false, classes);
  check_acc(lse, logits, {logits.size(0)}, op, "lse");
  check_acc(d_loss, logits, {}, op, "d_loss");
  detail::check_like(d_logits, logits, logits.shape(), op, "d_logits");
  const Tensor lc = logits.contiguous();
  if (lc.is_cuda()) {
    return cuda::cross_entropy_backward(lc, targets, lse, d_loss, d_logits, classes);
  }
  cpu::cross_entropy_backward(lc, targets, lse, d_loss, d_logits, classes);
}

void cross_entropy_rows(Tensor& logits, const Tensor& targets, Tensor& row_loss, bool check_targets,
                        int64_t classes, std::optional<double> grad_scale) {
  const char* op = "cross_entropy_rows";
  classes = check_common(logits, targets, op, check_targets, classes);
  check_acc(row_loss, logits, {logits.size(0)}, op, "row_loss");
  FFN_CHECK(logits.is_contiguous(), "[", op, "] logits must be contiguous (written in place)");
  FFN_CHECK(!grad_scale || std::isfinite(*grad_scale), "[", op, "] grad_scale must be finite, got ",
            *grad_scale);
  if (logits.size(0) == 0) return;
  if (logits.is_cuda())
    return cuda::cross_entropy_rows(logits, targets, row_loss, classes, grad_scale);
  cpu::cross_entropy_rows(logits, targets, row_loss, classes, grad_scale);
}

void mean_rows(const Tensor& row_loss, Tensor& loss) {
  check_defined(row_loss, "mean_rows", "row_loss");
  check_dim(row_loss, 1, "mean_rows", "row_loss");
  FFN_CHECK(row_loss.size(0) > 0, "[mean_rows] the mean over 0 rows is undefined");
  FFN_CHECK(row_loss.is_contiguous(), "[mean_rows] row_loss must be contiguous");
  check_defined(loss, "mean_rows", "loss");
  check_shape(loss, {}, "mean_rows", "loss");
  check_same_dtype(loss, row_loss, "mean_rows", "loss", "row_loss");
  check_same_device(loss, row_loss, "mean_rows", "loss", "row_loss");
  if (loss.is_cuda()) return cuda::mean_rows(row_loss, loss);
  cpu::mean_rows(row_loss, loss);
}

void scale_by(const Tensor& x, const Tensor& s, Tensor& y) {
  check_defined(x, "scale_by", "x");
  check_defined(s, "scale_by", "s");
  check_defined(y, "scale_by", "y");
  FFN_CHECK(is_float(y.dtype()), "[scale_by] y must be a float tensor, got ",
            dtype_name(y.dtype()));
  FFN_CHECK(x.dtype() == y.dtype() || x.dtype() == acc_dtype(y.dtype()), "[scale_by] x is ",
            dtype_name(x.dtype()), " but y is ", dtype_name(y.dtype()), " (x must be y's dtype or ",
            dtype_name(acc_dtype(y.dtype())), ")");
  FFN_CHECK(s.numel() == 1 && s.dtype() == acc_dtype(y.dtype()), "[scale_by] s must be one ",
            dtype_name(acc_dtype(y.dtype())), " value, got ", s.desc());
  check_shape(y, x.shape(), "scale_by", "y");
  FFN_CHECK(x.is_contiguous() && y.is_contiguous(), "[scale_by] x and y must be contiguous");
  check_same_device(x, y, "scale_by", "x", "y");
  check_same_device(s, y, "scale_by", "s", "y");
  if (y.numel() == 0) return;
  if (y.is_cuda()) return cuda::scale_by(x, s, y);
  cpu::scale_by(x, s, y);
}

}  // namespace ffn
