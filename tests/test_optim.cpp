// tests/test_optim.cpp — SGD against hand-computed steps.
#include "optim/sgd.h"
#include "tests/test_util.h"

using namespace ffn;

TEST_CASE("sgd step: plain, weight decay, momentum, nesterov") {
  auto vec = [](std::initializer_list<double> v) {
    return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, DType::f64);
  };
  // plain: w - lr g
  Tensor w = vec({1.0, -2.0});
  sgd_step(w, vec({0.5, 0.25}), nullptr, {.lr = 0.1}, true);
  CHECK(w.to_vector() == std::vector<double>{1.0 - 0.05, -2.0 - 0.025});
  // weight decay: g' = g + wd w
  w = vec({2.0});
  sgd_step(w, vec({1.0}), nullptr, {.lr = 0.5, .weight_decay = 0.1}, true);
  CHECK(w.item() == doctest::Approx(2.0 - 0.5 * (1.0 + 0.2)));
  // momentum: buf = g, then buf = m buf + g
  w = vec({0.0});
  Tensor buf = vec({0.0});
  const SgdHyper h{.lr = 1.0, .momentum = 0.9};
  sgd_step(w, vec({1.0}), &buf, h, true);
  CHECK(w.item() == doctest::Approx(-1.0));
  sgd_step(w, vec({1.0}), &buf, h, false);
  CHECK(buf.item() == doctest::Approx(1.9));
  CHECK(w.item() == doctest::Approx(-2.9));
  // nesterov: step = g + m buf
  w = vec({0.0});
  buf = vec({0.0});
  const SgdHyper hn{.lr = 1.0, .momentum = 0.5, .nesterov = true};
  sgd_step(w, vec({2.0}), &buf, hn, true);
  CHECK(w.item() == doctest::Approx(-(2.0 + 0.5 * 2.0)));
}

TEST_CASE("SGD optimizer updates parameters that have gradients") {
  Var a(Tensor::full({2}, 1.0, DType::f64), true), b(Tensor::full({2}, 1.0, DType::f64), true);
  SGD opt({a, b}, {.lr = 0.5});
  a.set_grad(Tensor::full({2}, 2.0, DType::f64));
  opt.step();
  CHECK(a.value().to_vector() == std::vector<double>{0.0, 0.0});
  CHECK(b.value().to_vector() == std::vector<double>{1.0, 1.0});  // no grad: untouched
  opt.zero_grad();
  CHECK(!a.grad().defined());
}

TEST_CASE("sgd rejects bad hyper-parameters and mismatched tensors") {
  Tensor w = Tensor::zeros({3}, DType::f64);
  CHECK_THROWS_WITH_AS(sgd_step(w, Tensor::zeros({4}, DType::f64), nullptr, {}, true),
                       doctest::Contains("[sgd] param.shape=[3] != grad.shape=[4]"), Error);
  CHECK_THROWS_WITH_AS(sgd_step(w, Tensor::zeros({3}, DType::f64), nullptr, {.lr = -1}, true),
                       doctest::Contains("[sgd] lr must be a finite number >= 0, got -1"), Error);
  CHECK_THROWS_WITH_AS(
      sgd_step(w, Tensor::zeros({3}, DType::f64), nullptr, {.momentum = 0.9}, true),
      doctest::Contains("needs a momentum buffer"), Error);
}

TEST_CASE("SGD keeps fp32 master weights for 16-bit parameters") {
  // 100 steps of -1e-4 on a weight of 1: each is far below bf16's spacing at 1 (2^-7),
  // so updating the bf16 value in place would never move it; the master accumulates.
  for (DType dt : {DType::bf16, DType::f16}) {
    Var w(Tensor::full({4}, 1.0, dt), true);
    SGD opt({w}, {.lr = 1e-4});
    for (int i = 0; i < 100; ++i) {
      w.set_grad(Tensor::full({4}, 1.0, dt));
      opt.step();
    }
    CHECK(w.value().dtype() == dt);
    CHECK(w.value().to_vector()[0] ==
          doctest::Approx(0.99).epsilon(0.004));  // 16-bit rounding of 0.99
    CHECK(w.value().to_vector()[0] < 1.0);
  }
}
