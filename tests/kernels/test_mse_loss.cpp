// tests/kernels/test_mse_loss.cpp — the MSE loss (and the SGD step on the GPU): the CPU reference
// against formulas and fp64 finite differences, its argument checks, and the CUDA kernels against
// the reference (FFN_GPU_TEST cases skip visibly without a GPU).
#include <cmath>

#include "kernels/mse_loss.h"
#include "kernels/sgd.h"
#include "layers/functional.h"
#include "tests/kernels/kernel_tests.h"
#include "tests/test_util.h"

using namespace ffn;
using namespace ffn::test;

TEST_CASE("mse_loss value and gradient") {
  Generator g(7);
  const Tensor p = rand64({5, 3}, g), t = rand64({5, 3}, g);
  Tensor loss = Tensor::empty({}, DType::f64);
  mse_loss(p, t, loss);
  const auto pv = p.to_vector(), tv = t.to_vector();
  double s = 0;
  for (size_t i = 0; i < pv.size(); ++i) s += (pv[i] - tv[i]) * (pv[i] - tv[i]);
  CHECK(loss.item() == doctest::Approx(s / 15).epsilon(1e-14));
  gradcheck([&](const std::vector<Var>& v) { return fn::mse_loss(v[0], t); }, {p}, {"pred"});
  CHECK_THROWS_WITH_AS(mse_loss(p, Tensor::zeros({3, 5}, DType::f64), loss),
                       doctest::Contains("[mse_loss] pred.shape=[5, 3] != target.shape=[3, 5]"),
                       Error);
}

FFN_GPU_TEST("mse_loss and sgd on the GPU match the CPU reference") {
  Generator g(55);
  const Tensor p = rand64({300, 7}, g), t = rand64({300, 7}, g);
  Tensor l64 = Tensor::empty({}, DType::f64), lg = Tensor::empty({}, DType::f32, kGpu);
  mse_loss(p, t, l64);
  mse_loss(p.to(DType::f32).to(kGpu), t.to(DType::f32).to(kGpu), lg);
  CHECK(lg.item() == doctest::Approx(l64.item()).epsilon(1e-6));
  Tensor gg = Tensor::empty({300, 7}, DType::f32, kGpu), g64 = Tensor::empty({300, 7}, DType::f64);
  mse_loss_backward(p, t, Tensor::full({}, 1.5, DType::f64), g64);
  mse_loss_backward(p.to(DType::f32).to(kGpu), t.to(DType::f32).to(kGpu),
                    Tensor::full({}, 1.5, DType::f32, kGpu), gg);
  check_close(gg, g64, 1e-7, 1e-5, "mse grad");
  const SgdHyper h{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true};
  Tensor w = rand64({1000}, g).to(DType::f32), grad = rand64({1000}, g).to(DType::f32);
  Tensor buf = Tensor::zeros({1000}, DType::f32);
  Tensor wg = w.to(kGpu), bufg = buf.to(kGpu);
  const Tensor gradg = grad.to(kGpu);
  for (int s = 0; s < 3; ++s) {
    sgd_step(w, grad, &buf, h, s == 0);
    sgd_step(wg, gradg, &bufg, h, s == 0);
  }
  check_close(wg, w, 1e-7, 1e-6, "sgd w");
  check_close(bufg, buf, 1e-7, 1e-6, "sgd momentum");
}
