// kernels/bias_act_dropout.cpp — front door of kernels/bias_act_dropout.h: argument checks, then
// the CPU reference (kernels/cpu/) or the CUDA kernels (kernels/cuda/; a CPU-only build links
// kernels/cuda_stub.cpp, which throws "built without CUDA").
#include "kernels/bias_act_dropout.h"

#include "kernels/checks.h"

namespace ffn {

Activation parse_activation(const std::string& s) {
  if (const auto a = value_of(kActivationNames, s)) return *a;
  FFN_THROW("[activation] unknown activation '", s, "' (expected ", names_list(kActivationNames),
            ")");
}

void bias_act_dropout(const Tensor& z, const Tensor& b, Activation act, const DropoutSpec& d,
                      Tensor& hd) {
  const char* op = act == Activation::identity ? "bias_dropout" : "bias_act_dropout";
  detail::check_matrix(z, op, "z");
  detail::check_dropout(d, op);
  if (b.defined()) detail::check_like(b, z, {z.size(1)}, op, "b");
  detail::check_like(hd, z, z.shape(), op, "hd");
  const Tensor zc = z.contiguous(), bc = b.defined() ? b.contiguous() : b;
  if (z.is_cuda()) return cuda::bias_act_dropout(zc, bc, act, d, hd);
  cpu::bias_act_dropout(zc, bc, act, d, hd);
}

void bias_act_dropout_backward(const Tensor& dhd, const Tensor& z, const Tensor& b,
                               Activation act, const DropoutSpec& d, Tensor& dpre, Tensor* db,
                               Tensor* hd) {
  const char* op = "bias_act_dropout_backward";
  detail::check_matrix(z, op, "z");
  detail::check_dropout(d, op);
  detail::check_like(dhd, z, z.shape(), op, "dhd");
  if (b.defined()) detail::check_like(b, z, {z.size(1)}, op, "b");
  detail::check_like(dpre, z, z.shape(), op, "dpre");
  if (db) detail::check_like(*db, z, {z.size(1)}, op, "db");
  if (hd) detail::check_like(*hd, z, z.shape(), op, "hd");
  const Tensor zc = z.contiguous(), gc = dhd.contiguous(), bc = b.defined() ? b.contiguous() : b;
  if (z.is_cuda()) return cuda::bias_act_dropout_backward(gc, zc, bc, act, d, &dpre, db, hd);
  cpu::bias_act_dropout_backward(gc, zc, bc, act, d, &dpre, db, hd);
}

void bias_dropout_backward(const Tensor& dy, const DropoutSpec& d, Tensor* dz, Tensor* db) {
  const char* op = "bias_dropout_backward";
  detail::check_matrix(dy, op, "dy");
  detail::check_dropout(d, op);
  if (dz) detail::check_like(*dz, dy, dy.shape(), op, "dz");
  if (db) detail::check_like(*db, dy, {dy.size(1)}, op, "db");
  const Tensor dyc = dy.contiguous();
  if (dy.is_cuda())
    return cuda::bias_act_dropout_backward(dyc, {}, {}, Activation::identity, d, dz, db, nullptr);
  cpu::bias_act_dropout_backward(dyc, {}, {}, Activation::identity, d, dz, db, nullptr);
}

}  // namespace ffn
