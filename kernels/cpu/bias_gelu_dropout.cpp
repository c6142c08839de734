// kernels/cpu/bias_gelu_dropout.cpp — front door and CPU reference of the fused FFN middle.
#include "kernels/bias_gelu_dropout.h"

#include <vector>

#include "core/dispatch.h"
#include "kernels/checks.h"
#include "kernels/cpu/mask.h"

namespace ffn {

Activation parse_activation(const std::string& s) {
  if (const auto a = value_of(kActivationNames, s)) return *a;
  FFN_THROW("[activation] unknown activation '", s, "' (expected ", names_list(kActivationNames),
            ")");
}

void bias_gelu_dropout(const Tensor& z, const Tensor& b, Activation act, const DropoutSpec& d,
                       Tensor& hd) {
  const char* op = "bias_gelu_dropout";
  detail::check_matrix(z, op, "z");
  detail::check_dropout(d, op);
  if (b.defined()) detail::check_like(b, z, {z.size(1)}, op, "b");
  detail::check_like(hd, z, z.shape(), op, "hd");
  const Tensor zc = z.contiguous(), bc = b.defined() ? b.contiguous() : b;
  if (z.is_cuda()) {
#if FFN_WITH_CUDA
    return cuda::bias_gelu_dropout(zc, bc, act, d, hd);
#endif
  }
  cpu::bias_gelu_dropout(zc, bc, act, d, hd);
}

void dropout_dgelu_dbias(const Tensor& dhd, const Tensor& z, const Tensor& b, Activation act,
                         const DropoutSpec& d, Tensor& dpre, Tensor* db, Tensor* hd) {
  const char* op = "dropout_dgelu_dbias";
  detail::check_matrix(z, op, "z");
  detail::check_dropout(d, op);
  detail::check_like(dhd, z, z.shape(), op, "dhd");
  if (b.defined()) detail::check_like(b, z, {z.size(1)}, op, "b");
  detail::check_like(dpre, z, z.shape(), op, "dpre");
  if (db) detail::check_like(*db, z, {z.size(1)}, op, "db");
  if (hd) detail::check_like(*hd, z, z.shape(), op, "hd");
  const Tensor zc = z.contiguous(), gc = dhd.contiguous(), bc = b.defined() ? b.contiguous() : b;
  if (z.is_cuda()) {
#if FFN_WITH_CUDA
    return cuda::dropout_dgelu_dbias(gc, zc, bc, act, d, dpre, db, hd);
#endif
  }
  cpu::dropout_dgelu_dbias(gc, zc, bc, act, d, dpre, db, hd);
}

namespace cpu {

void bias_gelu_dropout(const Tensor& z, const Tensor& b, Activation act, const DropoutSpec& d,
                       Tensor& hd) {
  FFN_DISPATCH_FLOAT(z.dtype(), "bias_gelu_dropout", [&]<class T>() {
    const int64_t m = z.size(0), n = z.size(1);
    const T* zp = z.data<T>();
    const T* bp = b.defined() ? b.data<T>() : nullptr;
    T* out = hd.data<T>();
    MaskCursor mask(d);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < n; ++c) {
        const int64_t i = r * n + c;
        const T pre = zp[i] + (bp ? bp[c] : T(0));
        out[i] = act_math::value(pre, act) * static_cast<T>(mask.factor(static_cast<uint64_t>(i)));
      }
  });
}

void dropout_dgelu_dbias(const Tensor& dhd, const Tensor& z, const Tensor& b, Activation act,
                         const DropoutSpec& d, Tensor& dpre, Tensor* db, Tensor* hd) {
  FFN_DISPATCH_FLOAT(z.dtype(), "dropout_dgelu_dbias", [&]<class T>() {
    const int64_t m = z.size(0), n = z.size(1);
    const T* g = dhd.data<T>();
    const T* zp = z.data<T>();
    const T* bp = b.defined() ? b.data<T>() : nullptr;
    T* dp = dpre.data<T>();
    T* hp = hd ? hd->data<T>() : nullptr;
    std::vector<double> acc(db ? n : 0, 0.0);
    MaskCursor mask(d);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < n; ++c) {
        const int64_t i = r * n + c;
        const T pre = zp[i] + (bp ? bp[c] : T(0));
        const T f = static_cast<T>(mask.factor(static_cast<uint64_t>(i)));
        T val, d;
        act_math::value_grad(pre, act, val, d);
        const T v = g[i] * f * d;
        dp[i] = v;
        if (hp) hp[i] = val * f;
        if (db) acc[c] += static_cast<double>(v);
      }
    if (db)
      for (int64_t c = 0; c < n; ++c) db->data<T>()[c] = static_cast<T>(acc[c]);
  });
}

}  // namespace cpu
}  // namespace ffn
