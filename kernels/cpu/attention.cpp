// kernels/cpu/attention.cpp — the CPU reference of kernels/attention.h (plain loops or Eigen,
// sums in f64): what the CPU runs, and the yardstick the CUDA kernels are tested against.
// Plain loops in f64, one (batch, head, query) row at a time: not a fast CPU path (the layer
// uses the composite bmm + causal_softmax path on the CPU).
#include "kernels/attention.h"

#include <cmath>
#include <limits>
#include <vector>

#include "core/dispatch.h"
#include "kernels/checks.h"

namespace ffn {

namespace cpu {

namespace {

struct Dims {  // qkv is [b, t, 3·h·d]
  int64_t b, t, h, d;
};

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
