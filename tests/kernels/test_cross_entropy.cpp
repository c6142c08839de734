// tests/kernels/test_cross_entropy.cpp — the fused softmax cross-entropy: the CPU reference against
// formulas and fp64 finite differences, its argument checks, and the CUDA kernels against the
// reference (FFN_GPU_TEST cases skip visibly without a GPU).
#include <cmath>

#include "kernels/cross_entropy.h"
#include "layers/functional.h"
#include "tests/kernels/kernel_tests.h"
#include "tests/test_util.h"

using namespace ffn;
using namespace ffn::test;

TEST_CASE("cross_entropy matches -log softmax, passes FD checks, rejects bad targets") {
  Generator g(23);
  const Tensor logits = rand64({3, 4}, g, 3.0);
  const Tensor t = ids_of({2, 0, 3});
  Tensor loss = Tensor::empty({}, DType::f64), lse = Tensor::empty({3}, DType::f64);
  cross_entropy(logits, t, loss, lse);
  const auto lv = logits.to_vector();
  double expect = 0;
  for (int i = 0; i < 3; ++i) {
    double s = 0;
    for (int j = 0; j < 4; ++j) s += std::exp(lv[i * 4 + j]);
    expect += std::log(s) - lv[i * 4 + static_cast<int>(t.to_vector()[i])];
  }
  CHECK(loss.item() == doctest::Approx(expect / 3).epsilon(1e-12));
  for (const Shape& s : {Shape{1, 1}, Shape{7, 13}, Shape{129, 257}, Shape{2, 3, 5}}) {
    std::vector<double> tv;
    const int64_t rows = shape_numel(s) / s.back();
    for (int64_t i = 0; i < rows; ++i) tv.push_back(static_cast<double>((i * 7) % s.back()));
    Shape ts(s.begin(), s.end() - 1);
    const Tensor targets = Tensor::from_vector(tv, ts, DType::i32);
    gradcheck([&](const std::vector<Var>& in) { return fn::cross_entropy(in[0], targets); },
              {rand64(s, g, 2.0)}, {"logits"});
  }
  CHECK_THROWS_WITH_AS(cross_entropy(logits, ids_of({2, 4, 0}), loss, lse),
                       doctest::Contains("[cross_entropy] targets[1]=4 is out of range [0, 4)"),
                       Error);
  CHECK_THROWS_WITH_AS(fn::cross_entropy(Var(logits), ids_of({1, 2})),
                       doctest::Contains("[cross_entropy] targets.shape=[2] does not match"),
                       Error);
}

FFN_GPU_TEST("cross_entropy on the GPU matches the CPU; bad targets are errors") {
  Generator g(33);
  for (auto [n, v] : {std::pair<int64_t, int64_t>{1, 1}, {7, 13}, {129, 65}, {64, 50257}})
    for (DType dt : {DType::f32, DType::bf16}) {
      const Tensor logits = rand64({n, v}, g, 4.0).to(dt).to(DType::f64);
      const Tensor t = ids(n, v, 5);
      auto run = [&](DType ty, Device d) {
        const DType ad = acc_dtype(ty);
        Tensor loss = Tensor::empty({}, ad, d), lse = Tensor::empty({n}, ad, d);
        cross_entropy(logits.to(ty).to(d), t.to(d), loss, lse);
        Tensor dl = Tensor::empty({n, v}, ty, d);
        cross_entropy_backward(logits.to(ty).to(d), t.to(d), lse, Tensor::full({}, 1.5, ad, d), dl);
        return std::vector<Tensor>{loss.reshape({1}), lse, dl};
      };
      const auto gpu = run(dt, kGpu), r64 = run(DType::f64, Device::cpu()),
                 r32 = run(DType::f32, Device::cpu());
      // loss/lse are fp32 on the GPU for every input dtype: compare as f32 results.
      check_against_reference(
          gpu[0], r64[0], r32[0], DType::f32, "xent loss",
          {.reduce_len = static_cast<double>(n * v), .term_bound = 4 * max_abs(r64[0])});
      check_against_reference(
          gpu[1], r64[1], r32[1], DType::f32, "xent lse",
          {.reduce_len = static_cast<double>(v), .term_bound = 4 * max_abs(r64[1])});
      check_against_reference(
          gpu[2], r64[2], r32[2], dt, "xent d_logits",
          {.reduce_len = static_cast<double>(v), .term_bound = 4 * max_abs(r64[2])});
    }
  const Tensor logits = Tensor::zeros({2, 4}, DType::bf16, kGpu);
  Tensor loss = Tensor::empty({}, DType::f32, kGpu), lse = Tensor::empty({2}, DType::f32, kGpu);
  CHECK_THROWS_WITH_AS(
      cross_entropy(logits, Tensor::from_vector({0, 4}, {2}, DType::i32, kGpu), loss, lse),
      doctest::Contains("[cross_entropy] targets[1]=4 is out of range [0, 4)"), Error);
}
