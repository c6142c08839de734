// tests/kernels/test_layer_norm.cpp — LayerNorm forward/backward, mixed precision included: the CPU
// reference against formulas and fp64 finite differences, its argument checks, and the CUDA kernels
// against the reference (FFN_GPU_TEST cases skip visibly without a GPU).
#include <algorithm>
#include <cmath>

#include "kernels/bias_act_dropout.h"
#include "kernels/dropout_add.h"
#include "kernels/layer_norm.h"
#include "kernels/scale.h"
#include "layers/functional.h"
#include "tests/kernels/kernel_tests.h"
#include "tests/test_util.h"

using namespace ffn;
using namespace ffn::test;

TEST_CASE("layer_norm matches its formula and passes FD checks (x, w, b)") {
  Generator g(22);
  for (const Shape& s : {Shape{1, 1}, Shape{7, 13}, Shape{129, 257}, Shape{3, 5, 7}}) {
    const int64_t c = s.back();
    gradcheck([&](const std::vector<Var>& in) { return fn::layer_norm(in[0], in[1], in[2], 1e-5); },
              {rand64(s, g, 2.0), rand64({c}, g), rand64({c}, g)}, {"x", "w", "b"});
  }
  // Without bias, and the statistics in the forward.
  const Tensor x = rand64({4, 6}, g, 3.0), w = rand64({6}, g);
  gradcheck([&](const std::vector<Var>& in) { return fn::layer_norm(in[0], in[1], Var(), 1e-5); },
            {x, w}, {"x", "w"});
  Tensor y = Tensor::empty({4, 6}, DType::f64), mean = Tensor::empty({4}, DType::f64),
         rstd = Tensor::empty({4}, DType::f64);
  layer_norm(x, w, Tensor(), 1e-5, y, mean, rstd);
  const auto xv = x.to_vector();
  double mu = 0, var = 0;
  for (int j = 0; j < 6; ++j) mu += xv[j] / 6;
  for (int j = 0; j < 6; ++j) var += (xv[j] - mu) * (xv[j] - mu) / 6;
  CHECK(mean.to_vector()[0] == doctest::Approx(mu).epsilon(1e-12));
  CHECK(rstd.to_vector()[0] == doctest::Approx(1 / std::sqrt(var + 1e-5)).epsilon(1e-12));
  Tensor bad_mean = Tensor::empty({4}, DType::f32);
  CHECK_THROWS_WITH_AS(layer_norm(x, w, Tensor(), 1e-5, y, bad_mean, rstd),
                       doctest::Contains("[layer_norm] mean must be f64, got f32"), Error);
  CHECK_THROWS_WITH_AS(layer_norm(x, rand64({5}, g), Tensor(), 1e-5, y, mean, rstd),
                       doctest::Contains("[layer_norm] w.shape=[5] but expected [6]"), Error);
}

TEST_CASE("layer_norm backward can add dx into a sum; autograd does so for a residual stream") {
  Generator g(40);
  const Tensor x = rand64({5, 9}, g, 2.0), w = rand64({9}, g), dy = rand64({5, 9}, g);
  Tensor y = Tensor::empty({5, 9}, DType::f64), mean = Tensor::empty({5}, DType::f64),
         rstd = Tensor::empty({5}, DType::f64);
  layer_norm(x, w, Tensor(), 1e-5, y, mean, rstd);
  Tensor dx = Tensor::empty({5, 9}, DType::f64);
  layer_norm_backward(dy, x, w, mean, rstd, &dx, nullptr, nullptr);
  const Tensor prev = rand64({5, 9}, g);
  Tensor sum = prev.clone();
  layer_norm_backward(dy, x, w, mean, rstd, &sum, nullptr, nullptr, /*accumulate_dx=*/true);
  const auto sv = sum.to_vector(), pv = prev.to_vector(), dv = dx.to_vector();
  for (size_t i = 0; i < sv.size(); ++i)
    CHECK(sv[i] == doctest::Approx(pv[i] + dv[i]).epsilon(1e-14));
  CHECK_THROWS_WITH_AS(
      layer_norm_backward(dy, x, w, mean, rstd, nullptr, nullptr, nullptr, true),
      doctest::Contains("[layer_norm_backward] accumulate_dx needs a contiguous dx"), Error);
  // h feeds both the residual add and the LayerNorm: the add's gradient reaches h's sum
  // first and the LayerNorm adds into it (Note [Accumulating backward]).
  gradcheck(
      [&](const std::vector<Var>& in) {
        const Var h = fn::add(in[0], in[0]);
        return fn::add(h, fn::layer_norm(h, in[1], in[2], 1e-5));
      },
      {rand64({3, 4, 7}, g, 2.0), rand64({7}, g), rand64({7}, g)}, {"x", "w", "b"});
}

// C % 8 == 0 up to 1024 with 16-bit w takes the one-pass backward kernel (several 64-row
// blocks at 130 and 200 rows); the rest the per-row kernel + column sums.
FFN_GPU_TEST("layer_norm on the GPU matches the CPU (forward, dx, dw, db, dx added to a sum)") {
  Generator g(32);
  for (auto [m, c] : {std::pair<int64_t, int64_t>{1, 1},
                      {37, 3},
                      {5, 7},
                      {33, 1600},
                      {9, 4097},
                      {64, 384},
                      {0, 8},
                      {3, 8},
                      {200, 1000},
                      {130, 768}})
    for (DType dt : {DType::f32, DType::bf16}) {
      const Tensor x = rand64({m, c}, g, 3.0).to(dt).to(DType::f64);
      const Tensor w = rand64({c}, g).to(dt).to(DType::f64);
      const Tensor b = rand64({c}, g).to(dt).to(DType::f64);
      const Tensor dy = rand64({m, c}, g).to(dt).to(DType::f64);
      const Tensor prev = rand64({m, c}, g).to(dt).to(DType::f64);
      auto run = [&](DType t, Device d) {
        const DType sd = acc_dtype(t);
        Tensor y = Tensor::empty({m, c}, t, d), mu = Tensor::empty({m}, sd, d),
               rs = Tensor::empty({m}, sd, d);
        layer_norm(x.to(t).to(d), w.to(t).to(d), b.to(t).to(d), 1e-5, y, mu, rs);
        Tensor dx = Tensor::empty({m, c}, t, d), dw = Tensor::empty({c}, t, d),
               db = Tensor::empty({c}, t, d);
        // The backward reads the forward's statistics (each in its own precision).
        layer_norm_backward(dy.to(t).to(d), x.to(t).to(d), w.to(t).to(d), mu, rs, &dx, &dw, &db);
        // dx added to a sum already there (as autograd does for the residual stream).
        Tensor sum = prev.to(t).to(d);
        layer_norm_backward(dy.to(t).to(d), x.to(t).to(d), w.to(t).to(d), mu, rs, &sum, nullptr,
                            nullptr, /*accumulate_dx=*/true);
        return std::vector<Tensor>{y, dx, dw, db, sum};
      };
      const auto gpu = run(dt, kGpu), r64 = run(DType::f64, Device::cpu()),
                 r32 = run(DType::f32, Device::cpu());
      const char* names[] = {"y", "dx", "dw", "db", "prev + dx"};
      // dx's terms are rstd·dy·w; rstd is 1/√eps when a row is constant (C = 1).
      const double dx_terms = m ? max_abs(dy) * max_abs(w) / std::sqrt(1e-5) : 0.0;
      for (int i = 0; i < 5; ++i)
        check_against_reference(
            gpu[i], r64[i], r32[i], dt,
            std::string("layer_norm ") + names[i] + " " + std::to_string(m) + "x" +
                std::to_string(c),
            {.reduce_len = i == 2 || i == 3 ? static_cast<double>(m) : static_cast<double>(c),
             .term_bound =
                 4 * std::max(max_abs(r64[i]), (i == 1 || i == 4) && c == 1 ? dx_terms : 0.0),
             .scale = (i == 1 || i == 4) && c == 1 ? dx_terms : 0.0});
    }
}

FFN_GPU_TEST("mixed-precision LayerNorm (fp32 x, bf16 w/y) and residual add on the GPU") {
  Generator g(37);
  for (int64_t c : {7, 384})
    for (int64_t m : {5, 130}) {
      const Tensor x = rand64({m, c}, g, 3.0);  // fp32 stream: rounded to f32 only
      const Tensor w = rand64({c}, g).to(DType::bf16).to(DType::f64);
      const Tensor b = rand64({c}, g).to(DType::bf16).to(DType::f64);
      const Tensor dy = rand64({m, c}, g).to(DType::bf16).to(DType::f64);
      const Tensor x32 = x.to(DType::f32).to(DType::f64);
      Tensor y = Tensor::empty({m, c}, DType::bf16, kGpu),
             mu = Tensor::empty({m}, DType::f32, kGpu), rs = Tensor::empty({m}, DType::f32, kGpu);
      layer_norm(x.to(DType::f32).to(kGpu), w.to(DType::bf16).to(kGpu), b.to(DType::bf16).to(kGpu),
                 1e-5, y, mu, rs);
      Tensor dx = Tensor::empty({m, c}, DType::f32, kGpu),
             dw = Tensor::empty({c}, DType::bf16, kGpu), db = Tensor::empty({c}, DType::bf16, kGpu);
      layer_norm_backward(dy.to(DType::bf16).to(kGpu), x.to(DType::f32).to(kGpu),
                          w.to(DType::bf16).to(kGpu), mu, rs, &dx, &dw, &db);
      auto ref = [&](DType t) {
        const DType sd = acc_dtype(t);
        Tensor ry = Tensor::empty({m, c}, t), rm = Tensor::empty({m}, sd),
               rr = Tensor::empty({m}, sd);
        layer_norm(x32.to(t), w.to(t), b.to(t), 1e-5, ry, rm, rr);
        Tensor rdx = Tensor::empty({m, c}, t), rdw = Tensor::empty({c}, t),
               rdb = Tensor::empty({c}, t);
        layer_norm_backward(dy.to(t), x32.to(t), w.to(t), rm, rr, &rdx, &rdw, &rdb);
        return std::vector<Tensor>{ry, rdx, rdw, rdb};
      };
      const auto r64 = ref(DType::f64), r32 = ref(DType::f32);
      // (Built with append: gcc 12's -Wrestrict misfires on " " + std::to_string(...).)
      std::string tag(" ");
      tag.append(std::to_string(m)).append("x").append(std::to_string(c));
      check_against_reference(
          y, r64[0], r32[0], DType::bf16, "mixed ln y" + tag,
          {.reduce_len = static_cast<double>(c), .term_bound = 4 * max_abs(r64[0])});
      check_against_reference(
          dx, r64[1], r32[1], DType::f32, "mixed ln dx (fp32)" + tag,
          {.reduce_len = static_cast<double>(c), .term_bound = 4 * max_abs(r64[1])});
      check_against_reference(
          dw, r64[2], r32[2], DType::bf16, "mixed ln dw" + tag,
          {.reduce_len = static_cast<double>(m), .term_bound = 4 * max_abs(r64[2])});
      check_against_reference(
          db, r64[3], r32[3], DType::bf16, "mixed ln db" + tag,
          {.reduce_len = static_cast<double>(m), .term_bound = 4 * max_abs(r64[3])});
    }
  // fp32 + bf16 residual add: fp32 out; each gradient in its input's dtype.
  Var a(Tensor::full({4}, 1.0, DType::f32, kGpu), true),
      h(Tensor::full({4}, 0.5, DType::bf16, kGpu), true);
  Var s = fn::add(a, h);
  CHECK(s.value().dtype() == DType::f32);
  s.backward(Tensor::full({4}, 2.0, DType::f32, kGpu));
  CHECK(a.grad().dtype() == DType::f32);
  CHECK(h.grad().dtype() == DType::bf16);
  CHECK(h.grad().to_vector() == std::vector<double>{2, 2, 2, 2});
}

TEST_CASE("rms_norm matches its formula and passes FD checks (x, w); bad inputs are named") {
  Generator g(24);
  for (const Shape& s : {Shape{1, 1}, Shape{7, 13}, Shape{129, 257}, Shape{3, 5, 7}}) {
    const int64_t c = s.back();
    gradcheck([&](const std::vector<Var>& in) { return fn::rms_norm(in[0], in[1], 1e-6); },
              {rand64(s, g, 2.0), rand64({c}, g)}, {"x", "w"});
  }
  const Tensor x = rand64({4, 6}, g, 3.0), w = rand64({6}, g);
  Tensor y = Tensor::empty({4, 6}, DType::f64), rstd = Tensor::empty({4}, DType::f64);
  rms_norm(x, w, 1e-6, y, rstd);
  const auto xv = x.to_vector(), wv = w.to_vector(), yv = y.to_vector();
  double ms = 0;
  for (int j = 0; j < 6; ++j) ms += xv[j] * xv[j] / 6;
  const double r = 1 / std::sqrt(ms + 1e-6);
  CHECK(rstd.to_vector()[0] == doctest::Approx(r).epsilon(1e-12));
  for (int j = 0; j < 6; ++j) CHECK(yv[j] == doctest::Approx(xv[j] * r * wv[j]).epsilon(1e-12));
  // dx added into a sum, as for LayerNorm.
  const Tensor dy = rand64({4, 6}, g), prev = rand64({4, 6}, g);
  Tensor dx = Tensor::empty({4, 6}, DType::f64), sum = prev.clone();
  rms_norm_backward(dy, x, w, rstd, &dx, nullptr);
  rms_norm_backward(dy, x, w, rstd, &sum, nullptr, /*accumulate_dx=*/true);
  const auto sv = sum.to_vector(), pv = prev.to_vector(), dv = dx.to_vector();
  for (size_t i = 0; i < sv.size(); ++i)
    CHECK(sv[i] == doctest::Approx(pv[i] + dv[i]).epsilon(1e-14));
  CHECK_THROWS_WITH_AS(rms_norm(x, w, 0.0, y, rstd),
                       doctest::Contains("[rms_norm] eps must be > 0, got 0"), Error);
  CHECK_THROWS_WITH_AS(rms_norm(x, rand64({5}, g), 1e-6, y, rstd),
                       doctest::Contains("[rms_norm] w.shape=[5] but expected [6]"), Error);
  Tensor bad = Tensor::empty({3}, DType::f64);
  CHECK_THROWS_WITH_AS(rms_norm_backward(dy, x, w, bad, &dx, nullptr),
                       doctest::Contains("[rms_norm_backward] rstd"), Error);
}

// kernels/layer_norm.h's prescaled backward (Note [RMSNorm folded into the QKV GEMM]): given
// rstd ⊙ dy it gives the plain backward's dx and dw; and a forward without y writes the same
// statistics (and a) as with it.
TEST_CASE("rms_norm: the prescaled backward and the statistics-only forward equal the plain ones") {
  Generator g(25);
  for (const Shape& s : {Shape{1, 1}, Shape{7, 13}, Shape{129, 257}}) {
    const int64_t m = s[0], c = s[1];
    const Tensor x = rand64(s, g, 2.0), w = rand64({c}, g), dy = rand64(s, g);
    Tensor y = Tensor::empty(s, DType::f64), rstd = Tensor::empty({m}, DType::f64);
    rms_norm(x, w, 1e-6, y, rstd);
    Tensor none, rstd2 = Tensor::empty({m}, DType::f64);
    rms_norm(x, w, 1e-6, none, rstd2);
    CHECK(max_abs_diff(rstd2, rstd) == 0.0);
    Tensor dys = Tensor::empty(s, DType::f64);
    scale_rows(dy, rstd, dys);
    Tensor dx = Tensor::empty(s, DType::f64), dw = Tensor::empty({c}, DType::f64);
    Tensor dx2 = Tensor::empty(s, DType::f64), dw2 = Tensor::empty({c}, DType::f64);
    rms_norm_backward(dy, x, w, rstd, &dx, &dw);
    rms_norm_backward(dys, x, w, rstd, &dx2, &dw2, false, nullptr, /*prescaled=*/true);
    CHECK_MESSAGE(max_abs_diff(dx2, dx) <= 1e-13 * std::max(1.0, max_abs(dx)), shape_str(s));
    CHECK_MESSAGE(max_abs_diff(dw2, dw) <= 1e-13 * std::max(1.0, max_abs(dw)), shape_str(s));
    // The add before it: a and rstd as with y.
    const Tensor res = rand64(s, g), h = rand64(s, g);
    const DropoutSpec d{0.25f, 5, 2};
    Tensor a = Tensor::empty(s, DType::f64), a2 = Tensor::empty(s, DType::f64), no_mean;
    add_layer_norm(res, h, d, w, Tensor(), 1e-6, a, y, no_mean, rstd);
    add_layer_norm(res, h, d, w, Tensor(), 1e-6, a2, none, no_mean, rstd2);
    CHECK(max_abs_diff(a2, a) == 0.0);
    CHECK(max_abs_diff(rstd2, rstd) == 0.0);
  }
}

FFN_GPU_TEST("rms_norm on the GPU: the prescaled backward and the statistics-only forward") {
  // Against the f64 CPU given the same (16-bit) inputs, the fused one-pass kernel (C % 8 == 0
  // up to 1024) and the per-row kernel; and the forward without y gives the forward's rstd
  // and a bit for bit.
  Generator g(35);
  for (auto [m, c] : {std::pair<int64_t, int64_t>{37, 3}, {64, 384}, {200, 1000}, {9, 4097}})
    for (DType dt : {DType::f32, DType::bf16}) {
      const Tensor x = rand64({m, c}, g, 3.0).to(dt).to(DType::f64);
      const Tensor w = rand64({c}, g).to(dt).to(DType::f64);
      const DType sd = acc_dtype(dt);
      auto run = [&](DType t, Device d) {
        Tensor y = Tensor::empty({m, c}, t, d), rs = Tensor::empty({m}, acc_dtype(t), d);
        rms_norm(x.to(t).to(d), w.to(t).to(d), 1e-6, y, rs);
        return rs;
      };
      const Tensor rs_gpu = run(dt, kGpu);
      // dy prescaled on the CPU from the GPU's rstd, rounded to dt: the input as a GEMM makes it.
      const Tensor dys = rand64({m, c}, g).to(dt).to(DType::f64);
      auto back = [&](DType t, Device d, const Tensor& rs) {
        Tensor dx = Tensor::empty({m, c}, t, d), dw = Tensor::empty({c}, t, d);
        rms_norm_backward(dys.to(t).to(d), x.to(t).to(d), w.to(t).to(d), rs.to(d), &dx, &dw, false,
                          nullptr, /*prescaled=*/true);
        return std::vector<Tensor>{dx, dw};
      };
      const auto gpu = back(dt, kGpu, rs_gpu);
      const auto r64 = back(DType::f64, Device::cpu(), rs_gpu.to(Device::cpu()).to(DType::f64));
      const auto r32 = back(DType::f32, Device::cpu(), rs_gpu.to(Device::cpu()).to(DType::f32));
      const char* names[] = {"dx", "dw"};
      for (int i = 0; i < 2; ++i) {
        std::string what("prescaled rms_norm_backward ");
        what.append(names[i])
            .append(" ")
            .append(dtype_name(dt))
            .append(" ")
            .append(std::to_string(m))
            .append("x")
            .append(std::to_string(c));
        check_against_reference(
            gpu[i], r64[i], r32[i], dt, what,
            {.reduce_len = static_cast<double>(i == 1 ? m : c), .term_bound = 4 * max_abs(r64[i])});
      }
      Tensor none, rs2 = Tensor::empty({m}, sd, kGpu);
      rms_norm(x.to(dt).to(kGpu), w.to(dt).to(kGpu), 1e-6, none, rs2);
      CHECK(max_abs_diff(rs2.to(Device::cpu()), rs_gpu.to(Device::cpu())) == 0.0);
      if (dt != DType::bf16) continue;
      const Tensor res = rand64({m, c}, g).to(dt), h = rand64({m, c}, g).to(dt);
      const DropoutSpec d{0.25f, 5, 2};
      Tensor a = Tensor::empty({m, c}, dt, kGpu), a2 = Tensor::empty({m, c}, dt, kGpu), no_mean;
      Tensor y = Tensor::empty({m, c}, dt, kGpu), rs3 = Tensor::empty({m}, sd, kGpu);
      add_layer_norm(res.to(kGpu), h.to(kGpu), d, w.to(dt).to(kGpu), Tensor(), 1e-6, a, y, no_mean,
                     rs2);
      add_layer_norm(res.to(kGpu), h.to(kGpu), d, w.to(dt).to(kGpu), Tensor(), 1e-6, a2, none,
                     no_mean, rs3);
      CHECK(max_abs_diff(a2.to(Device::cpu()).to(DType::f64), a.to(Device::cpu()).to(DType::f64)) ==
            0.0);
      CHECK(max_abs_diff(rs3.to(Device::cpu()), rs2.to(Device::cpu())) == 0.0);
    }
}

// The same shapes as LayerNorm's: the one-pass backward kernel (C % 8 == 0 up to 1024, 16-bit
// w) and the per-row kernel + column sums; fp32 x with bf16 w (the residual stream) too.
FFN_GPU_TEST("rms_norm on the GPU matches the CPU (forward, dx, dw, mixed precision)") {
  Generator g(34);
  for (auto [m, c] : {std::pair<int64_t, int64_t>{1, 1},
                      {37, 3},
                      {33, 1600},
                      {9, 4097},
                      {64, 384},
                      {0, 8},
                      {200, 1000},
                      {130, 768}})
    for (DType dt : {DType::f32, DType::bf16})
      for (bool mixed : {false, true}) {
        if (mixed && dt == DType::f32) continue;
        const DType xt = mixed ? DType::f32 : dt;  // x's dtype on the GPU
        const Tensor x = rand64({m, c}, g, 3.0).to(xt).to(DType::f64);
        const Tensor w = rand64({c}, g).to(dt).to(DType::f64);
        const Tensor dy = rand64({m, c}, g).to(dt).to(DType::f64);
        auto run = [&](DType t, DType tx, Device d) {
          const DType sd = acc_dtype(t);
          Tensor y = Tensor::empty({m, c}, t, d), rs = Tensor::empty({m}, sd, d);
          rms_norm(x.to(tx).to(d), w.to(t).to(d), 1e-6, y, rs);
          Tensor dx = Tensor::empty({m, c}, tx, d), dw = Tensor::empty({c}, t, d);
          rms_norm_backward(dy.to(t).to(d), x.to(tx).to(d), w.to(t).to(d), rs, &dx, &dw);
          return std::vector<Tensor>{y, dx, dw};
        };
        const auto gpu = run(dt, xt, kGpu), r64 = run(DType::f64, DType::f64, Device::cpu()),
                   r32 = run(DType::f32, DType::f32, Device::cpu());
        const char* names[] = {"y", "dx", "dw"};
        const DType out_dt[] = {dt, xt, dt};
        const double dx_terms = m ? max_abs(dy) * max_abs(w) / std::sqrt(1e-6) : 0.0;
        for (int i = 0; i < 3; ++i) {
          std::string what("rms_norm ");
          what.append(names[i]).append(" ").append(std::to_string(m)).append("x").append(
              std::to_string(c));
          if (mixed) what.append(" (fp32 x)");
          check_against_reference(
              gpu[i], r64[i], r32[i], out_dt[i], what,
              {.reduce_len = i == 2 ? static_cast<double>(m) : static_cast<double>(c),
               .term_bound = 4 * std::max(max_abs(r64[i]), i == 1 && c == 1 ? dx_terms : 0.0),
               .scale = i == 1 && c == 1 ? dx_terms : 0.0});
        }
      }
}

// Note [Residual add and norm]: add_layer_norm equals dropout_add then the norm, and the
// norm's backward with a BranchGrad equals its plain backward then dropout_add_backward;
// fn::add_layer_norm's gradients pass FD checks, also when `a` has a third user, a second
// norm (one of the two norms then adds into an unfinished sum and must leave the branch
// gradient to the add: autograd's sums_final).
namespace {
struct AddNormOut {
  Tensor a, y, mean, rstd, dx, dh, dh_sum;
};
// The fused pair (fused = true) or the separate ops, forward and backward with dx added to a
// prior sum (as autograd does for the residual stream). rms: RMSNorm (no mean, no bias).
AddNormOut add_norm_run(bool fused, bool rms, const Tensor& x, const Tensor& h, const Tensor& w,
                        const Tensor& b, const Tensor& dy, const Tensor& prev,
                        const DropoutSpec& d) {
  const int64_t m = x.size(0), c = x.size(1);
  const Device dev = x.device();
  const DType sd = acc_dtype(x.dtype());
  AddNormOut o;
  o.a = Tensor::empty({m, c}, x.dtype(), dev);
  o.y = Tensor::empty({m, c}, w.dtype(), dev);
  o.mean = rms ? Tensor() : Tensor::empty({m}, sd, dev);
  o.rstd = Tensor::empty({m}, sd, dev);
  const Tensor bb = rms ? Tensor() : b;
  if (fused) {
    add_layer_norm(x, h, d, w, bb, 1e-5, o.a, o.y, o.mean, o.rstd);
  } else {
    dropout_add(x, h, d, o.a);
    if (rms)
      rms_norm(o.a, w, 1e-5, o.y, o.rstd);
    else
      layer_norm(o.a, w, bb, 1e-5, o.y, o.mean, o.rstd);
  }
  o.dx = prev.clone();
  o.dh = Tensor::empty({m, c}, h.dtype(), dev);
  o.dh_sum = Tensor::empty({c}, w.dtype(), dev);
  const BranchGrad branch{&o.dh, d, &o.dh_sum};
  const BranchGrad* br = fused ? &branch : nullptr;
  if (rms)
    rms_norm_backward(dy, o.a, w, o.rstd, &o.dx, nullptr, true, br);
  else
    layer_norm_backward(dy, o.a, w, o.mean, o.rstd, &o.dx, nullptr, nullptr, true, br);
  if (!fused) dropout_add_backward(o.dx, d, o.dh);
  if (!fused) bias_grad(o.dh, o.dh_sum);
  return o;
}
}  // namespace

TEST_CASE("add_layer_norm and the branch gradient equal the separate ops; FD through autograd") {
  Generator g(41);
  for (bool rms : {false, true})
    for (float p : {0.0f, 0.3f}) {
      const DropoutSpec d{p, 9, 3};
      const Tensor x = rand64({6, 10}, g, 2.0), h = rand64({6, 10}, g), w = rand64({10}, g);
      const Tensor b = rand64({10}, g), dy = rand64({6, 10}, g), prev = rand64({6, 10}, g);
      const AddNormOut f = add_norm_run(true, rms, x, h, w, b, dy, prev, d);
      const AddNormOut s = add_norm_run(false, rms, x, h, w, b, dy, prev, d);
      CHECK(max_abs_diff(f.a, s.a) == 0.0);
      CHECK(max_abs_diff(f.y, s.y) == 0.0);
      CHECK(max_abs_diff(f.dx, s.dx) == 0.0);
      CHECK(max_abs_diff(f.dh, s.dh) == 0.0);
      CHECK(max_abs_diff(f.dh_sum, s.dh_sum) == 0.0);  // the CPU sums dh with bias_grad
      // Autograd: a = x + dropout(h) feeds the norm and the next residual add (the block's
      // shape), and in the second graph also a product that runs after the norm.
      for (bool third_user : {false, true}) {
        std::vector<Tensor> inputs{rand64({2, 3, 8}, g, 2.0), rand64({2, 3, 8}, g), rand64({8}, g)};
        std::vector<std::string> names{"x", "h", "w"};
        if (!rms) inputs.push_back(rand64({8}, g)), names.push_back("b");
        gradcheck(
            [&](const std::vector<Var>& in) {
              const auto [a, y] =
                  fn::add_layer_norm(in[0], in[1], d, in[2], rms ? Var() : in[3], 1e-5, rms);
              Var out = fn::dropout_add(a, y, {});
              if (third_user) out = fn::add(out, fn::layer_norm(a, in[2], Var(), 1e-5));
              return out;
            },
            inputs, names);
      }
    }
  const Tensor x = rand64({2, 4}, g), w = rand64({4}, g);
  Tensor a = Tensor::empty({2, 4}, DType::f64), y = a.clone(),
         rstd = Tensor::empty({2}, DType::f64);
  Tensor no_mean;
  CHECK_THROWS_WITH_AS(add_layer_norm(x, x, {}, w, w, 1e-5, a, y, no_mean, rstd),
                       doctest::Contains("[add_rms_norm] RMSNorm (no mean) takes no bias"), Error);
  Tensor mean = Tensor::empty({2}, DType::f64), short_h = rand64({2, 3}, g);
  CHECK_THROWS_WITH_AS(add_layer_norm(x, short_h, {}, w, Tensor(), 1e-5, a, y, mean, rstd),
                       doctest::Contains("[add_layer_norm] h"), Error);
  Tensor dh = a.clone();
  const BranchGrad branch{&dh, {}};
  CHECK_THROWS_WITH_AS(
      layer_norm_backward(x, x, w, mean, rstd, nullptr, nullptr, nullptr, false, &branch),
      doctest::Contains("[layer_norm_backward] the branch gradient needs dx and dh"), Error);
}

// Note [Branch bias gradient]: the Linear that makes h takes its bias gradient from the
// norm's backward; FD checks catch a wrong hand-over, also when h has a second user whose
// gradient the engine sums with dh (downstream, or upstream: feeding the add's other input,
// where its gradient lands in dh's own buffer after the add has run). a_use: how the add's
// output a is used besides the norm: 0 by the next residual add (the norm's dx adds into
// that sum), 1 not at all (the last block's add before the final norm: dx is written fresh
// and is the add's whole gradient), 2 and 3 by a Linear whose gradient the engine sums
// after or before the norm's (the norm must not hand dh over where dx is not final).
TEST_CASE(
    "the branch's bias gradient from the norm's backward passes FD checks, h with other users") {
  Generator g(43);
  for (int a_use : {0, 1, 2, 3})
    for (int user : {0, 1, 2})
      for (float p : {0.0f, 0.3f}) {
        const DropoutSpec d{p, 11, 5};
        std::vector<Tensor> inputs{rand64({2, 3, 4}, g), rand64({8, 4}, g), rand64({8}, g),
                                   rand64({2, 3, 8}, g), rand64({8}, g),    rand64({8}, g)};
        std::vector<std::string> names{"x", "w", "b", "res", "ln_w", "ln_b"};
        if (user > 0) inputs.push_back(rand64({8, 8}, g)), names.push_back("w2");
        const size_t w3 = inputs.size();
        if (a_use >= 2) inputs.push_back(rand64({8, 8}, g)), names.push_back("w3");
        gradcheck(
            [&](const std::vector<Var>& in) {
              const Var h = fn::linear(in[0], in[1], in[2]);
              Var res = in[3];
              if (user == 2) res = fn::add(res, fn::linear(h, in[6], Var()));
              const auto [a, y] = fn::add_layer_norm(res, h, d, in[4], in[5], 1e-5, false);
              Var out = a_use == 0   ? fn::dropout_add(a, y, {})
                        : a_use == 1 ? y
                        : a_use == 2 ? fn::add(y, fn::linear(a, in[w3], Var()))
                                     : fn::add(fn::linear(a, in[w3], Var()), y);
              if (user == 1) out = fn::add(out, fn::linear(h, in[6], Var()));
              return out;
            },
            inputs, names);
      }
}

// The GPU's fused kernels (C % 8 == 0, C <= 1024: one pass) and the general path (C = 7: the
// add and the branch gradient as passes of their own) against the same ops run apart on the
// GPU, bit for bit; fp32 stream with bf16 h, w, y, dy, dh. dh's column sums (Note [Branch bias
// gradient]): in the fused kernel up to C = 768, summed over its 64-row blocks (another order
// than bias_grad's), so within bf16's rounding of the exact sum of dh and the same bits run
// after run; above 768 and on the general path bias_grad's own, bit for bit.
FFN_GPU_TEST("add_layer_norm and the branch gradient on the GPU equal the separate kernels") {
  Generator g(42);
  for (bool rms : {false, true})
    for (int64_t c : {7, 384, 768, 1024})
      for (float p : {0.0f, 0.2f}) {
        const int64_t m = 130;
        const DropoutSpec d{p, 5, 77};
        const Tensor x = rand64({m, c}, g, 2.0).to(DType::f32).to(kGpu);
        const Tensor h = rand64({m, c}, g).to(DType::bf16).to(kGpu);
        const Tensor w = rand64({c}, g).to(DType::bf16).to(kGpu);
        const Tensor b = rand64({c}, g).to(DType::bf16).to(kGpu);
        const Tensor dy = rand64({m, c}, g).to(DType::bf16).to(kGpu);
        const Tensor prev = rand64({m, c}, g).to(DType::f32).to(kGpu);
        const AddNormOut f = add_norm_run(true, rms, x, h, w, b, dy, prev, d);
        const AddNormOut s = add_norm_run(false, rms, x, h, w, b, dy, prev, d);
        std::string tag(rms ? "rms " : "ln ");
        tag.append(std::to_string(c)).append(" p").append(std::to_string(p));
        CHECK_MESSAGE(max_abs_diff(f.a, s.a) == 0.0, tag, ": a");
        CHECK_MESSAGE(max_abs_diff(f.y, s.y) == 0.0, tag, ": y");
        CHECK_MESSAGE(max_abs_diff(f.rstd, s.rstd) == 0.0, tag, ": rstd");
        CHECK_MESSAGE(max_abs_diff(f.dx, s.dx) == 0.0, tag, ": dx");
        CHECK_MESSAGE(max_abs_diff(f.dh, s.dh) == 0.0, tag, ": dh");
        if (c % 8 != 0 || c > 768) {
          CHECK_MESSAGE(max_abs_diff(f.dh_sum, s.dh_sum) == 0.0, tag, ": dh_sum");
        } else {
          const std::vector<double> dhv = s.dh.to_vector(), got = f.dh_sum.to_vector();
          for (int64_t j = 0; j < c; ++j) {
            double sum = 0.0, mag = 0.0;
            for (int64_t r = 0; r < m; ++r) sum += dhv[r * c + j], mag += std::abs(dhv[r * c + j]);
            // bf16's rounding of the result, plus fp32 accumulation over m terms
            CHECK_MESSAGE(std::abs(got[j] - sum) <= std::ldexp(std::abs(sum), -8) + 1e-5 * mag, tag,
                          ": dh_sum column ", j, " ", got[j], " vs ", sum);
          }
          const AddNormOut again = add_norm_run(true, rms, x, h, w, b, dy, prev, d);
          CHECK_MESSAGE(max_abs_diff(again.dh_sum, f.dh_sum) == 0.0, tag, ": dh_sum run to run");
        }
      }
}
