// tests/kernels/test_cross_entropy.cpp — the fused softmax cross-entropy: the CPU reference against
// formulas and fp64 finite differences, its argument checks, and the CUDA kernels against the
// reference (FFN_GPU_TEST cases skip visibly without a GPU).
#include <cmath>
#include <tuple>

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

TEST_CASE("cross_entropy with padding columns (classes < V) equals it on the classes alone") {
  Generator g(29);
  for (auto [n, v, c] : {std::tuple<int64_t, int64_t, int64_t>{3, 8, 5}, {7, 128, 65}, {1, 4, 1}}) {
    CAPTURE(v);
    CAPTURE(c);
    const Tensor padded = rand64({n, v}, g, 3.0);
    const Tensor plain = padded.narrow(1, 0, c).contiguous();
    const Tensor t = ids(n, c, 3);
    Tensor lp = Tensor::empty({}, DType::f64), sp = Tensor::empty({n}, DType::f64);
    Tensor l = Tensor::empty({}, DType::f64), sl = Tensor::empty({n}, DType::f64);
    cross_entropy(padded, t, lp, sp, true, c);
    cross_entropy(plain, t, l, sl);
    CHECK(lp.item() == l.item());
    CHECK(sp.to_vector() == sl.to_vector());
    const Tensor dl = Tensor::full({}, 0.7, DType::f64);
    Tensor dp = Tensor::full({n, v}, 9.0, DType::f64), d = Tensor::empty({n, c}, DType::f64);
    cross_entropy_backward(padded, t, sp, dl, dp, c);
    cross_entropy_backward(plain, t, sl, dl, d);
    CHECK(dp.narrow(1, 0, c).contiguous().to_vector() == d.to_vector());
    for (double x : dp.narrow(1, c, v - c).contiguous().to_vector()) CHECK(x == 0.0);
    gradcheck([&](const std::vector<Var>& in) { return fn::cross_entropy(in[0], t, true, c); },
              {padded}, {"padded logits"});
  }
  const Tensor logits = rand64({2, 6}, g);
  Tensor loss = Tensor::empty({}, DType::f64), lse = Tensor::empty({2}, DType::f64);
  // A target in the padding is out of range; classes beyond the columns is refused.
  CHECK_THROWS_WITH_AS(cross_entropy(logits, ids_of({0, 4}), loss, lse, true, 4),
                       doctest::Contains("[cross_entropy] targets[1]=4 is out of range [0, 4)"),
                       Error);
  CHECK_THROWS_WITH_AS(cross_entropy(logits, ids_of({0, 1}), loss, lse, true, 7),
                       doctest::Contains("[cross_entropy] classes=7 must be in [0, 6]"), Error);
}

FFN_GPU_TEST("cross_entropy with padding columns on the GPU matches the CPU") {
  Generator g(37);
  for (auto [n, v, c] : {std::tuple<int64_t, int64_t, int64_t>{5, 128, 65}, {33, 50304, 50257}})
    for (DType dt : {DType::f32, DType::bf16}) {
      CAPTURE(v);
      CAPTURE(dtype_name(dt));
      const Tensor logits = rand64({n, v}, g, 4.0).to(dt);
      const Tensor t = ids(n, c, 7);
      // The GPU in dt, the CPU in f32 on the same (rounded) values.
      auto run = [&](Device d, DType ty) {
        Tensor loss = Tensor::empty({}, DType::f32, d), lse = Tensor::empty({n}, DType::f32, d);
        const Tensor l = logits.to(ty).to(d);
        cross_entropy(l, t.to(d), loss, lse, true, c);
        Tensor dl = Tensor::full({n, v}, 5.0, ty, d);
        cross_entropy_backward(l, t.to(d), lse, Tensor::full({}, 1.0, DType::f32, d), dl, c);
        return std::vector<Tensor>{loss.reshape({1}).to(Device::cpu()), lse.to(Device::cpu()),
                                   dl.to(DType::f32).to(Device::cpu())};
      };
      const auto gpu = run(kGpu, dt), cpu = run(Device::cpu(), DType::f32);
      CHECK(gpu[0].item() == doctest::Approx(cpu[0].item()).epsilon(1e-5));
      CHECK(max_abs_diff(gpu[1], cpu[1]) <= 1e-4 * (1 + max_abs(cpu[1])));
      CHECK(max_abs_diff(gpu[2], cpu[2]) <= 1e-2 * max_abs(cpu[2]) + 1e-7);
      for (double x : gpu[2].narrow(1, c, v - c).contiguous().to_vector()) REQUIRE(x == 0.0);
    }
}

FFN_GPU_TEST("cross_entropy on the GPU matches the CPU; bad targets are errors") {
  Generator g(33);
  // Odd widths take the scalar path, widths of whole 16-byte vectors the vector path.
  for (auto [n, v] :
       {std::pair<int64_t, int64_t>{1, 1}, {7, 13}, {129, 65}, {64, 50257}, {33, 4096}})
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
