// tests/kernels/test_attention.cpp — causal attention: the composite path (bmm + causal_softmax)
// and the fused flash-style kernels: the CPU reference against formulas and fp64 finite
// differences, its argument checks, the CUDA kernels against the reference, and the backward's
// rotary rotate-back (rope_base) against finite differences and the rope kernel, and the column
// sums of dqkv the backward can write (dqkv_sum; FFN_GPU_TEST cases skip visibly without a GPU).
#include <algorithm>
#include <cmath>
#include <tuple>

#include "kernels/attention.h"
#include "kernels/causal_softmax.h"
#include "kernels/cuda/attention_sm90.h"
#include "kernels/gemm.h"
#include "kernels/rope.h"
#include "kernels/scale.h"
#include "layers/functional.h"
#include "tests/kernels/kernel_tests.h"
#include "tests/test_util.h"

using namespace ffn;
using namespace ffn::test;

namespace {
// The fused attention op's CPU reference as an autograd node, so gradcheck can take its
// finite differences (the layer uses the composite path on the CPU).
class RefAttentionNode final : public Node {
 public:
  RefAttentionNode(Tensor qkv, Tensor y, Tensor lse, int64_t h, DropoutSpec d)
      : qkv_(std::move(qkv)), y_(std::move(y)), lse_(std::move(lse)), h_(h), d_(d) {}
  const char* name() const override { return "ref_attention"; }
  std::vector<Tensor> backward(Tensor g) override {
    Tensor dqkv = Tensor::empty(qkv_.shape(), qkv_.dtype());
    fused_attention_backward(qkv_, y_, g, lse_, h_, scale(), d_, dqkv);
    return {dqkv};
  }
  void release() override {}
  size_t saved_bytes() const override { return 0; }
  double scale() const { return 1.0 / std::sqrt(static_cast<double>(y_.size(2) / h_)); }

 private:
  Tensor qkv_, y_, lse_;
  int64_t h_;
  DropoutSpec d_;
};

Var ref_attention(const Var& qkv, int64_t h, const DropoutSpec& d, Tensor* lse_out = nullptr) {
  const Tensor& x = qkv.value();
  const int64_t b = x.size(0), t = x.size(1), c = x.size(2) / 3;
  Tensor y = Tensor::empty({b, t, c}, x.dtype()), lse = Tensor::empty({b * h, t}, DType::f32);
  fused_attention(x, h, 1.0 / std::sqrt(static_cast<double>(c / h)), d, y, lse);
  if (lse_out) *lse_out = lse;
  return make_output(y, std::make_shared<RefAttentionNode>(x, y, lse, h, d), {qkv});
}

// Random bf16 qkv [b, t, 3·h·64] and dy [b, t, h·64] on the GPU for the Hopper kernels' cases
// (qkv drawn first); false, with a message, where those kernels do not run.
bool hopper_inputs(int64_t b, int64_t t, int64_t h, Generator& g, Tensor& qkv, Tensor& dy) {
  const int64_t c = h * 64;
  qkv = rand64({b, t, 3 * c}, g).to(DType::bf16).to(kGpu);
  if (!cuda::sm90_attention_supported(qkv, h)) {
    MESSAGE("no sm_90a code for this GPU: the Hopper attention kernels do not run here");
    return false;
  }
  dy = rand64({b, t, c}, g).to(DType::bf16).to(kGpu);
  return true;
}
}  // namespace

TEST_CASE("causal_attention passes FD checks with and without attention dropout") {
  Generator g(25);
  struct Case {
    int64_t b, t, c, h;
  };
  for (Case cs : {Case{1, 1, 2, 1}, Case{2, 5, 6, 2}, Case{1, 7, 12, 3}})
    for (float p : {0.0f, 0.3f}) {
      const DropoutSpec d{p, 11, 2};
      gradcheck([&](const std::vector<Var>& in) { return fn::causal_attention(in[0], cs.h, d); },
                {rand64({cs.b, cs.t, 3 * cs.c}, g)}, {"qkv"});
    }
  // Causality: the output at position t must not depend on later positions.
  Tensor qkv = rand64({1, 6, 12}, g);
  const Tensor y1 = fn::causal_attention(Var(qkv), 2, {}).value();
  Tensor q2 = qkv.clone();
  q2.narrow(1, 5, 1).fill_(9.0);
  const Tensor y2 = fn::causal_attention(Var(q2), 2, {}).value();
  check_close(y2.narrow(1, 0, 5), y1.narrow(1, 0, 5), 0, 0, "positions 0..4 ignore position 5");
  CHECK_THROWS_WITH_AS(fn::causal_attention(Var(rand64({1, 3, 12}, g)), 5, {}),
                       doctest::Contains("[causal_attention] qkv.shape[-1]=12 is not"), Error);
}

TEST_CASE("fused_attention's CPU reference: FD checks, equal to the composite path, lse") {
  Generator g(27);
  struct Case {
    int64_t b, t, c, h;
  };
  for (Case cs : {Case{1, 1, 2, 1}, Case{2, 5, 6, 2}, Case{1, 9, 12, 3}})
    for (float p : {0.0f, 0.3f}) {
      const DropoutSpec d{p, 11, 2};
      gradcheck([&](const std::vector<Var>& in) { return ref_attention(in[0], cs.h, d); },
                {rand64({cs.b, cs.t, 3 * cs.c}, g)}, {"qkv"});
      // Same math and the same dropped entries as bmm + causal_softmax + bmm.
      const Tensor qkv = rand64({cs.b, cs.t, 3 * cs.c}, g), dy = rand64({cs.b, cs.t, cs.c}, g);
      Var a(qkv, true), b(qkv, true);
      Tensor lse;
      Var ya = ref_attention(a, cs.h, d, &lse), yb = fn::causal_attention(b, cs.h, d);
      ya.backward(dy);
      yb.backward(dy);
      check_close(ya.value(), yb.value(), 1e-12, 1e-12, "fused reference y == composite y");
      check_close(a.grad(), b.grad(), 1e-12, 1e-12, "fused reference dqkv == composite dqkv");
      // dqkv_sum: dqkv's column sums.
      {
        Tensor y = Tensor::empty({cs.b, cs.t, cs.c}, DType::f64);
        Tensor l = Tensor::empty(lse.shape(), DType::f32);
        const double sc = 1.0 / std::sqrt(static_cast<double>(cs.c / cs.h));
        fused_attention(qkv, cs.h, sc, d, y, l);
        Tensor dq = Tensor::empty(qkv.shape(), DType::f64);
        Tensor db = Tensor::empty({3 * cs.c}, DType::f64);
        fused_attention_backward(qkv, y, dy, l, cs.h, sc, d, dq, 0, &db);
        check_column_sums(db, dq, "CPU reference");
        // An empty batch: nothing to sum, zeros.
        Tensor e = Tensor::empty({0, cs.t, 3 * cs.c}, DType::f64);
        Tensor ey = Tensor::empty({0, cs.t, cs.c}, DType::f64);
        Tensor el = Tensor::empty({0, cs.t}, DType::f32);
        Tensor edq = e.clone(), edb = Tensor::full({3 * cs.c}, NAN, DType::f64);
        fused_attention_backward(e, ey, ey, el, cs.h, sc, d, edq, 0, &edb);
        CHECK(max_abs(edb) == 0.0);
        Tensor bad = Tensor::empty({cs.c}, DType::f64);
        CHECK_THROWS_WITH_AS(fused_attention_backward(qkv, y, dy, l, cs.h, sc, d, dq, 0, &bad),
                             doctest::Contains("[fused_attention_backward] dqkv_sum"), Error);
      }
      // lse of query 0 is its single scaled score q0·k0/√d.
      const int64_t hd = cs.c / cs.h;
      const std::vector<double> x = qkv.to_vector(), l = lse.to_vector();
      for (int64_t bi = 0; bi < cs.b; ++bi)
        for (int64_t h = 0; h < cs.h; ++h) {
          const double* row = x.data() + bi * cs.t * 3 * cs.c;  // query 0 of batch bi
          double dot = 0;
          for (int64_t k = 0; k < hd; ++k) dot += row[h * hd + k] * row[cs.c + h * hd + k];
          CHECK(l[(bi * cs.h + h) * cs.t] ==
                doctest::Approx(dot / std::sqrt(static_cast<double>(hd))).epsilon(1e-6));
        }
    }
  Tensor y = Tensor::empty({1, 3, 4}, DType::f64), lse = Tensor::empty({2, 3}, DType::f32);
  CHECK_THROWS_WITH_AS(fused_attention(rand64({1, 3, 12}, g), 5, 0.5, {}, y, lse),
                       doctest::Contains("[fused_attention] qkv.shape[-1]=12 is not"), Error);
  Tensor bad_lse = Tensor::empty({2, 3}, DType::f64);
  CHECK_THROWS_WITH_AS(fused_attention(rand64({1, 3, 12}, g), 2, 0.5, {}, y, bad_lse),
                       doctest::Contains("[fused_attention] lse must be a contiguous f32"), Error);
  CHECK_THROWS_WITH_AS(fused_attention(rand64({1, 3, 12}, g), 2, -1.0, {}, y, lse),
                       doctest::Contains("[fused_attention] scale must be > 0"), Error);
}

FFN_GPU_TEST("causal_attention and bmm on the GPU match the CPU (forward and backward)") {
  Generator g(35);
  for (auto [b, t, c, h] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 1, 8, 1}, {2, 7, 12, 3}, {2, 64, 384, 6}})
    for (float p : {0.0f, 0.2f}) {
      const DropoutSpec d{p, 3, 4};
      const Tensor qkv = rand64({b, t, 3 * c}, g);
      const Tensor dy = rand64({b, t, c}, g);
      auto run = [&](Device dev) {
        Var x(qkv.to(DType::f32).to(dev), true);
        Var y = fn::causal_attention(x, h, d);
        y.backward(dy.to(DType::f32).to(dev));
        return std::vector<Tensor>{y.value(), x.grad()};
      };
      const auto gpu = run(kGpu), cpu = run(Device::cpu());
      const double tol = 1e-5 * static_cast<double>(t + c);
      check_close(gpu[0].to(Device::cpu()), cpu[0], tol, 1e-4, "attention y");
      check_close(gpu[1].to(Device::cpu()), cpu[1], tol, 1e-4, "attention dqkv");
    }
  const Tensor a = rand64({3, 5, 4}, g).to(DType::f32), bb = rand64({3, 6, 4}, g).to(DType::f32);
  check_close(bmm(a.to(kGpu), bb.to(kGpu), {.trans_b = true}).to(Device::cpu()),
              bmm(a, bb, {.trans_b = true}), 1e-6, 1e-5, "bmm");
}

// The flash-style kernels against the f64 reference on the same rounded inputs, with the
// bf16/f16 rule: at most 2x the error of the same math done naively at that precision —
// here the composite path (bmm, causal_softmax with rounded scores and probabilities, bmm)
// run on the GPU in the same dtype. Odd T (partial tiles, mask draws across Philox blocks),
// T across many 64-tiles, head sizes 32/64/128, dropout off and on.
FFN_GPU_TEST("fused attention on the GPU matches the f64 reference (bf16/f16, dropout)") {
  Generator g(38);
  struct Case {
    int64_t b, t, h, d;
  };
  for (Case cs : {Case{1, 1, 1, 64}, Case{2, 7, 3, 32}, Case{1, 100, 2, 64}, Case{2, 256, 3, 64},
                  Case{3, 200, 2, 64}, Case{1, 130, 2, 128}, Case{1, 1100, 1, 64}})
    for (DType dt : {DType::bf16, DType::f16})
      for (float p : {0.0f, 0.2f})
        for (cuda::AttentionKernel kernel :
             {cuda::AttentionKernel::automatic, cuda::AttentionKernel::mma_sync,
              cuda::AttentionKernel::sm90}) {
          // Each implementation that runs here on the same case: automatic (what the layers
          // use), then mma.sync and the Hopper kernels (head_dim 64 on an sm_90a build and GPU)
          // forced.
          const bool hopper = cuda::sm90_attention_supported(
              Tensor::empty({cs.b, cs.t, 3 * cs.h * cs.d}, dt, kGpu), cs.h);
          if (kernel != cuda::AttentionKernel::automatic && !hopper) continue;
          CAPTURE(cs.t);
          CAPTURE(cs.d);
          CAPTURE(p);
          std::string tag = " ";
          tag += dtype_name(dt);
          tag += " T=" + std::to_string(cs.t);
          tag += kernel == cuda::AttentionKernel::mma_sync ? " mma.sync"
                 : kernel == cuda::AttentionKernel::sm90  ? " sm90"
                                                          : " automatic";
          REQUIRE(fused_attention_supported(dt, cs.t, cs.d));
          const int64_t c = cs.h * cs.d;
          const DropoutSpec d{p, 5, 9};
          const Tensor qkv = rand64({cs.b, cs.t, 3 * c}, g).to(dt).to(DType::f64);
          const Tensor dy = rand64({cs.b, cs.t, c}, g).to(dt).to(DType::f64);
          auto run = [&](Device dev, DType type, bool fused) {
            Var x(qkv.to(type).to(dev), true);
            Var y = fn::causal_attention(x, cs.h, d, fused);
            y.backward(dy.to(type).to(dev));
            return std::vector<Tensor>{y.value().to(Device::cpu()).to(DType::f64),
                                       x.grad().to(Device::cpu()).to(DType::f64)};
          };
          // f64 reference: the op's CPU reference (equal to the composite path, CPU tests).
          const double scale = 1.0 / std::sqrt(static_cast<double>(cs.d));
          Tensor y64 = Tensor::empty({cs.b, cs.t, c}, DType::f64);
          Tensor lse64 = Tensor::empty({cs.b * cs.h, cs.t}, DType::f32);
          Tensor dqkv64 = Tensor::empty(qkv.shape(), DType::f64);
          fused_attention(qkv, cs.h, scale, d, y64, lse64);
          fused_attention_backward(qkv, y64, dy, lse64, cs.h, scale, d, dqkv64);
          // The kernels themselves (every case), and the layer (which routes to them where
          // fused_attention_preferred) bit for bit equal to them.
          Tensor y = Tensor::empty({cs.b, cs.t, c}, dt, kGpu);
          Tensor lse = Tensor::empty({cs.b * cs.h, cs.t}, DType::f32, kGpu);
          const Tensor xg = qkv.to(dt).to(kGpu), dyg = dy.to(dt).to(kGpu);
          y.fill_(std::nan(""));  // every element must be written
          cuda::fused_attention(xg, cs.h, scale, d, y, lse, kernel);
          Tensor g1 = Tensor::empty(xg.shape(), dt, kGpu);
          g1.fill_(std::nan(""));
          cuda::fused_attention_backward(xg, y, dyg, lse, cs.h, scale, d, g1, 0, kernel);
          const std::vector<Tensor> fused = {y.to(Device::cpu()).to(DType::f64),
                                             g1.to(Device::cpu()).to(DType::f64)};
          const auto naive = run(kGpu, dt, false);
          if (fused_attention_preferred(dt, cs.t, cs.d) &&
              kernel == cuda::AttentionKernel::automatic) {
            const auto layer = run(kGpu, dt, true);
            CHECK_MESSAGE(max_abs_diff(layer[0], fused[0]) == 0.0, "layer y == kernel y", tag);
            CHECK_MESSAGE(max_abs_diff(layer[1], fused[1]) == 0.0, "layer dqkv == kernel dqkv",
                          tag);
          }
          // ds_ij = p_ij (dp_ij − D_i) uses D_i = dy_i·y_i with the stored 16-bit y (as
          // FlashAttention does): its rounding, at most u·Σ_d|dy_id·y_id| (u = 2^-8 for bf16,
          // 2^-11 for f16), reaches dq_i (and dk_j) through scale·Σ_j p_ij·k_j, so the
          // gradient may be off by u·scale·max_i Σ_d|dy·y|·max|qkv| beyond the naive error
          // (it matters where the exact ds is ~0, e.g. T = 1, which the naive path gets exact).
          double dmax = 0;
          {
            const std::vector<double> yv = y64.to_vector(), gv = dy.to_vector();
            for (size_t r = 0; r < yv.size() / cs.d; ++r) {
              double acc = 0;
              for (int64_t k = 0; k < cs.d; ++k)
                acc += std::abs(yv[r * cs.d + k] * gv[r * cs.d + k]);
              dmax = std::max(dmax, acc);
            }
          }
          const double u = std::ldexp(1.0, dt == DType::bf16 ? -8 : -11);
          const double d_term = u * dmax * max_abs(qkv) / std::sqrt(static_cast<double>(cs.d));
          const char* names[2] = {"y", "dqkv"};
          const Tensor ref[2] = {y64, dqkv64};
          for (int k = 0; k < 2; ++k) {
            for (double v : fused[k].to_vector()) REQUIRE_MESSAGE(std::isfinite(v), names[k], tag);
            const double err = max_abs_diff(fused[k], ref[k]);
            const double naive_err = max_abs_diff(naive[k], ref[k]);
            CHECK_MESSAGE(err <= 2 * naive_err + (k == 1 ? d_term : 0.0) + 1e-6 * max_abs(ref[k]),
                          "fused attention ", names[k], tag, " p=", p, ": error ", err,
                          " vs naive ", naive_err, " (D term ", d_term, ")");
          }
          // lse: fp32 statistics of the same scores.
          check_close(lse.to(Device::cpu()), lse64, 1e-4, 1e-5, "lse" + tag);
          // Deterministic: a second backward gives the same bits, also while it sums dqkv's
          // columns (dqkv_sum, the QKV projection's bias gradient), which are the same twice.
          Tensor g2 = Tensor::empty(xg.shape(), dt, kGpu);
          Tensor db1 = Tensor::empty({3 * c}, dt, kGpu), db2 = Tensor::empty({3 * c}, dt, kGpu);
          db1.fill_(std::nan(""));
          cuda::fused_attention_backward(xg, y, dyg, lse, cs.h, scale, d, g2, 0, kernel, &db1);
          CHECK_MESSAGE(max_abs_diff(g1.to(Device::cpu()).to(DType::f64),
                                     g2.to(Device::cpu()).to(DType::f64)) == 0.0,
                        "backward is deterministic", tag);
          check_column_sums(db1, g2, "dqkv_sum" + tag);
          cuda::fused_attention_backward(xg, y, dyg, lse, cs.h, scale, d, g2, 0, kernel, &db2);
          CHECK_MESSAGE(max_abs_diff(db1.to(Device::cpu()).to(DType::f64),
                                     db2.to(Device::cpu()).to(DType::f64)) == 0.0,
                        "dqkv_sum is deterministic", tag);
        }
  // An empty batch (the Hopper kernels decline it, mma.sync returns early): dqkv_sum zeros.
  {
    const Tensor e = Tensor::empty({0, 300, 3 * 128}, DType::bf16, kGpu);
    CHECK_FALSE(cuda::sm90_attention_supported(e, 2));
    Tensor ey = Tensor::empty({0, 300, 128}, DType::bf16, kGpu);
    Tensor el = Tensor::empty({0, 300}, DType::f32, kGpu);
    Tensor edq = Tensor::empty(e.shape(), DType::bf16, kGpu);
    Tensor edb = Tensor::full({384}, NAN, DType::bf16, kGpu);
    fused_attention_backward(e, ey, ey, el, 2, 0.125, {}, edq, 0, &edb);
    CHECK(max_abs(edb.to(Device::cpu()).to(DType::f64)) == 0.0);
  }
  CHECK_FALSE(fused_attention_supported(DType::f32, 256, 64));
  CHECK_FALSE(fused_attention_supported(DType::bf16, 256, 48));
  CHECK(fused_attention_preferred(DType::bf16, 256, 64));   // shakespeare_char
  CHECK(fused_attention_preferred(DType::bf16, 1024, 64));  // gpt2_small
  Tensor y = Tensor::empty({1, 4, 48}, DType::bf16, kGpu),
         lse = Tensor::empty({1, 4}, DType::f32, kGpu);
  CHECK_THROWS_WITH_AS(
      fused_attention(Tensor::zeros({1, 4, 144}, DType::bf16, kGpu), 1, 0.1, {}, y, lse),
      doctest::Contains("[fused_attention] the CUDA kernel takes bf16/f16, head_dim 32, 64 or 128"),
      Error);
  // Asking for the Hopper kernels where they cannot run (head_dim 32 here) says so.
  Tensor y32 = Tensor::empty({1, 4, 32}, DType::bf16, kGpu);
  CHECK_THROWS_WITH_AS(cuda::fused_attention(Tensor::zeros({1, 4, 96}, DType::bf16, kGpu), 1, 0.1,
                                             {}, y32, lse, cuda::AttentionKernel::sm90),
                       doctest::Contains("[fused_attention] the Hopper kernels were asked for but "
                                         "cannot run"),
                       Error);
}

TEST_CASE("fused_attention_backward's rope_base is the gradient through rope (fp64 FD)") {
  // L(qkv) = Σ r ⊙ attention(rope(qkv)): its gradient is the backward at rope(qkv) with
  // rope_base (Note [Fused rotary embeddings]); central differences in f64, with and without
  // attention dropout (the same mask both ways).
  Generator g(27);
  const int64_t b = 1, t = 5, h = 2, dh = 4, c = h * dh;
  const double base = 50.0, scale = 1.0 / std::sqrt(static_cast<double>(dh));
  for (float p : {0.0f, 0.3f}) {
    const DropoutSpec d{p, 7, 1};
    const Tensor qkv = rand64({b, t, 3 * c}, g), r = rand64({b, t, c}, g);
    auto loss = [&](const Tensor& x, Tensor* rotated = nullptr, Tensor* y_out = nullptr,
                    Tensor* lse_out = nullptr) {
      Tensor xr = Tensor::empty(x.shape(), DType::f64);
      rope(x, h, h, base, false, xr);
      Tensor y = Tensor::empty({b, t, c}, DType::f64), lse = Tensor::empty({b * h, t}, DType::f32);
      fused_attention(xr, h, scale, d, y, lse);
      if (rotated) *rotated = xr, *y_out = y, *lse_out = lse;
      double sum = 0;
      const auto yv = y.to_vector(), rv = r.to_vector();
      for (size_t i = 0; i < yv.size(); ++i) sum += yv[i] * rv[i];
      return sum;
    };
    Tensor xr, y, lse;
    loss(qkv, &xr, &y, &lse);
    Tensor grad = Tensor::empty(qkv.shape(), DType::f64);
    fused_attention_backward(xr, y, r, lse, h, scale, d, grad, base);
    const auto gv = grad.to_vector();
    std::vector<double> xv = qkv.to_vector();
    const double eps = 1e-6;
    double worst = 0;
    for (size_t i = 0; i < xv.size(); ++i) {
      auto at = [&](double delta) {
        std::vector<double> v = xv;
        v[i] += delta;
        return loss(Tensor::from_vector(v, qkv.shape(), DType::f64));
      };
      const double fd = (at(eps) - at(-eps)) / (2 * eps);
      worst = std::max(worst, std::abs(fd - gv[i]) / (1.0 + std::abs(fd)));
    }
    CHECK_MESSAGE(worst < 1e-6, "rope_base gradient vs finite differences, p=", p, ": ", worst);
  }
  Tensor dq = Tensor::empty({1, 2, 18}, DType::f64);
  CHECK_THROWS_WITH_AS(
      fused_attention_backward(rand64({1, 2, 18}, g), rand64({1, 2, 6}, g), rand64({1, 2, 6}, g),
                               Tensor::zeros({2, 2}, DType::f32), 2, 0.5, {}, dq, 1e4),
      doctest::Contains("[fused_attention_backward] rope_base must be 0 (none) or > 0 with an "
                        "even head_dim; got 10000 with head_dim 3"),
      Error);
}

FFN_GPU_TEST("fused attention backward rotates dq and dk back in its stores (both kernels)") {
  // Against the backward without rope_base followed by the rope kernel's inverse: the same
  // values up to that path's extra rounding of dq and dk; dv untouched, bit for bit.
  Generator g(28);
  struct Case {
    int64_t b, t, h, d;
  };
  for (Case cs : {Case{1, 7, 2, 64}, Case{2, 300, 2, 64}, Case{1, 130, 2, 128}, Case{2, 77, 3, 32}})
    for (DType dt : {DType::bf16, DType::f16})
      for (float p : {0.0f, 0.2f})
        for (cuda::AttentionKernel kernel :
             {cuda::AttentionKernel::mma_sync, cuda::AttentionKernel::sm90}) {
          const int64_t c = cs.h * cs.d;
          const Tensor qkv = rand64({cs.b, cs.t, 3 * c}, g).to(dt).to(kGpu);
          if (kernel == cuda::AttentionKernel::sm90 && !cuda::sm90_attention_supported(qkv, cs.h))
            continue;
          const Tensor dy = rand64({cs.b, cs.t, c}, g).to(dt).to(kGpu);
          const DropoutSpec d{p, 3, 8};
          const double scale = 1.0 / std::sqrt(static_cast<double>(cs.d)), base = 10000.0;
          Tensor y = Tensor::empty({cs.b, cs.t, c}, dt, kGpu);
          Tensor lse = Tensor::empty({cs.b * cs.h, cs.t}, DType::f32, kGpu);
          cuda::fused_attention(qkv, cs.h, scale, d, y, lse, kernel);
          Tensor fused = Tensor::full(qkv.shape(), NAN, dt, kGpu), again = fused.clone();
          Tensor plain = Tensor::empty(qkv.shape(), dt, kGpu), ref = plain.clone();
          cuda::fused_attention_backward(qkv, y, dy, lse, cs.h, scale, d, fused, base, kernel);
          // The second run also sums dqkv's columns (the rotated-back values, as stored).
          Tensor db = Tensor::empty({3 * c}, dt, kGpu);
          cuda::fused_attention_backward(qkv, y, dy, lse, cs.h, scale, d, again, base, kernel,
                                         &db);
          check_column_sums(db, again, "dqkv_sum with rope_base");
          cuda::fused_attention_backward(qkv, y, dy, lse, cs.h, scale, d, plain, 0, kernel);
          rope(plain, cs.h, cs.h, base, /*inverse=*/true, ref);
          const std::string tag = std::string(dtype_name(dt)) + " T=" + std::to_string(cs.t) +
                                  " D=" + std::to_string(cs.d) + " p=" + std::to_string(p) +
                                  (kernel == cuda::AttentionKernel::sm90 ? " sm90" : " mma.sync");
          const Tensor f64 = fused.to(Device::cpu()).to(DType::f64);
          const Tensor r64 = ref.to(Device::cpu()).to(DType::f64);
          for (double v : f64.to_vector()) REQUIRE_MESSAGE(std::isfinite(v), tag);
          // The reference rounds dq/dk to 16 bits, rotates and rounds again: two roundings of
          // values at most max|dqkv|·√2 apart from the fused single one.
          const double u = std::ldexp(1.0, dt == DType::bf16 ? -8 : -11);
          CHECK_MESSAGE(max_abs_diff(f64, r64) <= 4 * u * max_abs(r64), "rotated back ", tag, ": ",
                        max_abs_diff(f64, r64), " vs ", max_abs(r64));
          CHECK_MESSAGE(max_abs_diff(f64.narrow(2, 2 * c, c), r64.narrow(2, 2 * c, c)) == 0.0,
                        "dv untouched ", tag);
          CHECK_MESSAGE(max_abs_diff(f64, again.to(Device::cpu()).to(DType::f64)) == 0.0,
                        "deterministic ", tag);
        }
}

FFN_GPU_TEST("fused attention backward scales dqkv's rows in its stores (both kernels)") {
  // row_scale (Note [RMSNorm folded into the QKV GEMM]): against the unscaled backward (with
  // the rotation back) followed by scale_rows: the same values up to that path's extra
  // rounding (one bf16/f16 rounding of values within max|dqkv|·max s of each other).
  Generator g(29);
  struct Case {
    int64_t b, t, h, d;
  };
  for (Case cs : {Case{1, 7, 2, 64}, Case{2, 300, 2, 64}, Case{2, 77, 3, 32}})
    for (double base : {0.0, 10000.0})
      for (cuda::AttentionKernel kernel :
           {cuda::AttentionKernel::mma_sync, cuda::AttentionKernel::sm90}) {
        const DType dt = DType::bf16;
        const int64_t c = cs.h * cs.d;
        const Tensor qkv = rand64({cs.b, cs.t, 3 * c}, g).to(dt).to(kGpu);
        if (kernel == cuda::AttentionKernel::sm90 && !cuda::sm90_attention_supported(qkv, cs.h))
          continue;
        const Tensor dy = rand64({cs.b, cs.t, c}, g).to(dt).to(kGpu);
        const Tensor rs = rand64({cs.b * cs.t}, g, 1.0)
                              .plus(Tensor::full({cs.b * cs.t}, 1.5, DType::f64))
                              .to(DType::f32)
                              .to(kGpu);  // in [0.5, 2.5)
        const DropoutSpec d{0.2f, 3, 9};
        const double scale = 1.0 / std::sqrt(static_cast<double>(cs.d));
        Tensor y = Tensor::empty({cs.b, cs.t, c}, dt, kGpu);
        Tensor lse = Tensor::empty({cs.b * cs.h, cs.t}, DType::f32, kGpu);
        cuda::fused_attention(qkv, cs.h, scale, d, y, lse, kernel);
        Tensor got = Tensor::full(qkv.shape(), NAN, dt, kGpu), again = got.clone();
        Tensor plain = Tensor::empty(qkv.shape(), dt, kGpu);
        cuda::fused_attention_backward(qkv, y, dy, lse, cs.h, scale, d, got, base, kernel, nullptr,
                                       rs);
        cuda::fused_attention_backward(qkv, y, dy, lse, cs.h, scale, d, again, base, kernel,
                                       nullptr, rs);
        cuda::fused_attention_backward(qkv, y, dy, lse, cs.h, scale, d, plain, base, kernel);
        Tensor p2 = plain.view_2d();
        scale_rows(p2, rs, p2);
        const std::string tag = "T=" + std::to_string(cs.t) + " D=" + std::to_string(cs.d) +
                                " rope " + std::to_string(base > 0) +
                                (kernel == cuda::AttentionKernel::sm90 ? " sm90" : " mma.sync");
        const Tensor f64 = got.to(Device::cpu()).to(DType::f64);
        const Tensor r64 = plain.to(Device::cpu()).to(DType::f64);
        for (double v : f64.to_vector()) REQUIRE_MESSAGE(std::isfinite(v), tag);
        const double u = std::ldexp(1.0, -8);
        CHECK_MESSAGE(max_abs_diff(f64, r64) <= 2 * u * max_abs(r64), "row scale ", tag, ": ",
                      max_abs_diff(f64, r64), " vs ", max_abs(r64));
        CHECK_MESSAGE(max_abs_diff(f64, again.to(Device::cpu()).to(DType::f64)) == 0.0,
                      "deterministic ", tag);
      }
  // The front door's checks.
  const Tensor qkv = Tensor::zeros({1, 4, 3 * 64}, DType::bf16, kGpu);
  Tensor y = Tensor::zeros({1, 4, 64}, DType::bf16, kGpu), dq = qkv.clone();
  Tensor lse = Tensor::zeros({1, 4}, DType::f32, kGpu),
         db = Tensor::zeros({192}, DType::bf16, kGpu);
  CHECK_THROWS_WITH_AS(fused_attention_backward(qkv, y, y, lse, 1, 0.125, {}, dq, 0, nullptr,
                                                Tensor::zeros({3}, DType::f32, kGpu)),
                       doctest::Contains("[fused_attention_backward] row_scale.shape=[3]"), Error);
  CHECK_THROWS_WITH_AS(fused_attention_backward(qkv, y, y, lse, 1, 0.125, {}, dq, 0, &db,
                                                Tensor::zeros({4}, DType::f32, kGpu)),
                       doctest::Contains("row_scale and dqkv_sum together"), Error);
}

// Note [Attention backward in one pass]: the Hopper dk/dv kernel adds each key block's dQ
// partial sums into a query tile after the blocks before it. At sizes where CTAs take several
// units and wait on each other (many heads: units beyond the grid; few heads and long T: a
// chain of key blocks per tile), dq must be the same bits on every run and agree with the
// mma.sync kernels; so must the forward's output. The last shape is gpt2_small's (16 × 12
// heads × 8 blocks: about 12 units a CTA on 132 SMs).
FFN_GPU_TEST("Hopper attention backward sums dq across key blocks in a fixed order") {
  Generator g(57);
  for (auto [b, t, h] : {std::tuple<int64_t, int64_t, int64_t>{4, 1024, 12}, {1, 2048, 2},
                         {2, 1000, 3}, {16, 1024, 12}})
    for (float p : {0.0f, 0.1f}) {
      const int64_t c = h * 64;
      Tensor qkv, dy;
      if (!hopper_inputs(b, t, h, g, qkv, dy)) return;
      CAPTURE(t);
      CAPTURE(p);
      const DropoutSpec d{p, 11, 4};
      Tensor y = Tensor::empty({b, t, c}, DType::bf16, kGpu);
      Tensor lse = Tensor::empty({b * h, t}, DType::f32, kGpu);
      cuda::fused_attention(qkv, h, 0.125, d, y, lse, cuda::AttentionKernel::sm90);
      {
        Tensor y2 = Tensor::empty({b, t, c}, DType::bf16, kGpu), ym = y2.clone();
        Tensor lse2 = Tensor::empty({b * h, t}, DType::f32, kGpu), lsem = lse2.clone();
        cuda::fused_attention(qkv, h, 0.125, d, y2, lse2, cuda::AttentionKernel::sm90);
        cuda::fused_attention(qkv, h, 0.125, d, ym, lsem, cuda::AttentionKernel::mma_sync);
        const Tensor a = y.to(Device::cpu()).to(DType::f64);
        const Tensor m = ym.to(Device::cpu()).to(DType::f64);
        CHECK_MESSAGE(max_abs_diff(a, y2.to(Device::cpu()).to(DType::f64)) == 0.0,
                      "forward: two runs, the same bits");
        CHECK(max_abs_diff(a, m) <= 0.02 * max_abs(m) + 1e-3);
      }
      std::vector<Tensor> runs;
      for (int r = 0; r < 3; ++r) {
        Tensor dqkv = Tensor::full(qkv.shape(), NAN, DType::bf16, kGpu);
        cuda::fused_attention_backward(qkv, y, dy, lse, h, 0.125, d, dqkv, 0,
                                       r < 2 ? cuda::AttentionKernel::sm90
                                             : cuda::AttentionKernel::mma_sync);
        runs.push_back(dqkv.to(Device::cpu()).to(DType::f64));
      }
      for (double v : runs[0].to_vector()) REQUIRE(std::isfinite(v));
      CHECK_MESSAGE(max_abs_diff(runs[0], runs[1]) == 0.0, "two runs, the same bits");
      CHECK(max_abs_diff(runs[0], runs[2]) <= 0.02 * max_abs(runs[2]) + 1e-3);
      // dq alone (the part summed across key blocks), against mma.sync's.
      CHECK(max_abs_diff(runs[0].narrow(2, 0, c), runs[2].narrow(2, 0, c)) <=
            0.02 * max_abs(runs[2].narrow(2, 0, c)) + 1e-3);
    }
}

// A small case for compute-sanitizer (tools/gpu-check attnsan; the reference test above is
// too slow under racecheck): the Hopper kernels on a grid of one CTA per SM and on one of
// three CTAs (several units a CTA, with the handoffs between them), the same bits on both,
// against the mma.sync ones.
FFN_GPU_TEST("sm90 attention kernels on small shapes (the sanitizer's case)") {
  Generator g(41);
  for (auto [b, t] : {std::pair<int64_t, int64_t>{1, 7}, {3, 200}, {2, 300}})
    for (float p : {0.0f, 0.2f}) {
      const int64_t h = 2, c = h * 64;
      Tensor qkv, dy;
      if (!hopper_inputs(b, t, h, g, qkv, dy)) return;
      CAPTURE(t);
      CAPTURE(p);
      const DropoutSpec d{p, 5, 3};
      std::vector<Tensor> out[3];
      int k = 0;
      for (int run = 0; run < 3; ++run) {
        const auto kernel = run < 2 ? cuda::AttentionKernel::sm90 : cuda::AttentionKernel::mma_sync;
        struct Forced {  // back to one CTA per SM however the block is left
          explicit Forced(int64_t n) { cuda::sm90_attention_force_grid(n); }
          ~Forced() { cuda::sm90_attention_force_grid(0); }
        } forced(run == 1 ? 3 : 0);
        Tensor y = Tensor::empty({b, t, c}, DType::bf16, kGpu);
        Tensor lse = Tensor::empty({b * h, t}, DType::f32, kGpu);
        Tensor dqkv = Tensor::empty(qkv.shape(), DType::bf16, kGpu);
        Tensor db = Tensor::empty({3 * c}, DType::bf16, kGpu);  // dqkv's column sums too
        cuda::fused_attention(qkv, h, 0.125, d, y, lse, kernel);
        cuda::fused_attention_backward(qkv, y, dy, lse, h, 0.125, d, dqkv, 0, kernel, &db);
        check_column_sums(db, dqkv, "sanitizer case");
        out[k++] = {y.to(Device::cpu()).to(DType::f64), dqkv.to(Device::cpu()).to(DType::f64),
                    db.to(Device::cpu()).to(DType::f64)};
      }
      for (int i = 0; i < 3; ++i)
        CHECK_MESSAGE(max_abs_diff(out[0][i], out[1][i]) == 0.0, "grid of 3 CTAs, output ", i);
      // Two bf16 implementations of the same math: apart by their rounding, not more.
      CHECK(max_abs_diff(out[0][0], out[2][0]) <= 0.02 * max_abs(out[2][0]) + 1e-3);
      CHECK(max_abs_diff(out[0][1], out[2][1]) <= 0.02 * max_abs(out[2][1]) + 1e-3);
    }
}

// Note [Unit order]'s groups reorder the units of both Hopper kernels, not their arithmetic:
// each unit's outputs are its own, and dq's partial sums are added in key-block order
// whatever the order of the units. So every group size gives the same bits, including a group
// of one head (a head's key blocks on concurrent CTAs, each waiting on the one before) and a
// last group of fewer heads. Small enough for the sanitizers (tools/gpu-check attnsan).
FFN_GPU_TEST("sm90 attention unit groups change the order, not the bits") {
  Generator g(43);
  for (auto [b, t, h] : {std::tuple<int64_t, int64_t, int64_t>{3, 200, 2}, {2, 520, 3}})
    for (float p : {0.0f, 0.2f}) {
      const int64_t c = h * 64;
      Tensor qkv, dy;
      if (!hopper_inputs(b, t, h, g, qkv, dy)) return;
      CAPTURE(t);
      CAPTURE(p);
      const DropoutSpec d{p, 9, 2};
      std::vector<Tensor> first;
      for (int64_t group : {0, 1, 4}) {
        CAPTURE(group);
        struct Forced {  // back to automatic groups however the block is left
          explicit Forced(int64_t n) { cuda::sm90_attention_force_unit_group(n); }
          ~Forced() { cuda::sm90_attention_force_unit_group(0); }
        } forced(group);
        Tensor y = Tensor::empty({b, t, c}, DType::bf16, kGpu);
        Tensor lse = Tensor::empty({b * h, t}, DType::f32, kGpu);
        Tensor dqkv = Tensor::empty(qkv.shape(), DType::bf16, kGpu);
        Tensor db = Tensor::empty({3 * c}, DType::bf16, kGpu);
        cuda::fused_attention(qkv, h, 0.125, d, y, lse, cuda::AttentionKernel::sm90);
        cuda::fused_attention_backward(qkv, y, dy, lse, h, 0.125, d, dqkv, 0,
                                       cuda::AttentionKernel::sm90, &db);
        std::vector<Tensor> out;
        for (const Tensor* x : {&y, &lse, &dqkv, &db})
          out.push_back(x->to(Device::cpu()).to(DType::f64));
        if (first.empty()) {
          first = out;
          for (double v : out[2].to_vector()) REQUIRE(std::isfinite(v));
          continue;
        }
        for (size_t i = 0; i < out.size(); ++i)
          CHECK_MESSAGE(max_abs_diff(out[i], first[i]) == 0.0, "output ", i, " differs");
      }
    }
}

// Note [Forward block rows]'s choice is host logic, checked without a GPU in CUDA builds:
// 192-row blocks where 64 divides T from T = 512 (forced: wherever 64 divides T), else 128.
TEST_CASE("sm90 attention forward block rows: the choice by T, forced or not") {
#if FFN_WITH_CUDA
  struct Reset {  // back to the automatic choice however the case is left
    ~Reset() { cuda::sm90_attention_force_forward_rows(0); }
  } reset;
  for (auto [t, rows] : {std::pair<int64_t, int64_t>{1024, 192}, {512, 192}, {576, 192},
                         {448, 128}, {256, 128}, {1000, 128}, {1, 128}})
    CHECK_MESSAGE(cuda::sm90_attention_forward_rows(t) == rows, "T=", t);
  cuda::sm90_attention_force_forward_rows(192);
  CHECK(cuda::sm90_attention_forward_rows(256) == 192);
  CHECK(cuda::sm90_attention_forward_rows(1000) == 128);  // 64 does not divide T
  cuda::sm90_attention_force_forward_rows(128);
  CHECK(cuda::sm90_attention_forward_rows(1024) == 128);
  CHECK_THROWS_WITH(cuda::sm90_attention_force_forward_rows(256),
                    doctest::Contains("[fused_attention] forward block rows 256 is not 0"));
  CHECK(cuda::sm90_attention_forward_rows(1024) == 128);  // a rejected value changes nothing
#else
  MESSAGE("a CPU-only build: no Hopper attention kernels to choose between");
#endif
}

// Note [Forward block rows]: the Hopper forward without dropout runs blocks of 128 queries
// from row 0 or (where 64 divides T) 192 ending at T, two or three consumer warpgroups with the
// same per-row arithmetic, so both give the same bits: at T where the first 192-row block has
// one, two or three warpgroups with rows, where a warpgroup's key tiles end before its
// block's, where a 128-row block ends past T, and on a grid of three CTAs (several units a
// CTA). Note [Forward ping-pong]: the warpgroups taking turns change no bits either, with
// and without dropout, whatever the warpgroups' tile counts. Note [Half diagonal tile]: every
// key tile whole gives the same bits as the halves. Small enough for the sanitizers
// (tools/gpu-check attnsan).
FFN_GPU_TEST("sm90 attention forward: 128- and 192-row blocks, the same bits") {
  Generator g(47);
  struct Forced {  // back to the default however the block is left
    Forced(int64_t rows, int64_t grid, int pingpong = 0, bool whole = false) {
      cuda::sm90_attention_force_forward_rows(rows);
      cuda::sm90_attention_force_grid(grid);
      cuda::sm90_attention_force_forward_pingpong(pingpong);
      cuda::sm90_attention_force_whole_diagonal(whole);
    }
    ~Forced() {
      cuda::sm90_attention_force_forward_rows(0);
      cuda::sm90_attention_force_grid(0);
      cuda::sm90_attention_force_forward_pingpong(0);
      cuda::sm90_attention_force_whole_diagonal(false);
    }
  };
  CHECK_THROWS_WITH(cuda::sm90_attention_force_forward_pingpong(2),
                    doctest::Contains("forward ping-pong mode 2"));
  CHECK_THROWS_WITH(cuda::sm90_attention_force_forward_rows(64),
                    doctest::Contains("forward block rows 64"));
  for (int64_t t : {1, 64, 65, 128, 192, 193, 256, 300, 320, 448, 512, 576}) {
    const int64_t b = 2, h = 2, c = h * 64;
    Tensor qkv, dy;
    if (!hopper_inputs(b, t, h, g, qkv, dy)) return;
    CAPTURE(t);
    std::vector<Tensor> out;
    struct Run {
      int64_t rows, grid;
      int pingpong;
      bool whole;  // Note [Half diagonal tile] off: every key tile whole
    };
    for (auto [rows, grid, pingpong, whole] :
         {Run{128, 0, -1, false}, Run{192, 0, -1, false}, Run{192, 3, -1, false},
          Run{128, 0, 1, false}, Run{192, 0, 1, false}, Run{192, 3, 1, false},
          Run{128, 3, 1, false}, Run{128, 0, -1, true}, Run{192, 0, -1, true},
          Run{192, 3, -1, true}}) {
      CAPTURE(rows);
      CAPTURE(grid);
      CAPTURE(pingpong);
      CAPTURE(whole);
      const Forced forced(rows, grid, pingpong, whole);
      REQUIRE(cuda::sm90_attention_forward_rows(t) == (t % 64 == 0 ? rows : 128));
      Tensor y = Tensor::full({b, t, c}, NAN, DType::bf16, kGpu);
      Tensor lse = Tensor::full({b * h, t}, NAN, DType::f32, kGpu);
      cuda::fused_attention(qkv, h, 0.125, DropoutSpec{}, y, lse, cuda::AttentionKernel::sm90);
      out.push_back(y.to(Device::cpu()).to(DType::f64));
      out.push_back(lse.to(Device::cpu()).to(DType::f64));
    }
    for (double v : out[0].to_vector()) REQUIRE(std::isfinite(v));
    for (double v : out[1].to_vector()) REQUIRE(std::isfinite(v));
    for (size_t i = 2; i < out.size(); ++i)
      CHECK_MESSAGE(max_abs_diff(out[i], out[i % 2]) == 0.0, "output ", i, " differs");
    Tensor ym = Tensor::empty({b, t, c}, DType::bf16, kGpu);
    Tensor lsem = Tensor::empty({b * h, t}, DType::f32, kGpu);
    cuda::fused_attention(qkv, h, 0.125, DropoutSpec{}, ym, lsem, cuda::AttentionKernel::mma_sync);
    const Tensor m = ym.to(Device::cpu()).to(DType::f64);
    CHECK(max_abs_diff(out[2], m) <= 0.02 * max_abs(m) + 1e-3);
    CHECK(max_abs_diff(out[3], lsem.to(Device::cpu()).to(DType::f64)) <= 1e-3);
    // With dropout (128-row blocks only): ping-pong on and off, the same bits.
    std::vector<Tensor> drop;
    for (auto [grid, pingpong] : {std::pair<int64_t, int>{0, -1}, {0, 1}, {3, 1}}) {
      const Forced forced(0, grid, pingpong);
      Tensor y = Tensor::full({b, t, c}, NAN, DType::bf16, kGpu);
      Tensor lse = Tensor::full({b * h, t}, NAN, DType::f32, kGpu);
      cuda::fused_attention(qkv, h, 0.125, DropoutSpec{0.3f, 11, 2}, y, lse,
                            cuda::AttentionKernel::sm90);
      drop.push_back(y.to(Device::cpu()).to(DType::f64));
      drop.push_back(lse.to(Device::cpu()).to(DType::f64));
    }
    for (double v : drop[0].to_vector()) REQUIRE(std::isfinite(v));
    for (size_t i = 2; i < drop.size(); ++i)
      CHECK_MESSAGE(max_abs_diff(drop[i], drop[i % 2]) == 0.0, "dropout output ", i, " differs");
  }
}

// The forward's online softmax rescales O and the row sum whenever a key tile raises a row's
// running max. With small random scores that happens by little and rarely after the first
// tiles; here scores grow along the keys (head 0 by ~12 log2 units a 128-key tile, so every
// tile rescales by 2^-12 or less; head 1 by ~3), against the f64 reference and the mma.sync
// kernel, at T where the forward runs 192-row blocks (1024) and 128-row ones (1000), with and
// without dropout. (Session 44 tried moving the max only past a slack of 8, FlashAttention-4's
// conditional rescale, with this test: no faster, not kept; bench/RESULTS.md.)
FFN_GPU_TEST("sm90 attention forward: row maxima that grow tile by tile") {
  Generator g(61);
  for (int64_t t : {1000, 1024})
    for (float p : {0.0f, 0.2f}) {
      const int64_t b = 1, h = 2, c = h * 64;
      std::vector<double> v = rand64({b, t, 3 * c}, g).to_vector();
      const double scale = 0.125, per_tile[2] = {12.0, 3.0};  // log2 units a 128-key tile
      for (int64_t i = 0; i < t; ++i)  // position i's q and k, column 0 of each head
        for (int64_t hh = 0; hh < h; ++hh) {
          v[i * 3 * c + hh * 64] = 4.0;
          // any query's score with key i ≈ scale · 4 · k = per_tile · (i / 128) / log2(e)
          v[i * 3 * c + c + hh * 64] =
              per_tile[hh] * static_cast<double>(i) / 128.0 / 1.4426950408889634 / (scale * 4.0);
        }
      const Tensor qkv = Tensor::from_vector(v, {b, t, 3 * c}).to(DType::bf16).to(DType::f64);
      const Tensor xg = qkv.to(DType::bf16).to(kGpu);
      if (!cuda::sm90_attention_supported(xg, h)) {
        MESSAGE("no sm_90a code for this GPU: the Hopper attention kernels do not run here");
        return;
      }
      CAPTURE(t);
      CAPTURE(p);
      const DropoutSpec d{p, 3, 5};
      Tensor y64 = Tensor::empty({b, t, c}, DType::f64);
      Tensor lse64 = Tensor::empty({b * h, t}, DType::f32);
      fused_attention(qkv, h, scale, d, y64, lse64);
      Tensor y = Tensor::full({b, t, c}, NAN, DType::bf16, kGpu), ym = y.clone();
      Tensor lse = Tensor::full({b * h, t}, NAN, DType::f32, kGpu), lsem = lse.clone();
      cuda::fused_attention(xg, h, scale, d, y, lse, cuda::AttentionKernel::sm90);
      cuda::fused_attention(xg, h, scale, d, ym, lsem, cuda::AttentionKernel::mma_sync);
      const Tensor a = y.to(Device::cpu()).to(DType::f64);
      const Tensor m = ym.to(Device::cpu()).to(DType::f64);
      for (double e : a.to_vector()) REQUIRE(std::isfinite(e));
      const double err = max_abs_diff(a, y64), err_m = max_abs_diff(m, y64);
      CHECK_MESSAGE(err <= 2 * err_m + 1e-3, "sm90 error ", err, " vs mma.sync ", err_m);
      CHECK(err <= 0.02 * max_abs(y64));
      check_close(lse.to(Device::cpu()), lse64, 1e-4, 1e-5, "lse");
      check_close(lsem.to(Device::cpu()), lse64, 1e-4, 1e-5, "lse (mma.sync)");
    }
}
