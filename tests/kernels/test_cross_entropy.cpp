// tests/kernels/test_cross_entropy.cpp — the fused softmax cross-entropy: the CPU reference against
// formulas and fp64 finite differences, its argument checks, and the CUDA kernels against the
// reference (FFN_GPU_TEST cases skip visibly without a GPU).
#include <cmath>
#include <tuple>

#include "kernels/cross_entropy.h"
#include "kernels/gemm.h"
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

// ---- the fused classifier's pieces (Note [Fused classifier]) --------------------------------

TEST_CASE(
    "cross_entropy_rows equals cross_entropy and its backward, in place; mean_rows, scale_by") {
  Generator g(41);
  for (auto [n, v, c] : {std::tuple<int64_t, int64_t, int64_t>{3, 8, 5}, {7, 13, 13}, {1, 1, 1}}) {
    CAPTURE(v);
    const Tensor logits = rand64({n, v}, g, 3.0);
    const Tensor t = ids(n, c, 11);
    Tensor loss = Tensor::empty({}, DType::f64), lse = Tensor::empty({n}, DType::f64);
    cross_entropy(logits, t, loss, lse, true, c);
    Tensor d = Tensor::empty({n, v}, DType::f64);
    cross_entropy_backward(logits, t, lse, Tensor::full({}, 0.3 * n, DType::f64), d, c);
    Tensor inout = logits.clone(), rows = Tensor::empty({n}, DType::f64);
    cross_entropy_rows(inout, t, rows, true, c);  // no gradient: the logits stay
    CHECK(inout.to_vector() == logits.to_vector());
    cross_entropy_rows(inout, t, rows, true, c, 0.3);
    check_close(inout, d, 1e-15, 1e-12, "in-place gradient");
    Tensor mean = Tensor::empty({}, DType::f64);
    mean_rows(rows, mean);
    CHECK(mean.item() == doctest::Approx(loss.item()).epsilon(1e-13));
    Tensor scaled = Tensor::empty({n, v}, DType::f64);
    scale_by(d, Tensor::full({}, -2.5, DType::f64), scaled);
    const auto dv = d.to_vector(), sv = scaled.to_vector();
    for (size_t i = 0; i < dv.size(); ++i) REQUIRE(sv[i] == -2.5 * dv[i]);
  }
  Tensor logits = rand64({2, 6}, g), rows = Tensor::empty({2}, DType::f64);
  CHECK_THROWS_WITH_AS(
      cross_entropy_rows(logits, ids_of({0, 4}), rows, true, 4),
      doctest::Contains("[cross_entropy_rows] targets[1]=4 is out of range [0, 4)"), Error);
  Tensor f32rows = Tensor::empty({2}, DType::f32);
  CHECK_THROWS_WITH_AS(cross_entropy_rows(logits, ids_of({0, 1}), f32rows, true, 0),
                       doctest::Contains("[cross_entropy_rows] row_loss must be f64"), Error);
  Tensor y = Tensor::empty({2, 6}, DType::f64);
  CHECK_THROWS_WITH_AS(scale_by(logits, Tensor::full({2}, 1.0, DType::f64), y),
                       doctest::Contains("[scale_by] s must be one f64 value"), Error);
}

// The loss, dx and dw of linear_cross_entropy against cross_entropy(linear(x, w)).
static void check_fused_classifier(int64_t n, int64_t d, int64_t v, int64_t c, int64_t chunk,
                                   Generator& g) {
  CAPTURE(n);
  CAPTURE(v);
  CAPTURE(chunk);
  const Tensor x0 = rand64({n, d}, g), w0 = rand64({v, d}, g, 2.0);
  const Tensor t = ids(n, c, 5);
  const Tensor seed = Tensor::full({}, 1.7, DType::f64);
  Var x1(x0.clone(), true), w1(w0.clone(), true), x2(x0.clone(), true), w2(w0.clone(), true);
  const Var ref = fn::cross_entropy(fn::linear(x1, w1, Var()), t, true, c);
  const Var got = fn::linear_cross_entropy(x2, w2, t, true, c, chunk);
  CHECK(got.value().item() == doctest::Approx(ref.value().item()).epsilon(1e-13));
  ref.backward(seed);
  got.backward(seed);
  check_close(x2.grad(), x1.grad(), 1e-14, 1e-11, "dx");
  check_close(w2.grad(), w1.grad(), 1e-14, 1e-11, "dw");
}

TEST_CASE("linear_cross_entropy equals cross_entropy(linear) in any chunking; FD checks; errors") {
  Generator g(43);
  for (int64_t chunk : {0, 1, 3, 7, 100}) check_fused_classifier(7, 5, 11, 11, chunk, g);
  check_fused_classifier(10, 4, 16, 13, 4, g);  // padding columns, a short last chunk
  for (int64_t chunk : {0, 3}) {
    const Tensor t = ids(7, 9, 3);
    gradcheck(
        [&](const std::vector<Var>& in) {
          return fn::linear_cross_entropy(in[0], in[1], t, true, 9, chunk);
        },
        {rand64({7, 6}, g), rand64({12, 6}, g)}, {"x", "w"});
  }
  {  // without grad mode it is the loss alone, and records nothing
    NoGradGuard ng;
    Var x(rand64({3, 2, 4}, g), true), w(rand64({5, 4}, g), true);
    const Tensor t = Tensor::from_vector({0, 1, 2, 3, 4, 0}, {3, 2}, DType::i32);
    const Var l = fn::linear_cross_entropy(x, w, t, true, 0, 4);
    CHECK(!l.grad_fn());
    CHECK(l.value().item() ==
          doctest::Approx(fn::cross_entropy(fn::linear(x, w, Var()), t).value().item())
              .epsilon(1e-13));
  }
  const Var x(rand64({3, 4}, g)), w(rand64({5, 4}, g));
  CHECK_THROWS_WITH_AS(
      fn::linear_cross_entropy(x, w, ids_of({0, 5, 1})),
      doctest::Contains("[linear_cross_entropy] targets[1]=5 is out of range [0, 5)"), Error);
  CHECK_THROWS_WITH_AS(
      fn::linear_cross_entropy(x, w, ids_of({0, 4, 1}), true, 4),
      doctest::Contains("[linear_cross_entropy] targets[1]=4 is out of range [0, 4)"), Error);
  CHECK_THROWS_WITH_AS(fn::linear_cross_entropy(x, w, ids_of({0, 1})),
                       doctest::Contains("[linear_cross_entropy] targets.shape=[2] does not match"),
                       Error);
  CHECK_THROWS_WITH_AS(fn::linear_cross_entropy(x, Var(rand64({5, 3}, g)), ids_of({0, 1, 2})),
                       doctest::Contains("[linear_cross_entropy] x.shape[-1]=4 != the weight's"),
                       Error);
  CHECK_THROWS_WITH_AS(fn::linear_cross_entropy(x, w, ids_of({0, 1, 2}), true, 6),
                       doctest::Contains("[linear_cross_entropy] classes=6 must be in [0, 5]"),
                       Error);
  CHECK_THROWS_WITH_AS(fn::linear_cross_entropy(x, w, ids_of({0, 1, 2}), true, 0, -1),
                       doctest::Contains("[linear_cross_entropy] chunk_rows must be >= 0"), Error);
}

FFN_GPU_TEST("cross_entropy_rows on the GPU matches the CPU: vector, scalar, staged, global rows") {
  Generator g(47);
  // (n, v, c): odd widths take the scalar path; GPT-2's padded row is staged in shared
  // memory; rows wider than shared memory (bf16 120000, f32 60000) are read from global.
  for (auto [n, v, c] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1},
                         {7, 13, 13},
                         {5, 128, 65},
                         {33, 50304, 50257},
                         {3, 60000, 59999},
                         {2, 120000, 120000}})
    for (DType dt : {DType::f32, DType::bf16})
      for (bool grad : {false, true}) {
        CAPTURE(v);
        CAPTURE(dtype_name(dt));
        CAPTURE(grad);
        const Tensor logits = rand64({n, v}, g, 4.0).to(dt).to(DType::f64);
        const Tensor t = ids(n, c, 9);
        const double scale = 1.0 / static_cast<double>(n);
        auto run = [&](DType ty, Device d) {
          const DType ad = acc_dtype(ty);
          Tensor l = logits.to(ty).to(d), rows = Tensor::full({n}, 7.0, ad, d);
          cross_entropy_rows(l, t.to(d), rows, true, c,
                             grad ? std::optional<double>(scale) : std::nullopt);
          return std::vector<Tensor>{rows, l};
        };
        const auto gpu = run(dt, kGpu), r64 = run(DType::f64, Device::cpu()),
                   r32 = run(DType::f32, Device::cpu());
        // A row loss is lse - x_t, a difference of terms as large as the logits (|x| ≤ 4);
        // a gradient entry is at most `scale`.
        check_against_reference(gpu[0], r64[0], r32[0], DType::f32, "row losses",
                                {.reduce_len = static_cast<double>(c),
                                 .term_bound = 4 * max_abs(r64[0]),
                                 .scale = 4.0});
        if (grad) {
          check_against_reference(gpu[1], r64[1], r32[1], dt, "in-place gradient",
                                  {.reduce_len = static_cast<double>(c),
                                   .term_bound = 4 * max_abs(r64[1]),
                                   .scale = scale});
          if (c < v)
            for (double x : gpu[1].to(Device::cpu()).narrow(1, c, v - c).contiguous().to_vector())
              REQUIRE(x == 0.0);
        } else {
          REQUIRE(gpu[1].to(Device::cpu()).to(DType::f64).to_vector() == logits.to_vector());
        }
      }
  // mean_rows and scale_by (f32 → bf16, in place).
  const Tensor r = rand64({1000}, g, 3.0);
  Tensor m = Tensor::empty({}, DType::f32, kGpu);
  mean_rows(r.to(DType::f32).to(kGpu), m);
  double sum = 0;
  for (double x : r.to(DType::f32).to_vector()) sum += x;
  CHECK(m.item() == doctest::Approx(sum / 1000).epsilon(1e-6));
  const Tensor x = rand64({37, 3}, g).to(DType::f32);
  Tensor y = Tensor::empty({37, 3}, DType::bf16, kGpu);
  scale_by(x.to(kGpu), Tensor::full({}, 0.5, DType::f32, kGpu), y);
  const auto xv = x.to_vector(), yv = y.to(DType::f64).to(Device::cpu()).to_vector();
  for (size_t i = 0; i < xv.size(); ++i)
    REQUIRE(yv[i] == Tensor::full({}, 0.5 * xv[i], DType::bf16).to(DType::f64).item());
  // In place (the classifier's dx): a factor of 1 keeps the bits, 0.5 halves every entry.
  scale_by(y, Tensor::full({}, 1.0, DType::f32, kGpu), y);
  CHECK(y.to(DType::f64).to(Device::cpu()).to_vector() == yv);
  scale_by(y, Tensor::full({}, 0.5, DType::f32, kGpu), y);
  const auto hv = y.to(DType::f64).to(Device::cpu()).to_vector();
  for (size_t i = 0; i < yv.size(); ++i) REQUIRE(hv[i] == 0.5 * yv[i]);
}

FFN_GPU_TEST("linear_cross_entropy on the GPU (bf16) matches the reference in any chunking") {
  Generator g(53);
  const int64_t n = 37, d = 64, v = 1024, c = 1000;
  const Tensor x64 = exact(rand64({n, d}, g), DType::bf16),
               w64 = exact(rand64({v, d}, g), DType::bf16);
  const Tensor t = ids(n, c, 13);
  auto run = [&](DType dt, Device dev, int64_t chunk) {
    Var x(x64.to(dt).to(dev), true), w(w64.to(dt).to(dev), true);
    const Var l = fn::linear_cross_entropy(x, w, t.to(dev), true, c, chunk);
    l.backward(Tensor::full({}, 2.0, acc_dtype(dt), dev));
    return std::vector<Tensor>{l.value().reshape({1}).to(Device::cpu()),
                               x.grad().to(DType::f64).to(Device::cpu()),
                               w.grad().to(DType::f64).to(Device::cpu())};
  };
  const auto r64 = run(DType::f64, Device::cpu(), 0);
  // The same math done naively in bf16: f32 on the CPU, with the logits and their gradient
  // rounded to bf16 where the GPU stores them.
  auto bf16_round = [](const Tensor& a) { return a.to(DType::bf16).to(DType::f32); };
  std::vector<Tensor> r32(3);
  {
    const Tensor x32 = x64.to(DType::f32), w32 = w64.to(DType::f32);
    Tensor logits = bf16_round(matmul(x32, w32, {.trans_b = true}));
    Tensor rows = Tensor::empty({n}, DType::f32), loss = Tensor::empty({}, DType::f32);
    cross_entropy_rows(logits, t, rows, true, c, 2.0 / static_cast<double>(n));
    mean_rows(rows, loss);
    const Tensor dl = bf16_round(logits);
    r32 = {loss.reshape({1}), bf16_round(matmul(dl, w32)).to(DType::f64),
           bf16_round(matmul(dl, x32, {.trans_a = true})).to(DType::f64)};
  }
  for (int64_t chunk : {0, 5, 16}) {
    CAPTURE(chunk);
    const auto got = run(DType::bf16, kGpu, chunk);
    check_against_reference(got[0], r64[0], r32[0], DType::f32, "loss",
                            {.reduce_len = static_cast<double>(n * c), .term_bound = 8});
    check_against_reference(got[1], r64[1], r32[1], DType::bf16, "dx",
                            {.reduce_len = static_cast<double>(v), .term_bound = 2.0 / n});
    check_against_reference(got[2], r64[2], r32[2], DType::bf16, "dw",
                            {.reduce_len = static_cast<double>(n), .term_bound = 2.0 / n});
    // Deterministic: a second run is bitwise the same.
    const auto again = run(DType::bf16, kGpu, chunk);
    for (int i = 0; i < 3; ++i) CHECK(again[i].to_vector() == got[i].to_vector());
  }
  // The f32 output GEMM that sums dw: bf16 a and b, f32 c, beta = 1.
  const Tensor a = exact(rand64({33, 70}, g), DType::bf16),
               b = exact(rand64({33, 9}, g), DType::bf16);
  Tensor cg = Tensor::full({70, 9}, 0.25, DType::f32, kGpu);
  gemm(a.to(DType::bf16).to(kGpu), b.to(DType::bf16).to(kGpu), cg, {.trans_a = true, .beta = 1.0});
  Tensor ref = Tensor::full({70, 9}, 0.25, DType::f64);
  gemm(a, b, ref, {.trans_a = true, .beta = 1.0});
  check_close(cg.to(Device::cpu()).to(DType::f64), ref, 1e-5, 1e-5, "f32-output gemm");
  Tensor bias_out = Tensor::empty({70, 9}, DType::f32, kGpu);
  CHECK_THROWS_WITH_AS(gemm(a.to(DType::bf16).to(kGpu), b.to(DType::bf16).to(kGpu), bias_out,
                            {.trans_a = true, .bias = Tensor::zeros({9}, DType::f32, kGpu)}),
                       doctest::Contains("[gemm] an f32 c for bf16 a and b needs the GPU, no bias"),
                       Error);
}
