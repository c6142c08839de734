// tests/kernels/test_causal_softmax.cpp — the causal softmax with in-kernel dropout: the CPU
// reference against formulas and fp64 finite differences, its argument checks, and the CUDA kernels
// against the reference (FFN_GPU_TEST cases skip visibly without a GPU).
#include <algorithm>
#include <cmath>

#include "kernels/bias_act_dropout.h"
#include "kernels/causal_softmax.h"
#include "layers/functional.h"
#include "tests/kernels/kernel_tests.h"
#include "tests/test_util.h"

using namespace ffn;
using namespace ffn::test;

TEST_CASE("causal_softmax: rows sum to one over j <= i, zero above; dropout rescales") {
  Generator g(24);
  const Tensor s = rand64({2, 5, 5}, g, 3.0);
  Tensor p = Tensor::empty({2, 5, 5}, DType::f64), pd = Tensor::empty({2, 5, 5}, DType::f64);
  causal_softmax(s, 0.5, DropoutSpec{0.5f, 7, 3}, p, &pd);
  const auto pv = p.to_vector(), dv = pd.to_vector();
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < 5; ++i) {
      double sum = 0;
      for (int j = 0; j < 5; ++j) {
        const double v = pv[(b * 5 + i) * 5 + j];
        if (j > i) CHECK(v == 0.0);
        sum += v;
        const double d = dv[(b * 5 + i) * 5 + j];
        CHECK((d == 0.0 || d == doctest::Approx(2 * v)));
      }
      CHECK(sum == doctest::Approx(1.0).epsilon(1e-12));
    }
  // pd equals bias_dropout of p with the same spec (the attention backward relies on it).
  Tensor pd2 = Tensor::empty({10, 5}, DType::f64);
  ffn::bias_dropout(p.reshape({10, 5}), Tensor(), DropoutSpec{0.5f, 7, 3}, pd2);
  check_close(pd2.reshape({2, 5, 5}), pd, 0, 0, "pd == bias_dropout(p)");
  CHECK_THROWS_WITH_AS(causal_softmax(rand64({2, 5, 4}, g), 1.0, {}, p, nullptr),
                       doctest::Contains("[causal_softmax] s must be [B, T, T]"), Error);
}

FFN_GPU_TEST("causal_softmax on the GPU matches the CPU, dropout mask included") {
  Generator g(34);
  for (auto [b, t] : {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {2, 64}, {4, 256}})
    for (DType dt : {DType::f32, DType::bf16})
      for (float p : {0.0f, 0.2f}) {
        const DropoutSpec d{p, 5, 9};
        const Tensor s = rand64({b, t, t}, g, 4.0).to(dt).to(DType::f64);
        const Tensor dpd = rand64({b, t, t}, g).to(dt).to(DType::f64);
        auto run = [&](DType ty, Device dev) {
          Tensor pr = Tensor::empty({b, t, t}, ty, dev), pd = Tensor::empty({b, t, t}, ty, dev);
          causal_softmax(s.to(ty).to(dev), 0.125, d, pr, &pd);
          Tensor ds = Tensor::empty({b, t, t}, ty, dev);
          // The backward reads p in the tested precision; feed every path the same p.
          causal_softmax_backward(pr, dpd.to(ty).to(dev), 0.125, d, ds);
          return std::vector<Tensor>{pr, pd, ds};
        };
        const auto gpu = run(dt, kGpu), r64 = run(DType::f64, Device::cpu()),
                   r32 = run(DType::f32, Device::cpu());
        const std::string tag =
            " b=" + std::to_string(b) + " t=" + std::to_string(t) + " p=" + std::to_string(p);
        check_against_reference(
            gpu[0], r64[0], r32[0], dt, "softmax p" + tag,
            {.reduce_len = static_cast<double>(t), .term_bound = 4 * max_abs(r64[0])});
        // pd is p (as stored, rounded) times the mask scale: exactly what bias_dropout makes
        // of the GPU's p, which the attention backward relies on.
        Tensor pd2 = Tensor::empty({b * t, t}, dt, kGpu);
        bias_dropout(gpu[0].reshape({b * t, t}), Tensor(), d, pd2);
        check_close(gpu[1].to(Device::cpu()).to(DType::f64),
                    pd2.reshape({b, t, t}).to(Device::cpu()).to(DType::f64), 0, 0,
                    "softmax pd == bias_dropout(p)" + tag);
        // The mask itself: zero exactly where the CPU's is zero.
        const auto gv = gpu[1].to(Device::cpu()).to_vector(), cv = r64[1].to_vector();
        int64_t mismatched = 0;
        for (size_t i = 0; i < gv.size(); ++i) mismatched += (gv[i] == 0.0) != (cv[i] == 0.0);
        CHECK_MESSAGE(mismatched == 0, "dropout mask differs from the CPU's", tag);
        if (dt == DType::f32)  // bf16 backward inputs differ (p is rounded differently)
          check_against_reference(
              gpu[2], r64[2], r32[2], dt, "softmax ds" + tag,
              {.reduce_len = static_cast<double>(t),
               .term_bound =
                   4 * std::max(max_abs(r64[2]), t == 1 ? 0.125 * max_abs(dpd) * 1.25 : 0.0),
               .scale = t == 1 ? 0.125 * max_abs(dpd) * 1.25 : 0.0});
      }
}
