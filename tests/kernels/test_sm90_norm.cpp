// tests/kernels/test_sm90_norm.cpp — the own Hopper GEMM ending in the residual add and the
// next norm (kernels/cuda/gemm/norm_epilogue.cuh, Note [Residual add and norm in the
// epilogue]; the front door linear_add_layer_norm in kernels/layer_norm.h): against the same
// product stored by the plain kernel and then add_layer_norm, at odd and aligned shapes, with
// and without dropout, bias and the norm's bias, LayerNorm and RMSNorm; and the autograd graph
// fn::linear_add_layer_norm builds around the product it never stores, against the unfused
// one. FFN_GPU_TEST cases skip visibly without a GPU.
#include <cmath>
#include <string>
#include <vector>

#include "kernels/cuda/gemm/sm90_gemm.h"
#include "kernels/gemm.h"
#include "kernels/layer_norm.h"
#include "layers/functional.h"
#include "tests/kernels/kernel_tests.h"
#include "tests/kernels/sm90_tests.h"
#include "tests/test_util.h"

using namespace ffn;
using namespace ffn::test;

namespace {
// norm_epilogue() set for a scope (it is off by default), then off again.
struct NormEpilogueOn {
  explicit NormEpilogueOn(bool on = true) { set_norm_epilogue(on); }
  ~NormEpilogueOn() { set_norm_epilogue(false); }
};

// The largest |got - want| over |want| + 1 (the outputs are O(1) after the norm).
double max_scaled_diff(const Tensor& got, const Tensor& want) {
  const auto g = got.to_vector(), w = want.to_vector();
  double worst = g.size() == w.size() ? 0.0 : INFINITY;
  for (size_t i = 0; i < g.size() && i < w.size(); ++i) {
    const double d = std::isnan(g[i]) ? INFINITY : std::abs(g[i] - w[i]) / (std::abs(w[i]) + 1.0);
    worst = std::max(worst, d);
  }
  return worst;
}
}  // namespace

FFN_GPU_TEST("sm90 GEMM with the add and norm epilogue equals the GEMM, then add_layer_norm") {
  if (!sm90_here()) {
    MESSAGE("not an sm_90 GPU: the Hopper GEMM is not used here");
    return;
  }
  Generator g(81);
  // {m, k, n}: one row, rows that end mid-block, clusters of 2, 3 and 4 tiles (n = 256: 2 of
  // 128; 384: 2 of 192 or 3 of 128; 512: 4 of 128; 768: 4 of 192),
  // gpt2's projection and fc2 and the char models' d_model; 4097 rows are 33 row blocks, so
  // the persistent clusters take several.
  const int64_t dims[][3] = {{1, 64, 256},     {7, 72, 384},     {130, 136, 512},
                             {1000, 768, 768}, {4097, 384, 384}, {520, 3072, 768}};
  for (auto& dm : dims)
    for (DType dt : {DType::bf16, DType::f16})
      for (bool rms : {false, true})
        for (float p : {0.0f, 0.2f})
          for (int tile_n : {0, 128}) {
            const int64_t m = dm[0], k = dm[1], n = dm[2];
            if (tile_n != 0 && (dt == DType::f16 || p > 0)) continue;  // widths: bf16, no dropout
            if (tile_n != 0 && (n % tile_n != 0 || n / tile_n < 2 || n / tile_n > 4)) continue;
            const bool with_bias = !rms || p > 0;
            const Tensor x = rand64({m, k}, g).to(dt).to(kGpu);
            const Tensor wl = rand64({n, k}, g, 0.5).to(dt).to(kGpu);
            const Tensor bl = with_bias ? rand64({n}, g).to(dt).to(kGpu) : Tensor();
            const Tensor res = rand64({m, n}, g, 2.0).to(DType::f32).to(kGpu);
            const Tensor w = rand64({n}, g).to(dt).to(kGpu);
            const Tensor b = rms ? Tensor() : rand64({n}, g).to(dt).to(kGpu);
            const DropoutSpec d{p, 4242, 17};
            std::string tag = std::string(dtype_name(dt)) + (rms ? " rms" : " ln") + " m" +
                              std::to_string(m) + " k" + std::to_string(k) + " n" +
                              std::to_string(n) + " p" + std::to_string(p) + " tile " +
                              std::to_string(tile_n);
            auto out = [&](bool fused) {
              struct {
                Tensor a, y, mean, rstd;
              } o;
              o.a = Tensor::full({m, n}, NAN, DType::f32, kGpu);
              o.y = Tensor::full({m, n}, NAN, dt, kGpu);
              o.mean = rms ? Tensor() : Tensor::full({m}, NAN, DType::f32, kGpu);
              o.rstd = Tensor::full({m}, NAN, DType::f32, kGpu);
              if (fused) {
                cuda::sm90_gemm_nt_add_norm(x, wl, bl, res, d, w, b, 1e-5, o.a, o.y, o.mean, o.rstd,
                                            tile_n);
              } else {
                // The same product from the plain kernel: one K order, no split.
                Tensor h = Tensor::full({m, n}, NAN, dt, kGpu);
                cuda::sm90_gemm(x, wl, h, {.trans_b = true, .bias = bl, .splits = 1});
                add_layer_norm(res, h, d, w, b, 1e-5, o.a, o.y, o.mean, o.rstd);
              }
              return o;
            };
            const auto f = out(true), s = out(false);
            CHECK_MESSAGE(equal_and_written(f.a, s.a), tag, ": a");
            // y to rounding: the statistics are summed in another order (one 16-bit ulp of
            // an O(1) value, and a little more where (a - mean) cancels).
            const double tol = dt == DType::bf16 ? 1.6e-2 : 2e-3;
            CHECK_MESSAGE(max_scaled_diff(f.y, s.y) <= tol, tag, ": y ", max_scaled_diff(f.y, s.y));
            CHECK_MESSAGE(max_scaled_diff(f.rstd, s.rstd) <= 1e-5, tag, ": rstd");
            if (!rms) CHECK_MESSAGE(max_scaled_diff(f.mean, s.mean) <= 1e-5, tag, ": mean");
            // Every bit the same run to run, whichever CTA finished a row block.
            const auto again = out(true);
            CHECK_MESSAGE(equal_and_written(again.y, f.y), tag, ": y run to run");
            CHECK_MESSAGE(equal_and_written(again.rstd, f.rstd), tag, ": rstd run to run");
          }
}

FFN_GPU_TEST("linear_add_layer_norm: the front door, its fallbacks and argument errors") {
  if (!sm90_here()) {
    MESSAGE("not an sm_90 GPU: the Hopper GEMM is not used here");
    return;
  }
  Generator g(82);
  const int64_t m = 130, k = 64, n = 384;
  const NormEpilogueOn on;
  const Tensor x = rand64({m, k}, g).to(DType::bf16).to(kGpu);
  const Tensor wl = rand64({n, k}, g).to(DType::bf16).to(kGpu);
  const Tensor res = rand64({m, n}, g).to(DType::f32).to(kGpu);
  const Tensor w = rand64({n}, g).to(DType::bf16).to(kGpu);
  Tensor a = Tensor::empty({m, n}, DType::f32, kGpu), y = Tensor::empty({m, n}, DType::bf16, kGpu);
  Tensor mean = Tensor::empty({m}, DType::f32, kGpu), rstd = Tensor::empty({m}, DType::f32, kGpu);
  CHECK(linear_add_layer_norm(x, wl, Tensor(), res, {}, w, Tensor(), 1e-5, a, y, mean, rstd));
  // Switched off, or a residual stream in bf16: not run here (the caller runs the pair).
  set_norm_epilogue(false);
  CHECK_FALSE(linear_add_layer_norm(x, wl, Tensor(), res, {}, w, Tensor(), 1e-5, a, y, mean, rstd));
  set_norm_epilogue(true);
  const Tensor res16 = res.to(DType::bf16);
  Tensor a16 = Tensor::empty({m, n}, DType::bf16, kGpu);
  CHECK_FALSE(
      linear_add_layer_norm(x, wl, Tensor(), res16, {}, w, Tensor(), 1e-5, a16, y, mean, rstd));
  // Shapes that do not make x's: named.
  const Tensor wl_short = rand64({n - 8, k}, g).to(DType::bf16).to(kGpu);
  CHECK_THROWS_WITH_AS(
      linear_add_layer_norm(x, wl_short, Tensor(), res, {}, w, Tensor(), 1e-5, a, y, mean, rstd),
      doctest::Contains("[linear_add_layer_norm] xin [130, 64] · wl [376, 64]ᵀ does not give"),
      Error);
  Tensor no_mean;
  CHECK_THROWS_WITH_AS(
      linear_add_layer_norm(x, wl, Tensor(), res, {}, w, w, 1e-5, a, y, no_mean, rstd),
      doctest::Contains("[linear_add_rms_norm] RMSNorm (no mean) takes no bias"), Error);
  CHECK_THROWS_WITH_AS(cuda::sm90_gemm_nt_add_norm(x, wl, Tensor(), res, {}, w, Tensor(), 1e-5, a,
                                                   y, mean, rstd, 64),
                       doctest::Contains("tile_n must be 0 (automatic), 128 or 192, got 64"),
                       Error);
}

// The graph fn::linear_add_layer_norm builds (h never stored) gives the unfused graph's
// gradients: a block's shape, a = res + dropout(linear(xin)) feeding its norm and the next
// residual add, with a random gradient for their sum.
FFN_GPU_TEST("fn::linear_add_layer_norm's gradients equal linear then add_layer_norm's") {
  if (!sm90_here()) {
    MESSAGE("not an sm_90 GPU: the Hopper GEMM is not used here");
    return;
  }
  Generator g(83);
  for (bool rms : {false, true})
    for (float p : {0.0f, 0.3f}) {
      const int64_t m = 300, k = 128, n = 384;
      const DropoutSpec d{p, 99, 3};
      const Tensor xin0 = rand64({m, k}, g).to(DType::bf16).to(kGpu);
      const Tensor wl0 = rand64({n, k}, g, 0.3).to(DType::bf16).to(kGpu);
      const Tensor bl0 = rand64({n}, g).to(DType::bf16).to(kGpu);
      const Tensor res0 = rand64({m, n}, g).to(DType::f32).to(kGpu);
      const Tensor w0 = rand64({n}, g).to(DType::bf16).to(kGpu);
      const Tensor b0 = rand64({n}, g).to(DType::bf16).to(kGpu);
      const Tensor wa = rand64({m, n}, g).to(DType::f32).to(kGpu);
      auto grads = [&](bool fused) {
        const NormEpilogueOn on(fused);
        Var xin(xin0.clone(), true), wl(wl0.clone(), true), bl(bl0.clone(), true);
        Var res(res0.clone(), true), w(w0.clone(), true), b(b0.clone(), true);
        const auto [a, y] =
            fn::linear_add_layer_norm(res, xin, wl, bl, d, w, rms ? Var() : b, 1e-5, rms);
        fn::add(a, y).backward(wa);  // the block's shape: a feeds the norm and the next add
        std::vector<Tensor> out{a.value(), y.value(),  xin.grad(), wl.grad(),
                                bl.grad(), res.grad(), w.grad()};
        if (!rms) out.push_back(b.grad());
        return out;
      };
      const auto f = grads(true), s = grads(false);
      const char* names[] = {"a", "y", "dxin", "dwl", "dbl", "dres", "dw", "db"};
      for (size_t i = 0; i < f.size(); ++i)
        CHECK_MESSAGE(max_scaled_diff(f[i], s[i]) <= 3e-2, (rms ? "rms p" : "ln p"), p, ": ",
                      names[i], " ", max_scaled_diff(f[i], s[i]));
    }
}
