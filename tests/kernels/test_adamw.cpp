// tests/kernels/test_adamw.cpp — the fused AdamW step, the global gradient norm and the step
// decision: the CPU reference against formulas and fp64 finite differences, its argument checks,
// and the CUDA kernels against the reference (FFN_GPU_TEST cases skip visibly without a GPU).
#include <cmath>

#include "kernels/adamw.h"
#include "tests/kernels/kernel_tests.h"
#include "tests/test_util.h"

using namespace ffn;
using namespace ffn::test;

TEST_CASE("adamw_step follows PyTorch's AdamW for two steps; decay only where asked") {
  const AdamWHyper h{0.1, 0.9, 0.99, 1e-8, 0.5};
  AdamWSlot s;
  s.param = Tensor::from_vector({1.0, -2.0}, {2}, DType::f64);
  s.grad = Tensor::from_vector({0.5, 0.25}, {2}, DType::f64);
  s.m = Tensor::zeros({2}, DType::f64);
  s.v = Tensor::zeros({2}, DType::f64);
  s.decay = true;
  AdamWSlot nd = s;
  nd.param = s.param.clone();
  nd.m = Tensor::zeros({2}, DType::f64);
  nd.v = Tensor::zeros({2}, DType::f64);
  nd.decay = false;
  // Reference in plain doubles (grad_scale 2 doubles the gradient).
  double w[2] = {1.0, -2.0}, wn[2] = {1.0, -2.0}, m[2] = {0, 0}, v[2] = {0, 0}, mn[2] = {0, 0},
         vn[2] = {0, 0};
  const double gsrc[2] = {1.0, 0.5};
  for (int step = 1; step <= 2; ++step) {
    adamw_step({s, nd}, h, step, 2.0);
    for (int i = 0; i < 2; ++i) {
      auto upd = [&](double& wi, double& mi, double& vi, double wd) {
        wi *= 1 - h.lr * wd;
        mi = 0.9 * mi + 0.1 * gsrc[i];
        vi = 0.99 * vi + 0.01 * gsrc[i] * gsrc[i];
        wi -= h.lr * (mi / (1 - std::pow(0.9, step))) /
              (std::sqrt(vi / (1 - std::pow(0.99, step))) + 1e-8);
      };
      upd(w[i], m[i], v[i], 0.5);
      upd(wn[i], mn[i], vn[i], 0.0);
    }
  }
  check_close(s.param, Tensor::from_vector({w[0], w[1]}, {2}, DType::f64), 1e-14, 1e-12, "decay");
  check_close(nd.param, Tensor::from_vector({wn[0], wn[1]}, {2}, DType::f64), 1e-14, 1e-12,
              "no decay");
  CHECK(global_grad_norm({s.grad, nd.grad}) == doctest::Approx(std::sqrt(2 * (0.25 + 0.0625))));
  AdamWSlot bad = s;
  bad.m = Tensor::zeros({2}, DType::f32);
  CHECK_THROWS_WITH_AS(adamw_step({bad}, h, 1, 1.0), doctest::Contains("[adamw] slot 0: state"),
                       Error);
  CHECK_THROWS_WITH_AS(adamw_step({s}, AdamWHyper{-1.0}, 1, 1.0),
                       doctest::Contains("[adamw] lr must be >= 0, got -1"), Error);
}

TEST_CASE(
    "adamw_decide counts applied steps, skips non-finite ones, clips; the decided step "
    "equals the explicit one") {
  const AdamWHyper h{0.1, 0.9, 0.99, 1e-8, 0.5};
  auto slot = [](double w0) {
    AdamWSlot s;
    s.param = Tensor::from_vector({w0, -2.0}, {2}, DType::f64);
    s.grad = Tensor::from_vector({3.0, 4.0}, {2}, DType::f64);  // norm 5
    s.m = Tensor::zeros({2}, DType::f64);
    s.v = Tensor::zeros({2}, DType::f64);
    return s;
  };
  AdamWSlot a = slot(1.0), b = slot(1.0);
  Tensor dec = Tensor::zeros({kDecisionSize}, DType::f64);
  dec.data<double>()[7] = h.lr;  // the caller's rate; adamw_decide leaves it
  const Tensor sumsq = global_grad_sumsq({a.grad});
  CHECK(sumsq.item() == 25.0);
  const AdamWDecide d{2.0, 1.0, 0.9, 0.99};  // divisor 2: norm 2.5 > clip 1
  const Tensor loss = Tensor::full({}, 1.25, DType::f32);
  for (int step = 1; step <= 2; ++step) {
    adamw_decide(loss, sumsq, d, dec);
    const std::vector<double> v = dec.to_vector();
    CHECK(v[0] == step);
    CHECK(v[1] == 1.0);
    CHECK(v[2] == 1.0 - std::pow(0.9, step));
    CHECK(v[3] == 1.0 - std::pow(0.99, step));
    CHECK(v[4] == 0.5 * (1.0 / (2.5 + 1e-6)));
    CHECK(v[5] == 1.25);
    CHECK(v[6] == 2.5);
    CHECK(v[7] == h.lr);
    adamw_step({a}, h, dec);
    adamw_step({b}, h, step, v[4]);
    CHECK(a.param.to_vector() == b.param.to_vector());
  }
  // A non-finite loss or norm: not applied, the counter stays, nothing moves.
  const auto before = a.param.to_vector();
  adamw_decide(Tensor::full({}, NAN, DType::f32), sumsq, d, dec);
  CHECK(dec.to_vector()[0] == 2.0);
  CHECK(dec.to_vector()[1] == 0.0);
  adamw_step({a}, h, dec);
  CHECK(a.param.to_vector() == before);
  adamw_decide(loss, Tensor::full({1}, INFINITY, DType::f64), d, dec);
  CHECK(dec.to_vector()[1] == 0.0);
  // The decided step's rate is the decision's [7], not h.lr: at rate 0 nothing moves.
  dec.data<double>()[7] = 0.0;
  adamw_decide(loss, sumsq, d, dec);
  adamw_step({a}, h, dec);
  CHECK(a.param.to_vector() == before);
  dec.data<double>()[7] = h.lr;
  // No clipping below the threshold.
  adamw_decide(loss, Tensor::full({1}, 0.25, DType::f64), AdamWDecide{1.0, 1.0, 0.9, 0.99}, dec);
  CHECK(dec.to_vector()[4] == 1.0);
  CHECK(dec.to_vector()[0] == 4.0);
  Tensor short_dec = Tensor::zeros({3}, DType::f64);
  CHECK_THROWS_WITH_AS(adamw_decide(loss, sumsq, d, short_dec),
                       doctest::Contains("[adamw] decision must be a contiguous f64 tensor of 8"),
                       Error);
  CHECK_THROWS_WITH_AS(adamw_decide(loss, sumsq, AdamWDecide{0.0}, dec),
                       doctest::Contains("[adamw] grad_divisor must be > 0, got 0"), Error);
  CHECK_THROWS_WITH_AS(global_grad_sumsq({}), doctest::Contains("[grad_norm] needs at least one"),
                       Error);
}

FFN_GPU_TEST("multi-tensor AdamW and grad norm on the GPU match the CPU") {
  Generator g(36);
  // Sizes around the kernel's chunking (16384), its 4-value vectors and table limits (64
  // tensors, 2048 blocks).
  std::vector<int64_t> sizes = {1, 3, 16384, 16385, 100000, 100003};
  for (int i = 0; i < 70; ++i) sizes.push_back(7 + 13 * i);
  sizes.push_back(16384 * 2100 + 5);  // more chunks than one launch holds
  for (DType dt : {DType::f32, DType::bf16}) {
    std::vector<AdamWSlot> gpu, cpu;
    std::vector<Tensor> ggrads, cgrads;
    for (size_t k = 0; k < sizes.size(); ++k) {
      const int64_t n = sizes[k];
      const Tensor w = rand64({n}, g).to(dt), gr = rand64({n}, g, 0.1).to(dt);
      for (int side = 0; side < 2; ++side) {
        const Device dev = side ? Device::cpu() : kGpu;
        AdamWSlot s;
        s.param = w.to(dev).clone();
        s.grad = gr.to(dev).clone();
        // Tensor 3's moment is not 16-byte aligned on the GPU: the one-value path.
        s.m = side == 0 && k == 3 ? misaligned(Tensor::zeros({n}, DType::f32, dev))
                                  : Tensor::zeros({n}, DType::f32, dev);
        s.v = Tensor::zeros({n}, DType::f32, dev);
        if (dt != DType::f32) s.master = w.to(DType::f32).to(dev);
        s.decay = k % 2 == 0;
        (side ? cpu : gpu).push_back(s);
        (side ? cgrads : ggrads).push_back(s.grad);
      }
    }
    const AdamWHyper h{1e-2, 0.9, 0.95, 1e-8, 0.1};
    for (int step = 1; step <= 3; ++step) {
      adamw_step(gpu, h, step, 0.5);
      adamw_step(cpu, h, step, 0.5);
    }
    for (size_t k = 0; k < sizes.size(); k += (k < 6 ? 1 : 7)) {
      const Tensor& gw = gpu[k].master.defined() ? gpu[k].master : gpu[k].param;
      const Tensor& cw = cpu[k].master.defined() ? cpu[k].master : cpu[k].param;
      check_close(gw.to(Device::cpu()), cw, 1e-6, 1e-5, "adamw weights " + std::to_string(k));
      check_close(gpu[k].v.to(Device::cpu()), cpu[k].v, 1e-9, 1e-5, "adamw v");
    }
    const double gn = global_grad_norm(ggrads), cn = global_grad_norm(cgrads);
    CHECK(gn == doctest::Approx(cn).epsilon(1e-5));
    CHECK(global_grad_norm(ggrads) == gn);  // bitwise reproducible
    // The device-side decision (Note [Device-side step decision]) matches the CPU's
    // arithmetic on the same Σg², and the decided step is bitwise the explicit one.
    const Tensor ss = global_grad_sumsq(ggrads);
    Tensor gdec = Tensor::zeros({kDecisionSize}, DType::f64, kGpu);
    Tensor cdec = Tensor::zeros({kDecisionSize}, DType::f64);
    gdec.narrow(0, 7, 1).fill_(h.lr);  // the rate (Note [Device-side step decision])
    cdec.narrow(0, 7, 1).fill_(h.lr);
    const AdamWDecide d{4.0, 0.05, h.beta1, h.beta2};
    for (int step = 1; step <= 2; ++step) {
      adamw_decide(Tensor::full({}, 2.5, DType::f32, kGpu), ss, d, gdec);
      adamw_decide(Tensor::full({}, 2.5, DType::f32), ss.to(Device::cpu()), d, cdec);
      const std::vector<double> gv = gdec.to_vector(), cv = cdec.to_vector();
      for (int i : {0, 1, 4, 5, 6, 7}) CHECK(gv[i] == cv[i]);
      for (int i : {2, 3}) CHECK(gv[i] == doctest::Approx(cv[i]).epsilon(1e-15));
      std::vector<AdamWSlot> twin;
      for (const AdamWSlot& sl : gpu) {
        AdamWSlot t = sl;
        t.param = sl.param.clone(), t.m = sl.m.clone(), t.v = sl.v.clone();
        if (sl.master.defined()) t.master = sl.master.clone();
        twin.push_back(t);
      }
      adamw_step(gpu, h, gdec);
      adamw_step(twin, h, static_cast<int64_t>(gv[0]), gv[4]);
      for (size_t k = 0; k < sizes.size(); k += 5)
        CHECK(gpu[k].param.to_vector() == twin[k].param.to_vector());
    }
    const auto before = gpu[3].param.to_vector();
    adamw_decide(Tensor::full({}, NAN, DType::f32, kGpu), ss, d, gdec);
    adamw_step(gpu, h, gdec);
    CHECK(gpu[3].param.to_vector() == before);
    CHECK(gdec.to_vector()[0] == 2.0);
  }
}
