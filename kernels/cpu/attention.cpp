// kernels/cpu/attention.cpp — front door and CPU reference of the fused causal attention
// (kernels/attention.h). The reference is plain loops in f64, one (batch, head, query) row
// at a time; it is the yardstick for the CUDA kernels, not a fast CPU path (the layer uses
// the composite bmm + causal_softmax path on the CPU).
#include "kernels/attention.h"

#include <cmath>
#include <limits>
#include <vector>

#include "core/dispatch.h"
#include "kernels/checks.h"

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
#if FFN_WITH_CUDA
  return cuda::fused_attention_supported(dt, t, head_dim);
#else
  (void)dt, (void)t, (void)head_dim;
  return false;
#endif
}

bool fused_attention_preferred(DType dt, int64_t t, int64_t head_dim) {
#if FFN_WITH_CUDA
  return cuda::fused_attention_preferred(dt, t, head_dim);
#else
  (void)dt, (void)t, (void)head_dim;
  return false;
#endif
}

void fused_attention(const Tensor& qkv, int64_t heads, double scale, const DropoutSpec& d,
                     Tensor& y, Tensor& lse) {
  const char* op = "fused_attention";
  const Dims s = check_qkv(qkv, heads, scale, d, op);
  detail::check_like(y, qkv, {s.b, s.t, s.h * s.d}, op, "y");
  check_lse(lse, qkv, s, op);
  const Tensor x = qkv.contiguous();
  if (qkv.is_cuda()) {
#if FFN_WITH_CUDA
    return cuda::fused_attention(x, heads, scale, d, y, lse);
#endif
  }
  cpu::fused_attention(x, heads, scale, d, y, lse);
}

void fused_attention_backward(const Tensor& qkv, const Tensor& y, const Tensor& dy,
                              const Tensor& lse, int64_t heads, double scale, const DropoutSpec& d,
                              Tensor& dqkv) {
  const char* op = "fused_attention_backward";
  const Dims s = check_qkv(qkv, heads, scale, d, op);
  const Shape out{s.b, s.t, s.h * s.d};
  for (auto [t, name] : {std::pair<const Tensor*, const char*>{&y, "y"}, {&dy, "dy"}}) {
    check_defined(*t, op, name);
    check_shape(*t, out, op, name);
    check_same_dtype(*t, qkv, op, name, "qkv");
    check_same_device(*t, qkv, op, name, "qkv");
  }
  check_lse(lse, qkv, s, op);
  detail::check_like(dqkv, qkv, qkv.shape(), op, "dqkv");
  const Tensor x = qkv.contiguous(), g = dy.contiguous();
  if (qkv.is_cuda()) {
#if FFN_WITH_CUDA
    return cuda::fused_attention_backward(x, y.contiguous(), g, lse, heads, scale, d, dqkv);
#endif
  }
  cpu::fused_attention_backward(x, g, heads, scale, d, dqkv);
}

namespace cpu {

namespace {

// One (b, h, i) row of the forward math in f64: p (before dropout) and the mask factors.
struct Row {
  std::vector<double> p, f;
  double lse = 0;
};

template <class T>
Row attention_row(const T* x, int64_t b, int64_t h, int64_t i, const Dims& s, double scale,
                  const DropoutSpec& d) {
  const int64_t ld = 3 * s.h * s.d;
  const T* q = x + (b * s.t + i) * ld + h * s.d;
  Row r;
  r.p.resize(static_cast<size_t>(i + 1));
  r.f.resize(static_cast<size_t>(i + 1));
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j <= i; ++j) {
    const T* k = x + (b * s.t + j) * ld + (s.h + h) * s.d;
    double dot = 0;
    for (int64_t c = 0; c < s.d; ++c) dot += static_cast<double>(q[c]) * static_cast<double>(k[c]);
    r.p[j] = scale * dot;
    mx = std::max(mx, r.p[j]);
  }
  double sum = 0;
  for (double& v : r.p) sum += (v = std::exp(v - mx));
  for (double& v : r.p) v /= sum;
  r.lse = mx + std::log(sum);
  const uint64_t e0 = static_cast<uint64_t>(((b * s.h + h) * s.t + i) * s.t);
  for (int64_t j = 0; j <= i; ++j) r.f[j] = d.active() ? (d.keep(e0 + j) ? d.scale() : 0.0) : 1.0;
  return r;
}

}  // namespace

void fused_attention(const Tensor& qkv, int64_t heads, double scale, const DropoutSpec& d,
                     Tensor& y, Tensor& lse) {
  const Dims s{qkv.size(0), qkv.size(1), heads, qkv.size(2) / (3 * heads)};
  FFN_DISPATCH_FLOAT(qkv.dtype(), "fused_attention", [&]<class T>() {
    const T* x = qkv.data<T>();
    T* out = y.data<T>();
    float* l = lse.data<float>();
    const int64_t ld = 3 * s.h * s.d;
    for (int64_t b = 0; b < s.b; ++b)
      for (int64_t h = 0; h < s.h; ++h)
        for (int64_t i = 0; i < s.t; ++i) {
          const Row r = attention_row(x, b, h, i, s, scale, d);
          l[(b * s.h + h) * s.t + i] = static_cast<float>(r.lse);
          T* yi = out + (b * s.t + i) * s.h * s.d + h * s.d;
          for (int64_t c = 0; c < s.d; ++c) {
            double acc = 0;
            for (int64_t j = 0; j <= i; ++j)
              acc += r.p[j] * r.f[j] *
                     static_cast<double>(x[(b * s.t + j) * ld + (2 * s.h + h) * s.d + c]);
            yi[c] = static_cast<T>(acc);
          }
        }
  });
}

void fused_attention_backward(const Tensor& qkv, const Tensor& dy, int64_t heads, double scale,
                              const DropoutSpec& d, Tensor& dqkv) {
  const Dims s{qkv.size(0), qkv.size(1), heads, qkv.size(2) / (3 * heads)};
  FFN_DISPATCH_FLOAT(qkv.dtype(), "fused_attention_backward", [&]<class T>() {
    const T* x = qkv.data<T>();
    const T* g = dy.data<T>();
    const int64_t ld = 3 * s.h * s.d;
    std::vector<double> acc(static_cast<size_t>(qkv.numel()), 0.0);
    auto at = [&](int64_t b, int64_t j, int64_t which, int64_t h) {
      return (b * s.t + j) * ld + (which * s.h + h) * s.d;
    };
    for (int64_t b = 0; b < s.b; ++b)
      for (int64_t h = 0; h < s.h; ++h)
        for (int64_t i = 0; i < s.t; ++i) {
          const Row r = attention_row(x, b, h, i, s, scale, d);
          const T* gi = g + (b * s.t + i) * s.h * s.d + h * s.d;
          std::vector<double> dpd(static_cast<size_t>(i + 1));
          double dsum = 0;  // Σ_j pd_ij dpd_ij
          for (int64_t j = 0; j <= i; ++j) {
            const T* v = x + at(b, j, 2, h);
            double dot = 0;
            for (int64_t c = 0; c < s.d; ++c)
              dot += static_cast<double>(gi[c]) * static_cast<double>(v[c]);
            dpd[j] = dot;
            dsum += r.p[j] * r.f[j] * dot;
          }
          for (int64_t j = 0; j <= i; ++j) {
            const double ds = r.p[j] * (dpd[j] * r.f[j] - dsum);
            const double pd = r.p[j] * r.f[j];
            for (int64_t c = 0; c < s.d; ++c) {
              acc[at(b, i, 0, h) + c] += scale * ds * static_cast<double>(x[at(b, j, 1, h) + c]);
              acc[at(b, j, 1, h) + c] += scale * ds * static_cast<double>(x[at(b, i, 0, h) + c]);
              acc[at(b, j, 2, h) + c] += pd * static_cast<double>(gi[c]);
            }
          }
        }
    T* out = dqkv.data<T>();
    for (size_t k = 0; k < acc.size(); ++k) out[k] = static_cast<T>(acc[k]);
  });
}

}  // namespace cpu

}  // namespace ffn
