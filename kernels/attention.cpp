// kernels/attention.cpp — front door of kernels/attention.h: argument checks, then the
// CPU reference (kernels/cpu/) or the CUDA kernels (kernels/cuda/; a CPU-only build links
// kernels/cuda_stub.cpp, which throws "built without CUDA").
#include "kernels/attention.h"

#include <cmath>
#include <limits>
#include <vector>

#include "core/dispatch.h"
#include "kernels/bias_act_dropout.h"
#include "kernels/checks.h"
#include "kernels/rope.h"
#include "kernels/scale.h"

namespace ffn {

namespace {

struct Dims {
  int64_t b, t, h, d;
};

Dims check_qkv(const Tensor& qkv, int64_t heads, double scale, const DropoutSpec& d,
               const char* op) {
  check_defined(qkv, op, "qkv");
  check_dim(qkv, 3, op, "qkv");
  FFN_CHECK(is_float(qkv.dtype()), "[", op, "] qkv must be a float tensor, got ",
            dtype_name(qkv.dtype()));
  FFN_CHECK(heads > 0 && qkv.size(2) % (3 * heads) == 0 && qkv.size(2) > 0, "[", op,
            "] qkv.shape[-1]=", qkv.size(2), " is not 3·heads·head_dim for heads=", heads);
  FFN_CHECK(std::isfinite(scale) && scale > 0, "[", op, "] scale must be > 0, got ", scale);
  detail::check_dropout(d, op);
  const Dims dims{qkv.size(0), qkv.size(1), heads, qkv.size(2) / (3 * heads)};
  if (qkv.is_cuda())
    FFN_CHECK(fused_attention_supported(qkv.dtype(), dims.t, dims.d), "[", op,
              "] the CUDA kernel takes bf16/f16, head_dim 32, 64 or 128 and a sequence that "
              "fits its tiles; got ",
              dtype_name(qkv.dtype()), ", head_dim ", dims.d, ", T ", dims.t);
  return dims;
}

void check_lse(const Tensor& lse, const Tensor& qkv, const Dims& s, const char* op) {
  check_defined(lse, op, "lse");
  check_shape(lse, {s.b * s.h, s.t}, op, "lse");
  check_same_device(lse, qkv, op, "lse", "qkv");
  FFN_CHECK(lse.dtype() == DType::f32 && lse.is_contiguous(), "[", op,
            "] lse must be a contiguous f32 tensor, got ", lse.desc());
}

}  // namespace

bool fused_attention_supported(DType dt, int64_t t, int64_t head_dim) {
  return cuda::fused_attention_supported(dt, t, head_dim);
}

bool fused_attention_preferred(DType dt, int64_t t, int64_t head_dim) {
  return cuda::fused_attention_preferred(dt, t, head_dim);
}

void fused_attention(const Tensor& qkv, int64_t heads, double scale, const DropoutSpec& d,
                     Tensor& y, Tensor& lse) {
  const char* op = "fused_attention";
  const Dims s = check_qkv(qkv, heads, scale, d, op);
  detail::check_like(y, qkv, {s.b, s.t, s.h * s.d}, op, "y");
  check_lse(lse, qkv, s, op);
  const Tensor x = qkv.contiguous();
  if (qkv.is_cuda()) {
    return cuda::fused_attention(x, heads, scale, d, y, lse);
  }
  cpu::fused_attention(x, heads, scale, d, y, lse);
}

void fused_attention_backward(const Tensor& qkv, const Tensor& y, const Tensor& dy,
                              const Tensor& lse, int64_t heads, double scale, const DropoutSpec& d,
                              Tensor& dqkv, double rope_base, Tensor* dqkv_sum,
                              const Tensor& row_scale) {
  const char* op = "fused_attention_backward";
  const Dims s = check_qkv(qkv, heads, scale, d, op);
  FFN_CHECK(std::isfinite(rope_base) && rope_base >= 0 && (rope_base == 0 || s.d % 2 == 0), "[", op,
            "] rope_base must be 0 (none) or > 0 with an even head_dim; got ", rope_base,
            " with head_dim ", s.d);
  const Shape out{s.b, s.t, s.h * s.d};
  for (auto [t, name] : {std::pair<const Tensor*, const char*>{&y, "y"}, {&dy, "dy"}}) {
    check_defined(*t, op, name);
    check_shape(*t, out, op, name);
    check_same_dtype(*t, qkv, op, name, "qkv");
    check_same_device(*t, qkv, op, name, "qkv");
  }
  check_lse(lse, qkv, s, op);
  detail::check_like(dqkv, qkv, qkv.shape(), op, "dqkv");
  if (dqkv_sum) detail::check_like(*dqkv_sum, qkv, {qkv.size(2)}, op, "dqkv_sum");
  if (row_scale.defined()) {
    FFN_CHECK(!dqkv_sum, "[", op, "] row_scale and dqkv_sum together are not supported");
    check_shape(row_scale, {s.b * s.t}, op, "row_scale");
    check_same_device(row_scale, qkv, op, "row_scale", "qkv");
    FFN_CHECK(row_scale.dtype() == acc_dtype(qkv.dtype()) && row_scale.is_contiguous(), "[", op,
              "] row_scale must be a contiguous ", dtype_name(acc_dtype(qkv.dtype())),
              " tensor, got ", row_scale.desc());
    FFN_CHECK(dqkv.is_contiguous(), "[", op, "] a row scale needs a contiguous dqkv");
  }
  const Tensor x = qkv.contiguous(), g = dy.contiguous();
  if (qkv.is_cuda()) {
    return cuda::fused_attention_backward(x, y.contiguous(), g, lse, heads, scale, d, dqkv,
                                          rope_base, cuda::AttentionKernel::automatic, dqkv_sum,
                                          row_scale);
  }
  cpu::fused_attention_backward(x, g, heads, scale, d, dqkv);
  if (rope_base > 0) {  // the reference: the rotation's own backward after the attention's
    Tensor back = Tensor::empty(dqkv.shape(), dqkv.dtype(), dqkv.device());
    cpu::rope(dqkv, heads, heads, rope_base, /*inverse=*/true, back);
    dqkv.copy_(back);
  }
  if (dqkv_sum) {
    const Tensor d2 = dqkv.view_2d();
    bias_grad(d2, *dqkv_sum);
  }
  if (row_scale.defined()) {
    Tensor d2 = dqkv.view_2d();
    cpu::scale_rows(d2, row_scale, d2);
  }
}

}  // namespace ffn
