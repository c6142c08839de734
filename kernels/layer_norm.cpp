// kernels/layer_norm.cpp — front door of kernels/layer_norm.h: argument checks, then the
// CPU reference (kernels/cpu/) or the CUDA kernels (kernels/cuda/; a CPU-only build links
// kernels/cuda_stub.cpp, which throws "built without CUDA").
#include "kernels/layer_norm.h"

#include <cmath>
#include <vector>

#include "core/dispatch.h"
#include "kernels/bias_act_dropout.h"  // bias_grad
#include "kernels/checks.h"
#include "kernels/cuda/gemm/sm90_gemm.h"
#include "kernels/dropout_add.h"
#include "kernels/gemm.h"

namespace ffn {

namespace {
void check_stats(const Tensor& t, const Tensor& x, const char* op, const char* name) {
  check_defined(t, op, name);
  check_shape(t, {x.size(0)}, op, name);
  check_same_device(t, x, op, name, "x");
  FFN_CHECK(t.dtype() == acc_dtype(x.dtype()), "[", op, "] ", name, " must be ",
            dtype_name(acc_dtype(x.dtype())), ", got ", dtype_name(t.dtype()));
  FFN_CHECK(t.is_contiguous(), "[", op, "] ", name, " must be contiguous");
}

// x is in w's dtype, or (GPU only) in acc_dtype(w) for a 16-bit w.
void check_x_dtype(const Tensor& x, const Tensor& w, const char* op) {
  const bool mixed = x.dtype() != w.dtype();
  FFN_CHECK(!mixed || (is_half(w.dtype()) && x.dtype() == acc_dtype(w.dtype()) && x.is_cuda()),
            "[", op, "] x is ", dtype_name(x.dtype()), " but w is ", dtype_name(w.dtype()),
            " (x may differ only as fp32 with 16-bit parameters, on the GPU)");
}
}  // namespace

namespace {
// Both norms' forward checks; op names the caller. b and mean are undefined for RMSNorm.
void check_forward(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& y,
                   const Tensor* mean, const Tensor& rstd, const char* op) {
  detail::check_matrix(x, op, "x");
  FFN_CHECK(is_float(x.dtype()), "[", op, "] x must be a float tensor");
  FFN_CHECK(std::isfinite(eps) && eps > 0, "[", op, "] eps must be > 0, got ", eps);
  const int64_t c = x.size(1);
  FFN_CHECK(c > 0 || x.size(0) == 0, "[", op, "] x has rows of length 0");
  check_defined(w, op, "w");
  check_x_dtype(x, w, op);
  detail::check_like(w, w, {c}, op, "w");
  check_same_device(w, x, op, "w", "x");
  if (b.defined()) detail::check_like(b, w, {c}, op, "b");
  if (y.defined()) detail::check_like(y, w, x.shape(), op, "y");  // undefined: statistics only
  if (mean) check_stats(*mean, x, op, "mean");
  check_stats(rstd, x, op, "rstd");
}

// Both norms' backward checks.
void check_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor* mean,
                    const Tensor& rstd, const Tensor* dx, const Tensor* dw, const Tensor* db,
                    bool accumulate_dx, const char* op) {
  detail::check_matrix(x, op, "x");
  check_defined(w, op, "w");
  check_x_dtype(x, w, op);
  detail::check_like(w, w, {x.size(1)}, op, "w");
  check_same_device(w, x, op, "w", "x");
  check_defined(dy, op, "dy");
  check_shape(dy, x.shape(), op, "dy");
  check_same_dtype(dy, w, op, "dy", "w");
  check_same_device(dy, x, op, "dy", "x");
  if (mean) check_stats(*mean, x, op, "mean");
  check_stats(rstd, x, op, "rstd");
  if (dx) detail::check_like(*dx, x, x.shape(), op, "dx");
  FFN_CHECK(!accumulate_dx || (dx && dx->is_contiguous()), "[", op,
            "] accumulate_dx needs a contiguous dx to add to");
  if (dw) detail::check_like(*dw, w, {x.size(1)}, op, "dw");
  if (db) detail::check_like(*db, w, {x.size(1)}, op, "db");
}
}  // namespace

void add_layer_norm(const Tensor& x, const Tensor& h, const DropoutSpec& d, const Tensor& w,
                    const Tensor& b, double eps, Tensor& a, Tensor& y, Tensor& mean, Tensor& rstd) {
  const char* op = mean.defined() ? "add_layer_norm" : "add_rms_norm";
  FFN_CHECK(mean.defined() || !b.defined(), "[", op, "] RMSNorm (no mean) takes no bias");
  check_forward(x, w, b, eps, y, mean.defined() ? &mean : nullptr, rstd, op);
  detail::check_dropout(d, op);
  detail::check_like(h, w, x.shape(), op, "h");
  check_same_device(h, x, op, "h", "x");
  detail::check_like(a, x, x.shape(), op, "a");
  FFN_CHECK(a.is_contiguous(), "[", op, "] a must be contiguous");
  const Tensor xc = x.contiguous(), hc = h.contiguous();
  if (x.is_cuda()) return cuda::layer_norm(xc, w, b, eps, y, mean, rstd, hc, d, &a);
  cpu::dropout_add(xc, hc, d, a);
  cpu::layer_norm(a, w, b, eps, y, mean, rstd);
}

bool linear_add_layer_norm(const Tensor& xin, const Tensor& wl, const Tensor& bl, const Tensor& x,
                           const DropoutSpec& d, const Tensor& w, const Tensor& b, double eps,
                           Tensor& a, Tensor& y, Tensor& mean, Tensor& rstd) {
  const char* op = mean.defined() ? "linear_add_layer_norm" : "linear_add_rms_norm";
  FFN_CHECK(mean.defined() || !b.defined(), "[", op, "] RMSNorm (no mean) takes no bias");
  check_forward(x, w, b, eps, y, mean.defined() ? &mean : nullptr, rstd, op);
  detail::check_dropout(d, op);
  detail::check_matrix(xin, op, "xin");
  detail::check_matrix(wl, op, "wl");
  FFN_CHECK(x.dim() == 2 && xin.size(0) == x.size(0) && wl.size(0) == x.size(1) &&
                wl.size(1) == xin.size(1),
            "[", op, "] xin ", shape_str(xin.shape()), " · wl ", shape_str(wl.shape()),
            "ᵀ does not give x's shape ", shape_str(x.shape()));
  detail::check_like(xin, w, xin.shape(), op, "xin");
  detail::check_like(wl, w, wl.shape(), op, "wl");
  if (bl.defined()) detail::check_like(bl, w, {x.size(1)}, op, "bl");
  detail::check_like(a, x, x.shape(), op, "a");
  if (!x.is_cuda() || !gemm_epilogues() || !norm_epilogue() || x.dtype() != DType::f32 ||
      !cuda::sm90_gemm_add_norm_supported(xin, wl, x, a, y) || !detail::dense16(w) ||
      (b.defined() && !detail::dense16(b)) || (bl.defined() && !bl.is_contiguous()))
    return false;
  cuda::sm90_gemm_nt_add_norm(xin, wl, bl, x, d, w, b, eps, a, y, mean, rstd);
  return true;
}

namespace {
void check_branch(const BranchGrad* branch, const Tensor* dx, const Tensor& w, const char* op) {
  if (!branch) return;
  FFN_CHECK(dx && branch->dh, "[", op, "] the branch gradient needs dx and dh");
  detail::check_like(*branch->dh, w, dx->shape(), op, "dh");
  FFN_CHECK(branch->dh->is_contiguous(), "[", op, "] dh must be contiguous");
  if (branch->dh_sum) detail::check_like(*branch->dh_sum, w, w.shape(), op, "dh_sum");
  detail::check_dropout(branch->d, op);
}
}  // namespace

void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps, Tensor& y,
                Tensor& mean, Tensor& rstd) {
  check_forward(x, w, b, eps, y, &mean, rstd, "layer_norm");
  const Tensor xc = x.contiguous();
  if (x.is_cuda()) {
    return cuda::layer_norm(xc, w, b, eps, y, mean, rstd);
  }
  cpu::layer_norm(xc, w, b, eps, y, mean, rstd);
}

void rms_norm(const Tensor& x, const Tensor& w, double eps, Tensor& y, Tensor& rstd) {
  check_forward(x, w, Tensor(), eps, y, nullptr, rstd, "rms_norm");
  const Tensor xc = x.contiguous();
  Tensor no_mean;
  if (x.is_cuda()) {
    return cuda::layer_norm(xc, w, Tensor(), eps, y, no_mean, rstd);
  }
  cpu::layer_norm(xc, w, Tensor(), eps, y, no_mean, rstd);
}

void layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                         const Tensor& rstd, Tensor* dx, Tensor* dw, Tensor* db, bool accumulate_dx,
                         const BranchGrad* branch) {
  check_backward(dy, x, w, &mean, rstd, dx, dw, db, accumulate_dx, "layer_norm_backward");
  check_branch(branch, dx, w, "layer_norm_backward");
  const Tensor xc = x.contiguous(), dyc = dy.contiguous();
  if (x.is_cuda()) {
    return cuda::layer_norm_backward(
        dyc, xc, w, mean, rstd, dx, dw, db, accumulate_dx, branch ? branch->dh : nullptr,
        branch ? branch->d : DropoutSpec{}, branch ? branch->dh_sum : nullptr);
  }
  cpu::layer_norm_backward(dyc, xc, w, mean, rstd, dx, dw, db, accumulate_dx);
  if (branch) cpu::dropout_add_backward(*dx, branch->d, *branch->dh);
  if (branch && branch->dh_sum) bias_grad(*branch->dh, *branch->dh_sum);
}

void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                       Tensor* dx, Tensor* dw, bool accumulate_dx, const BranchGrad* branch,
                       bool prescaled) {
  check_backward(dy, x, w, nullptr, rstd, dx, dw, nullptr, accumulate_dx, "rms_norm_backward");
  check_branch(branch, dx, w, "rms_norm_backward");
  const Tensor xc = x.contiguous(), dyc = dy.contiguous();
  if (x.is_cuda()) {
    return cuda::layer_norm_backward(
        dyc, xc, w, Tensor(), rstd, dx, dw, nullptr, accumulate_dx, branch ? branch->dh : nullptr,
        branch ? branch->d : DropoutSpec{}, branch ? branch->dh_sum : nullptr, prescaled);
  }
  cpu::layer_norm_backward(dyc, xc, w, Tensor(), rstd, dx, dw, nullptr, accumulate_dx, prescaled);
  if (branch) cpu::dropout_add_backward(*dx, branch->d, *branch->dh);
  if (branch && branch->dh_sum) bias_grad(*branch->dh, *branch->dh_sum);
}

}  // namespace ffn
