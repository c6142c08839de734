// kernels/bias_glu_dropout.cpp — front door of kernels/bias_glu_dropout.h: argument checks, then the
// CPU reference (kernels/cpu/) or the CUDA kernels (kernels/cuda/; a CPU-only build links
// kernels/cuda_stub.cpp, which throws "built without CUDA").
#include "kernels/bias_glu_dropout.h"

#include <vector>

#include "core/dispatch.h"
#include "kernels/checks.h"
#include "kernels/cuda/gemm/sm90_gemm.h"
#include "kernels/gemm.h"

namespace ffn {

namespace {
int64_t half_width(const Tensor& z, const char* op) {
  FFN_CHECK(z.size(1) % 2 == 0, "[", op, "] z.shape[-1]=", z.size(1),
            " must be even ([value | gate] halves)");
  return z.size(1) / 2;
}
}  // namespace

void bias_glu_dropout(const Tensor& z, const Tensor& b, Activation act, const DropoutSpec& d,
                      Tensor& out) {
  const char* op = "bias_glu_dropout";
  detail::check_matrix(z, op, "z");
  detail::check_dropout(d, op);
  const int64_t h = half_width(z, op);
  if (b.defined()) detail::check_like(b, z, {2 * h}, op, "b");
  detail::check_like(out, z, {z.size(0), h}, op, "out");
  const Tensor zc = z.contiguous(), bc = b.defined() ? b.contiguous() : b;
  if (z.is_cuda()) {
    return cuda::bias_glu_dropout(zc, bc, act, d, out);
  }
  cpu::bias_glu_dropout(zc, bc, act, d, out);
}

void bias_glu_dropout_backward(const Tensor& dout, const Tensor& z, const Tensor& b, Activation act,
                        const DropoutSpec& d, Tensor& dz, Tensor* db, Tensor* out) {
  const char* op = "bias_glu_dropout_backward";
  detail::check_matrix(z, op, "z");
  detail::check_dropout(d, op);
  const int64_t h = half_width(z, op);
  detail::check_like(dout, z, {z.size(0), h}, op, "dout");
  if (b.defined()) detail::check_like(b, z, {2 * h}, op, "b");
  detail::check_like(dz, z, z.shape(), op, "dz");
  if (db) detail::check_like(*db, z, {2 * h}, op, "db");
  if (out) detail::check_like(*out, z, {z.size(0), h}, op, "out");
  const Tensor zc = z.contiguous(), gc = dout.contiguous(), bc = b.defined() ? b.contiguous() : b;
  if (z.is_cuda()) {
    return cuda::bias_glu_dropout_backward(gc, zc, bc, act, d, dz, db, out);
  }
  cpu::bias_glu_dropout_backward(gc, zc, bc, act, d, dz, db, out);
}

namespace {
// Where the GLU warpgroups run (Note [GLU warpgroup]): from the K where they were measured
// faster than the GEMM + bias_glu_dropout. H100, session 15, call 8, `ffn-bench
// --act-epilogues`, gelu_tanh, no dropout: geglu_d1024 (K = 1024, h = 4096) 0.462 against
// 0.595 ms (bare GEMM ours 0.436, cuBLASLt 0.384), geglu_d2048 (K = 2048) 1.75 against 1.94.
// At llama_char's K = 384 (SwiGLU, h = 1024, no bias; H200, session 40, the same bench) the
// forward took 0.060 against 0.094 ms and the backward 0.079 against 0.097, and llama_char's
// step 4.76 → 4.46 ms (alternated twice). Smaller K was not measured: the unfused pair there.
// The GLU with the hidden dropout was not measured at any K; it runs here as without.
constexpr int64_t kGluMinK = 384;
}  // namespace

namespace {
// linear_glu's optional row scale: [m] in acc_dtype(x) (f32 for 16-bit x), contiguous, on
// x's device.
void check_row_scale(const Tensor& s, const Tensor& x, const char* op) {
  if (!s.defined()) return;
  const DType want = acc_dtype(x.dtype());
  FFN_CHECK(s.dtype() == want && s.shape() == Shape{x.size(0)} && s.is_contiguous() &&
                s.device() == x.device(),
            "[", op, "] row_scale must be a contiguous ", dtype_name(want), " [", x.size(0),
            "] tensor on ", x.device().str(), ", got ", s.desc());
}
}  // namespace

Tensor linear_glu(const Tensor& x, const Tensor& w, const Tensor& b, Activation act,
                  const DropoutSpec& d, Tensor& out, const Tensor& row_scale) {
  const char* op = "linear_glu";
  detail::check_linear(d, x, w, /*nt=*/true, op, "x", "2h",
                       w.defined() && w.dim() == 2 && w.size(0) % 2 == 0);
  detail::check_like(out, x, {x.size(0), w.size(0) / 2}, op, "out");
  if (b.defined()) detail::check_like(b, x, {w.size(0)}, op, "b");
  check_row_scale(row_scale, x, op);
  if (!x.is_cuda() || !gemm_epilogues() || x.size(1) < kGluMinK || !detail::dense16(out) ||
      (b.defined() && !detail::dense16(b)))
    return {};
  Tensor z = Tensor::empty({x.size(0), w.size(0)}, x.dtype(), x.device());
  if (!cuda::sm90_gemm_glu_supported(x, w, act, z)) return {};
  cuda::sm90_gemm_nt_glu(x, w, b, act, d, z, out, row_scale);
  return z;
}

bool linear_glu_backward(const Tensor& dy, const Tensor& w, const Tensor& z, const Tensor& b,
                         Activation act, const DropoutSpec& d, Tensor& dz, Tensor& out, Tensor* db,
                         const Tensor& row_scale) {
  const char* op = "linear_glu_backward";
  detail::check_linear(d, dy, w, /*nt=*/false, op, "dy", "h");
  const int64_t h = w.size(1);
  detail::check_like(z, dy, {dy.size(0), 2 * h}, op, "z");
  detail::check_like(dz, dy, z.shape(), op, "dz");
  detail::check_like(out, dy, {dy.size(0), h}, op, "out");
  if (b.defined()) detail::check_like(b, dy, {2 * h}, op, "b");
  if (db) detail::check_like(*db, dy, {2 * h}, op, "db");
  check_row_scale(row_scale, dy, op);
  if (!dy.is_cuda() || !gemm_epilogues() || dy.size(1) < kGluMinK || (db && row_scale.defined()) ||
      !cuda::sm90_gemm_glu_backward_supported(dy, w, act, out) || !detail::dense16(z) ||
      !detail::dense16(dz) || (b.defined() && !detail::dense16(b)) || (db && !db->is_contiguous()))
    return false;
  cuda::sm90_gemm_nn_glu_backward(dy, w, z, b, act, d, dz, out, db, row_scale);
  return true;
}

}  // namespace ffn
