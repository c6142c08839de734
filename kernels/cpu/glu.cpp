// kernels/cpu/glu.cpp — front door and CPU reference of the gated FFN middle (GEGLU/SwiGLU).
#include "kernels/glu.h"

#include <vector>

#include "core/dispatch.h"
#include "kernels/checks.h"
#include "kernels/cpu/mask.h"

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
#if FFN_WITH_CUDA
    return cuda::bias_glu_dropout(zc, bc, act, d, out);
#endif
  }
  cpu::bias_glu_dropout(zc, bc, act, d, out);
}

void dropout_dglu_dbias(const Tensor& dout, const Tensor& z, const Tensor& b, Activation act,
                        const DropoutSpec& d, Tensor& dz, Tensor* db, Tensor* out) {
  const char* op = "dropout_dglu_dbias";
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
#if FFN_WITH_CUDA
    return cuda::dropout_dglu_dbias(gc, zc, bc, act, d, dz, db, out);
#endif
  }
  cpu::dropout_dglu_dbias(gc, zc, bc, act, d, dz, db, out);
}

namespace cpu {

void bias_glu_dropout(const Tensor& z, const Tensor& b, Activation act, const DropoutSpec& d,
                      Tensor& out) {
  FFN_DISPATCH_FLOAT(z.dtype(), "bias_glu_dropout", [&]<class T>() {
    const int64_t m = z.size(0), h = z.size(1) / 2;
    const T* zp = z.data<T>();
    const T* bp = b.defined() ? b.data<T>() : nullptr;
    T* o = out.data<T>();
    MaskCursor mask(d);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < h; ++c) {
        const T v = zp[r * 2 * h + c] + (bp ? bp[c] : T(0));
        const T g = zp[r * 2 * h + h + c] + (bp ? bp[h + c] : T(0));
        const int64_t i = r * h + c;
        o[i] = v * act_math::value(g, act) * static_cast<T>(mask.factor(static_cast<uint64_t>(i)));
      }
  });
}

void dropout_dglu_dbias(const Tensor& dout, const Tensor& z, const Tensor& b, Activation act,
                        const DropoutSpec& d, Tensor& dz, Tensor* db, Tensor* out) {
  FFN_DISPATCH_FLOAT(z.dtype(), "dropout_dglu_dbias", [&]<class T>() {
    const int64_t m = z.size(0), h = z.size(1) / 2;
    const T* gp = dout.data<T>();
    const T* zp = z.data<T>();
    const T* bp = b.defined() ? b.data<T>() : nullptr;
    T* dzp = dz.data<T>();
    T* o = out ? out->data<T>() : nullptr;
    std::vector<double> acc(db ? 2 * h : 0, 0.0);
    MaskCursor mask(d);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < h; ++c) {
        const T v = zp[r * 2 * h + c] + (bp ? bp[c] : T(0));
        const T g = zp[r * 2 * h + h + c] + (bp ? bp[h + c] : T(0));
        const int64_t i = r * h + c;
        const T f = static_cast<T>(mask.factor(static_cast<uint64_t>(i)));
        const T s = gp[i] * f;
        T a, da;
        act_math::value_grad(g, act, a, da);
        const T dv = s * a, dg = s * v * da;
        dzp[r * 2 * h + c] = dv;
        dzp[r * 2 * h + h + c] = dg;
        if (o) o[i] = v * a * f;
        if (db) {
          acc[c] += static_cast<double>(dv);
          acc[h + c] += static_cast<double>(dg);
        }
      }
    if (db)
      for (int64_t c = 0; c < 2 * h; ++c) db->data<T>()[c] = static_cast<T>(acc[c]);
  });
}

}  // namespace cpu
}  // namespace ffn
