// bench/ffn_bench.cpp — `ffn-bench`: times docs/design.md's FFN workloads (forward + backward
// through layers/ffn_functional, the code the layers run) and the bare cuBLASLt GEMMs of
// the same shapes, and prints one JSON line per workload.
//
// Timing: CUDA events on the compute stream around each forward+backward, after
// warm-up, the median of at least --iters runs spread over --window-ms of wall time (Note
// [Timing window] in bench/timing.h), inputs drawn from N(0, 1) (never zeros).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "bench/gpt_ops_bench.h"
#include "bench/timing.h"
#include "bench/workloads.h"
#include "core/cuda/check.h"
#include "core/cuda/context.h"
#include "core/generator.h"
#include "kernels/bias_act_dropout.h"
#include "kernels/bias_glu_dropout.h"
#include "kernels/cuda/gemm/sm90_gemm.h"
#include "kernels/gemm.h"
#include "layers/ffn_functional.h"

using namespace ffn;
using bench::back_to_back_ms;
using bench::median_ms;

namespace {

struct Inputs {
  Tensor x, dy;
  FfnParams p;
};

Inputs make_inputs(const bench::Workload& w, Device dev, Generator& g) {
  Inputs in;
  const double s = 1.0 / std::sqrt(static_cast<double>(w.d));
  in.x = Tensor::randn({w.m, w.d}, g, w.dtype, dev);
  const int64_t hidden = w.h1 ? (w.gated ? w.h1 / 2 : w.h1) : w.d;
  if (w.h1) in.p.w1 = Tensor::randn({w.h1, w.d}, g, w.dtype, dev, 0.0, s);
  if (w.h1 && w.bias1) in.p.b1 = Tensor::randn({w.h1}, g, w.dtype, dev, 0.0, 0.1);
  if (w.d_out)
    in.p.w2 =
        Tensor::randn({w.d_out, hidden}, g, w.dtype, dev, 0.0, 1.0 / std::sqrt(double(hidden)));
  if (w.d_out && w.bias2) in.p.b2 = Tensor::randn({w.d_out}, g, w.dtype, dev, 0.0, 0.1);
  in.dy = Tensor::randn({w.m, w.d_out ? w.d_out : hidden}, g, w.dtype, dev);
  return in;
}

// The comparisons whose columns say "cuBLASLt" run gemm() on cuBLASLt alone (Note [Own GEMM
// in gemm()]); the workloads and their floor run it as training does.
struct CublasLtOnly {
  OwnGemm saved = own_gemm();
  CublasLtOnly() { set_own_gemm(OwnGemm::never); }
  ~CublasLtOnly() { set_own_gemm(saved); }
};

// Times each fused elementwise kernel of a workload alone and prints its effective
// bandwidth next to a device-to-device copy of the same bytes (the ceiling).
void kernel_breakdown(const bench::Workload& w, int device, int warmup, int iters) {
  const Device dev = Device::cuda(device);
  Generator g(7);
  const int64_t h1 = w.h1 ? w.h1 : w.d, hidden = w.gated ? h1 / 2 : h1;
  const double es = static_cast<double>(dtype_size(w.dtype));
  const Tensor z = Tensor::randn({w.m, h1}, g, w.dtype, dev);
  const Tensor b = Tensor::randn({h1}, g, w.dtype, dev);
  const Tensor dh = Tensor::randn({w.m, hidden}, g, w.dtype, dev);
  Tensor hd = Tensor::empty({w.m, hidden}, w.dtype, dev),
         hd2 = Tensor::empty({w.m, hidden}, w.dtype, dev);
  Tensor dz = Tensor::empty({w.m, h1}, w.dtype, dev), db = Tensor::empty({h1}, w.dtype, dev);
  const DropoutSpec d{w.p_hidden, 5, 6};
  auto report = [&](const char* kernel, double bytes, double ms) {
    std::printf("{\"kernel\": \"%s\", \"workload\": \"%s\", \"ms\": %.4f, \"gbps\": %.0f}\n",
                kernel, w.name.c_str(), ms, bytes / ms / 1e6);
  };
  const double act_fwd = (w.m * h1 + w.m * hidden) * es, act_bwd = 2 * act_fwd;
  report(w.gated ? "bias_glu_dropout" : "bias_act_dropout", act_fwd,
         median_ms(device, warmup, iters, [&] {
           if (w.gated)
             bias_glu_dropout(z, b, w.act, d, hd);
           else
             bias_act_dropout(z, b, w.act, d, hd);
         }));
  report(w.gated ? "bias_glu_dropout_backward" : "bias_act_dropout_backward", act_bwd,
         median_ms(device, warmup, iters, [&] {
           if (w.gated)
             bias_glu_dropout_backward(dh, z, b, w.act, d, dz, &db, &hd2);
           else
             bias_act_dropout_backward(dh, z, b, w.act, d, dz, &db, &hd2);
         }));
  Tensor copy_dst = Tensor::empty({w.m, h1}, w.dtype, dev);
  report("d2d_copy_reference", 2 * w.m * h1 * es,
         median_ms(device, warmup, iters, [&] { copy_dst.copy_(z); }));
  if (w.d_out) {
    const Tensor y = Tensor::randn({w.m, w.d_out}, g, w.dtype, dev);
    const Tensor b2 = Tensor::randn({w.d_out}, g, w.dtype, dev);
    Tensor out = Tensor::empty({w.m, w.d_out}, w.dtype, dev),
           db2 = Tensor::empty({w.d_out}, w.dtype, dev);
    const DropoutSpec d2{w.p_out, 5, 7};
    const double bytes = 2.0 * w.m * w.d_out * es;
    report("bias_dropout", bytes,
           median_ms(device, warmup, iters, [&] { bias_dropout(y, b2, d2, out); }));
    report("bias_dropout_backward", bytes,
           median_ms(device, warmup, iters, [&] { bias_dropout_backward(y, d2, &out, &db2); }));
  }
}

// For each place a cuBLASLt epilogue could replace one of our kernels, times both ways
// on the workload's shapes (dropout off: the epilogues cannot apply a mask).
void epilogue_comparison(const bench::Workload& w, int device, int warmup, int iters) {
  const CublasLtOnly cublaslt_only;
  if (!w.d_out || w.gated) return;  // no fc2, or GLU (cuBLASLt has no GLU epilogue)
  const Device dev = Device::cuda(device);
  Generator g(8);
  const int64_t hidden = w.h1 ? w.h1 : w.d;
  auto report = [&](const char* place, double ours, double epi) {
    std::printf(
        "{\"epilogue\": \"%s\", \"workload\": \"%s\", \"ours_ms\": %.4f, "
        "\"epilogue_ms\": %.4f, \"epilogue_over_ours\": %.3f}\n",
        place, w.name.c_str(), ours, epi, epi / ours);
  };
  auto t = [&](auto&& f) { return median_ms(device, warmup, iters, f); };
  const Tensor hd_in = Tensor::randn({w.m, hidden}, g, w.dtype, dev);
  const Tensor w2 = Tensor::randn({w.d_out, hidden}, g, w.dtype, dev, 0.0, 0.02);
  const Tensor b2 = Tensor::randn({w.d_out}, g, w.dtype, dev);
  const Tensor dy = Tensor::randn({w.m, w.d_out}, g, w.dtype, dev);
  Tensor y = Tensor::empty({w.m, w.d_out}, w.dtype, dev),
         dw2 = Tensor::empty({w.d_out, hidden}, w.dtype, dev);
  Tensor db2 = Tensor::empty({w.d_out}, w.dtype, dev);
  // fc2 forward bias: GEMM + bias_dropout(p = 0) vs BIAS.
  report("BIAS (fc2 forward)", t([&] {
           gemm(hd_in, w2, y, {.trans_b = true});
           bias_dropout(y, b2, {}, y);
         }),
         t([&] { gemm(hd_in, w2, y, {.trans_b = true, .bias = b2}); }));
  // db2: bias_grad kernel + dW2 GEMM vs BGRADB on the dW2 GEMM.
  report("BGRADB (db2 with dW2)", t([&] {
           bias_grad(dy, db2);
           gemm(dy, hd_in, dw2, {.trans_a = true});
         }),
         t([&] {
           gemm(dy, hd_in, dw2,
                {.trans_a = true, .epilogue = GemmEpilogue::bgrad_a, .bias_grad = db2});
         }));
  if (!w.h1 || w.act != Activation::gelu_tanh) return;
  const Tensor x = Tensor::randn({w.m, w.d}, g, w.dtype, dev);
  const Tensor w1 = Tensor::randn({w.h1, w.d}, g, w.dtype, dev, 0.0, 0.02);
  const Tensor b1 = Tensor::randn({w.h1}, g, w.dtype, dev);
  Tensor z = Tensor::empty({w.m, w.h1}, w.dtype, dev),
         hd = Tensor::empty({w.m, w.h1}, w.dtype, dev);
  Tensor aux = Tensor::empty({w.m, w.h1}, w.dtype, dev),
         dhd = Tensor::empty({w.m, w.h1}, w.dtype, dev);
  Tensor dz = Tensor::empty({w.m, w.h1}, w.dtype, dev), db1 = Tensor::empty({w.h1}, w.dtype, dev);
  // fc1 forward: GEMM + bias_act_dropout(p = 0) vs GELU_AUX_BIAS (writes hd and the saved pre).
  report("GELU_AUX_BIAS (fc1 forward)", t([&] {
           gemm(x, w1, z, {.trans_b = true});
           bias_act_dropout(z, b1, Activation::gelu_tanh, {}, hd);
         }),
         t([&] {
           gemm(x, w1, hd,
                {.trans_b = true, .bias = b1, .epilogue = GemmEpilogue::gelu_aux_bias, .aux = aux});
         }));
  // fc1 backward middle: dhd GEMM + bias_act_dropout_backward (dz, db1, hd for dW2) vs DGELU_BGRAD
  // (dz, db1) + a pass recomputing hd = gelu(pre) for dW2.
  const Tensor dz2 = dy;
  report("DGELU_BGRAD (fc1 backward)", t([&] {
           gemm(dz2, w2, dhd);
           bias_act_dropout_backward(dhd, z, b1, Activation::gelu_tanh, {}, dz, &db1, &hd);
         }),
         t([&] {
           gemm(dz2, w2, dz, {.epilogue = GemmEpilogue::dgelu_bgrad, .aux = aux, .bias_grad = db1});
           activation_forward(aux, Activation::gelu_tanh, hd);
         }));
}

}  // namespace

// Our Hopper GEMM (kernels/cuda/gemm/) against cuBLASLt (autotuned, as ffn-train runs it since
// session 18, and its first heuristic choice, what ffn-train ran before) on the products of the
// docs/design.md workloads and GPT-2 124M (B·T = 16384), one JSON line per product: each Linear's
// forward x·Wᵀ ("fwd", NT), its input gradient dy·W ("dgrad", NN) and its weight gradient
// dyᵀ·x ("wgrad", TN); then the fused fc1 (GEMM + bias + GELU + dropout in the epilogue)
// against cuBLASLt + bias_act_dropout. The *_ms fields wait for each launch (the host's
// launch time included); the b2b_* fields time back-to-back launches, as gemm()'s autotuner
// does (Note [Own GEMM in gemm()]).
// only: products whose "name.pass" contains it (empty: all, with the fused fc1 after them).
// variant (--gemm-variant): time only that one measurement of each product, back to back
// (cooperative, pingpong, auto: our schedules; cublaslt: gemm()'s choice), so that a window of
// seconds samples one kernel alone (the clock and power beside it, e.g. with nvidia-smi).
void gemm_comparison(int device, int warmup, int iters, const std::string& only,
                     const std::string& variant) {
  const CublasLtOnly cublaslt_only;
  const Device dev = Device::cuda(device);
  struct Shape3 {
    const char* name;
    int64_t m, n, k;  // tokens, out features, in features
  };
  const Shape3 shapes[] = {
      {"welder_fc2", 2048, 4096, 16384},  {"ffn_d1024.fc1", 16384, 4096, 1024},
      {"ffn_d1024.fc2", 16384, 1024, 4096}, {"ffn_d4096.fc1", 8192, 16384, 4096},
      {"ffn_d4096.fc2", 8192, 4096, 16384}, {"geglu_d1024.fc1", 16384, 8192, 1024},
      {"geglu_d2048.fc1", 16384, 16384, 2048}, {"gpt2.qkv", 16384, 2304, 768},
      {"gpt2.proj", 16384, 768, 768},       {"gpt2.fc1", 16384, 3072, 768},
      {"gpt2.fc2", 16384, 768, 3072},       {"gpt2.lm_head", 16384, 50304, 768}};
  Generator g(31);
  for (const Shape3& sh : shapes) {
    const Tensor x = Tensor::randn({sh.m, sh.k}, g, DType::bf16, dev);
    const Tensor w = Tensor::randn({sh.n, sh.k}, g, DType::bf16, dev);
    const Tensor dy = Tensor::randn({sh.m, sh.n}, g, DType::bf16, dev);
    Tensor y = Tensor::empty({sh.m, sh.n}, DType::bf16, dev);
    Tensor dx = Tensor::empty({sh.m, sh.k}, DType::bf16, dev);
    Tensor dw = Tensor::empty({sh.n, sh.k}, DType::bf16, dev);
    struct Product {
      const char* pass;
      const Tensor& a;
      const Tensor& b;
      Tensor& c;
      bool ta, tb;
    };
    for (const Product& p : {Product{"fwd", x, w, y, false, true},
                             Product{"dgrad", dy, w, dx, false, false},
                             Product{"wgrad", dy, x, dw, true, false}}) {
      if (!only.empty() &&
          (std::string(sh.name) + "." + p.pass).find(only) == std::string::npos)
        continue;
      if (!cuda::sm90_gemm_supported(p.a, p.b, p.c, p.ta, p.tb)) {
        std::fprintf(stderr, "ffn-bench --gemm: the Hopper GEMM does not run here (needs sm_90)\n");
        return;
      }
      if (!variant.empty()) {
        const cuda::Sm90Schedule sched = variant == "pingpong" ? cuda::Sm90Schedule::pingpong
                                         : variant == "auto"   ? cuda::Sm90Schedule::automatic
                                                               : cuda::Sm90Schedule::cooperative;
        const cuda::Sm90GemmArgs args{.trans_a = p.ta, .trans_b = p.tb, .schedule = sched};
        const double ms =
            variant == "cublaslt"
                ? back_to_back_ms(device, warmup, iters,
                                  [&] { gemm(p.a, p.b, p.c, {.trans_a = p.ta, .trans_b = p.tb}); })
                : back_to_back_ms(device, warmup, iters,
                                  [&] { cuda::sm90_gemm(p.a, p.b, p.c, args); });
        std::printf("{\"gemm\": \"%s.%s\", \"variant\": \"%s\", \"b2b_ms\": %.4f}\n", sh.name,
                    p.pass, variant.c_str(), ms);
        std::fflush(stdout);
        continue;
      }
      auto ours_args = [&](const cuda::Sm90GemmArgs& args) {
        return median_ms(device, warmup, iters, [&] { cuda::sm90_gemm(p.a, p.b, p.c, args); });
      };
      auto ours = [&](cuda::Sm90Schedule s, bool tma) {
        return ours_args({.trans_a = p.ta, .trans_b = p.tb, .schedule = s, .tma_store = tma});
      };
      const double coop = ours(cuda::Sm90Schedule::cooperative, true);
      const double pp = ours(cuda::Sm90Schedule::pingpong, true);
      const double coop_regs = ours(cuda::Sm90Schedule::cooperative, false);
      const double best = ours(cuda::Sm90Schedule::automatic, true);
      const double lt = median_ms(device, warmup, iters,
                                  [&] { gemm(p.a, p.b, p.c, {.trans_a = p.ta, .trans_b = p.tb}); });
      // The same with the launches hidden: what decides gemm()'s choice.
      auto ours_b2b = [&](cuda::Sm90Schedule s) {
        const cuda::Sm90GemmArgs args{.trans_a = p.ta, .trans_b = p.tb, .schedule = s};
        return back_to_back_ms(device, warmup, iters,
                               [&] { cuda::sm90_gemm(p.a, p.b, p.c, args); });
      };
      const double coop_b2b = ours_b2b(cuda::Sm90Schedule::cooperative);
      const double pp_b2b = ours_b2b(cuda::Sm90Schedule::pingpong);
      const double best_b2b = ours_b2b(cuda::Sm90Schedule::automatic);
      // The automatic choice in groups of 8 to 64 tile rows (Note [Tile groups]).
      double group_b2b[4];
      for (int i = 0; i < 4; ++i) {
        const cuda::Sm90GemmArgs args{.trans_a = p.ta, .trans_b = p.tb, .group_m = 8 << i};
        group_b2b[i] =
            back_to_back_ms(device, warmup, iters, [&] { cuda::sm90_gemm(p.a, p.b, p.c, args); });
      }
      // The cooperative kernel at each tile width, forced (Sm90GemmArgs::tile_n).
      double width_b2b[3];
      for (int i = 0; i < 3; ++i) {
        const cuda::Sm90GemmArgs args{
            .trans_a = p.ta, .trans_b = p.tb, .splits = 1, .tile_n = 128 + 64 * i};
        width_b2b[i] =
            back_to_back_ms(device, warmup, iters, [&] { cuda::sm90_gemm(p.a, p.b, p.c, args); });
      }
      const double lt_b2b = back_to_back_ms(
          device, warmup, iters, [&] { gemm(p.a, p.b, p.c, {.trans_a = p.ta, .trans_b = p.tb}); });
      // What ffn-train ran before session 18 (runtime.gemm_autotune = false, for bit-exact
      // resume, until Note [GEMM choices]): cuBLASLt's first heuristic choice.
      const bool tuned = gemm_autotune();
      set_gemm_autotune(false);
      const double lt_first = median_ms(
          device, warmup, iters, [&] { gemm(p.a, p.b, p.c, {.trans_a = p.ta, .trans_b = p.tb}); });
      set_gemm_autotune(tuned);
      const int64_t m = p.c.size(0), n = p.c.size(1), k = p.ta ? p.a.size(0) : p.a.size(1);
      const double fl = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
      std::printf(
          "{\"gemm\": \"%s.%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, "
          "\"ours_ms\": %.4f, \"cublaslt_ms\": %.4f, \"ours_tflops\": %.1f, "
          "\"cublaslt_tflops\": %.1f, \"ours_over_cublaslt\": %.3f, "
          "\"cooperative_ms\": %.4f, \"pingpong_ms\": %.4f, "
          "\"cooperative_register_store_ms\": %.4f, "
          "\"cublaslt_first_ms\": %.4f, \"ours_over_cublaslt_first\": %.3f, "
          "\"b2b_ours_ms\": %.4f, \"b2b_cooperative_ms\": %.4f, \"b2b_pingpong_ms\": %.4f, "
          "\"b2b_cublaslt_ms\": %.4f, \"b2b_best_ours_over_cublaslt\": %.3f, "
          "\"b2b_unsplit_bn128_ms\": %.4f, \"b2b_unsplit_bn192_ms\": %.4f, "
          "\"b2b_unsplit_bn256_ms\": %.4f, \"b2b_group8_ms\": %.4f, "
          "\"b2b_group16_ms\": %.4f, \"b2b_group32_ms\": %.4f, \"b2b_group64_ms\": %.4f}\n",
          sh.name, p.pass, static_cast<long long>(m), static_cast<long long>(n),
          static_cast<long long>(k), best, lt, fl / best / 1e9, fl / lt / 1e9, best / lt, coop, pp,
          coop_regs, lt_first, best / lt_first, best_b2b, coop_b2b, pp_b2b, lt_b2b,
          std::min({best_b2b, coop_b2b, pp_b2b}) / lt_b2b, width_b2b[0], width_b2b[1], width_b2b[2],
          group_b2b[0], group_b2b[1], group_b2b[2], group_b2b[3]);
      std::fflush(stdout);
    }
  }
  if (!only.empty()) return;  // the fused fc1 below only in the full table
  for (const Shape3& sh : {shapes[1], shapes[3]}) {
    const Tensor x = Tensor::randn({sh.m, sh.k}, g, DType::bf16, dev);
    const Tensor w = Tensor::randn({sh.n, sh.k}, g, DType::bf16, dev);
    const Tensor b = Tensor::randn({sh.n}, g, DType::bf16, dev);
    Tensor z = Tensor::empty({sh.m, sh.n}, DType::bf16, dev), hd = z.clone();
    const DropoutSpec d{0.1f, 7, 8};
    const double fused = median_ms(device, warmup, iters, [&] {
      cuda::sm90_gemm_nt_bias_act_dropout(x, w, b, Activation::gelu_tanh, d, hd, &z);
    });
    const double fused_coop = median_ms(device, warmup, iters, [&] {
      cuda::sm90_gemm_nt_bias_act_dropout(x, w, b, Activation::gelu_tanh, d, hd, &z,
                                          cuda::Sm90Schedule::cooperative);
    });
    const double fused_pp = median_ms(device, warmup, iters, [&] {
      cuda::sm90_gemm_nt_bias_act_dropout(x, w, b, Activation::gelu_tanh, d, hd, &z,
                                          cuda::Sm90Schedule::pingpong);
    });
    // Where the epilogue's time goes: without the dropout mask (no Philox), also without the
    // activation (identity: stores only), and without storing z.
    const double no_dropout = median_ms(device, warmup, iters, [&] {
      cuda::sm90_gemm_nt_bias_act_dropout(x, w, b, Activation::gelu_tanh, {}, hd, &z);
    });
    const double stores_only = median_ms(device, warmup, iters, [&] {
      cuda::sm90_gemm_nt_bias_act_dropout(x, w, b, Activation::identity, {}, hd, &z);
    });
    const double no_z = median_ms(device, warmup, iters, [&] {
      cuda::sm90_gemm_nt_bias_act_dropout(x, w, b, Activation::gelu_tanh, d, hd, nullptr);
    });
    const double unfused = median_ms(device, warmup, iters, [&] {
      gemm(x, w, z, {.trans_b = true});
      bias_act_dropout(z, b, Activation::gelu_tanh, d, hd);
    });
    const double bare = median_ms(device, warmup, iters, [&] { gemm(x, w, z, {.trans_b = true}); });
    std::printf("{\"fused_fc1\": \"%s\", \"ours_fused_ms\": %.4f, \"cublaslt_plus_kernel_ms\": "
                "%.4f, \"cublaslt_gemm_ms\": %.4f, \"fused_over_bare\": %.3f, "
                "\"fused_cooperative_ms\": %.4f, \"fused_pingpong_ms\": %.4f, "
                "\"fused_no_dropout_ms\": %.4f, \"fused_identity_no_dropout_ms\": %.4f, "
                "\"fused_without_z_ms\": %.4f}\n",
                sh.name, fused, unfused, bare, fused / bare, fused_coop, fused_pp, no_dropout,
                stores_only, no_z);
    std::fflush(stdout);
  }
}

// fc2 with output dropout (Note [Output dropout in the GEMM], kernels/bias_act_dropout.cpp):
// the Hopper GEMM with the bias and the mask in its epilogue (ping-pong, its default, and
// cooperative, what linear_dropout runs) against gemm() (the tuner's choice, as ffn_forward ran it)
// + bias_dropout and the bare gemm(), p = 0.1, at the workloads' fc2 shapes and two shorter K;
// the ratio printed is the cooperative form's (before session 43's final build: ping-pong's).
void out_dropout_bench(int device, int warmup, int iters) {
  const Device dev = Device::cuda(device);
  struct Fc2 {
    const char* name;
    int64_t m, n, k;
  };
  Generator g(41);
  for (const Fc2& sh :
       {Fc2{"ffn_d1024.fc2", 16384, 1024, 4096}, Fc2{"ffn_d4096.fc2", 8192, 4096, 16384},
        Fc2{"gpt2.fc2", 16384, 768, 3072}, Fc2{"k1024", 16384, 1024, 1024}}) {
    const Tensor x = Tensor::randn({sh.m, sh.k}, g, DType::bf16, dev);
    const Tensor w = Tensor::randn({sh.n, sh.k}, g, DType::bf16, dev, 0.0, 0.02);
    const Tensor b = Tensor::randn({sh.n}, g, DType::bf16, dev);
    Tensor z = Tensor::empty({sh.m, sh.n}, DType::bf16, dev), y = z.clone();
    if (!cuda::sm90_gemm_supported(x, w, y, false, true)) {
      std::fprintf(stderr, "ffn-bench: the output dropout rows need the Hopper GEMM (sm_90)\n");
      return;
    }
    const DropoutSpec d{0.1f, 1234, 0};
    auto t = [&](auto&& f) { return median_ms(device, warmup, iters, f); };
    using S = cuda::Sm90Schedule;
    const double fused = t(
        [&] { cuda::sm90_gemm_nt_bias_act_dropout(x, w, b, Activation::identity, d, y, nullptr); });
    const double fused_coop = t([&] {
      cuda::sm90_gemm_nt_bias_act_dropout(x, w, b, Activation::identity, d, y, nullptr,
                                          S::cooperative);
    });
    const double pair = t([&] {
      gemm(x, w, z, {.trans_b = true});
      bias_dropout(z, b, d, y);
    });
    const double bare = t([&] { gemm(x, w, z, {.trans_b = true}); });
    std::printf(
        "{\"out_dropout\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, \"p\": 0.1, "
        "\"fused_ms\": %.4f, \"fused_coop_ms\": %.4f, \"gemm_plus_pass_ms\": %.4f, "
        "\"bare_gemm_ms\": %.4f, \"fused_coop_over_pair\": %.3f}\n",
        sh.name, static_cast<long long>(sh.m), static_cast<long long>(sh.n),
        static_cast<long long>(sh.k), fused, fused_coop, pair, bare, fused_coop / pair);
    std::fflush(stdout);
  }
}

// Note [Activation epilogues] and Note [Activation warpgroup] against the unfused path, per
// fc1 shape (bf16): forward = fc1's GEMM + bias + activation (own fused: activation
// warpgroups, ping-pong and cooperative ActTma; cuBLASLt GEMM + bias_act_dropout(p = 0); the
// bare GEMMs), backward = dhd = dz2·W2 + the activation's gradient with hd recomputed (own
// fused, the activation warpgroups also with db1; cuBLASLt GEMM + bias_act_dropout_backward
// with db1; the bare GEMMs). Then GPT-2's weight
// gradients with the bias gradient through cuBLASLt's BGRADB against GEMM + bias_grad.
void act_epilogue_bench(int device, int warmup, int iters) {
  const CublasLtOnly cublaslt_only;
  const Device dev = Device::cuda(device);
  struct Fc1 {
    const char* name;
    int64_t m, h, d;  // tokens, hidden, model width
    Activation act;
    float p = 0.0f;  // hidden dropout: the activation warpgroups against the unfused pair only
  };
  const Fc1 shapes[] = {{"gpt2.fc1", 16384, 3072, 768, Activation::gelu_erf},
                        {"ffn_d1024.fc1", 16384, 4096, 1024, Activation::gelu_tanh},
                        {"ffn_d4096.fc1", 8192, 16384, 4096, Activation::gelu_tanh},
                        // gpt2's fc1 with the cheapest activation: how much of the fused
                        // kernels' time over the bare GEMM is the activation's arithmetic
                        {"gpt2.fc1", 16384, 3072, 768, Activation::silu},
                        // the workloads' hidden dropout (DESIGN.md: p = 0.1), and GPT-2's fc1
                        // with nanoGPT's fine-tuning dropout
                        {"ffn_d1024.fc1", 16384, 4096, 1024, Activation::gelu_tanh, 0.1f},
                        {"ffn_d4096.fc1", 8192, 16384, 4096, Activation::gelu_tanh, 0.1f},
                        {"gpt2.fc1", 16384, 3072, 768, Activation::gelu_erf, 0.1f},
                        // shakespeare_char's fc1 (d_model 384, below the fused kernels' K)
                        {"shakespeare_char.fc1", 16384, 1536, 384, Activation::gelu_erf}};
  Generator g(37);
  for (const Fc1& sh : shapes) {
    const Tensor x = Tensor::randn({sh.m, sh.d}, g, DType::bf16, dev);
    const Tensor w1 = Tensor::randn({sh.h, sh.d}, g, DType::bf16, dev, 0.0, 0.05);
    const Tensor b1 = Tensor::randn({sh.h}, g, DType::bf16, dev);
    const Tensor w2 = Tensor::randn({sh.d, sh.h}, g, DType::bf16, dev, 0.0, 0.05);
    const Tensor dz2 = Tensor::randn({sh.m, sh.d}, g, DType::bf16, dev);
    Tensor z = Tensor::empty({sh.m, sh.h}, DType::bf16, dev), hd = z.clone(), dz = z.clone();
    Tensor dhd = z.clone(), db1 = Tensor::empty({sh.h}, DType::bf16, dev);
    if (!cuda::sm90_gemm_act_supported(x, w1, false, sh.act, z)) {
      std::fprintf(stderr, "ffn-bench --act-epilogues: needs the Hopper GEMM (sm_90)\n");
      return;
    }
    auto t = [&](auto&& f) { return median_ms(device, warmup, iters, f); };
    using S = cuda::Sm90Schedule;
    if (sh.p > 0) {  // only the activation warpgroups take a mask
      const DropoutSpec d{sh.p, 1234, 0};
      const double f_aw =
          t([&] { cuda::sm90_gemm_nt_act(x, w1, b1, sh.act, d, z, hd, S::act_warpgroups); });
      const double f_unfused = t([&] {
        gemm(x, w1, z, {.trans_b = true});
        bias_act_dropout(z, b1, sh.act, d, hd);
      });
      const double f_bare = t([&] { cuda::sm90_gemm(x, w1, z, {.trans_b = true}); });
      const double b_aw_db = t([&] {
        cuda::sm90_gemm_nn_act_backward(dz2, w2, z, b1, sh.act, d, dz, hd, S::act_warpgroups, &db1);
      });
      const double b_unfused = t([&] {
        gemm(dz2, w2, dhd);
        bias_act_dropout_backward(dhd, z, b1, sh.act, d, dz, &db1, &hd);
      });
      const double b_bare = t([&] { cuda::sm90_gemm(dz2, w2, dhd); });
      std::printf(
          "{\"act_epilogue\": \"%s\", \"act\": \"%s\", \"p\": %.2f, "
          "\"fwd_act_warpgroups_ms\": %.4f, \"fwd_unfused_ms\": %.4f, "
          "\"fwd_bare_ours_ms\": %.4f, \"bwd_act_warpgroups_db_ms\": %.4f, "
          "\"bwd_unfused_ms\": %.4f, \"bwd_bare_ours_ms\": %.4f}\n",
          sh.name, activation_name(sh.act), sh.p, f_aw, f_unfused, f_bare, b_aw_db, b_unfused,
          b_bare);
      std::fflush(stdout);
      continue;
    }
    const double f_aw =
        t([&] { cuda::sm90_gemm_nt_act(x, w1, b1, sh.act, {}, z, hd, S::act_warpgroups); });
    const double f_pp =
        t([&] { cuda::sm90_gemm_nt_act(x, w1, b1, sh.act, {}, z, hd, S::pingpong); });
    const double f_coop =
        t([&] { cuda::sm90_gemm_nt_act(x, w1, b1, sh.act, {}, z, hd, S::cooperative); });
    const double f_unfused = t([&] {
      gemm(x, w1, z, {.trans_b = true});
      bias_act_dropout(z, b1, sh.act, {}, hd);
    });
    const double f_bare_lt = t([&] { gemm(x, w1, z, {.trans_b = true}); });
    const double f_bare_ours = t([&] { cuda::sm90_gemm(x, w1, z, {.trans_b = true}); });
    const double b_aw = t([&] {
      cuda::sm90_gemm_nn_act_backward(dz2, w2, z, b1, sh.act, {}, dz, hd, S::act_warpgroups);
    });
    const double b_aw_db = t([&] {
      cuda::sm90_gemm_nn_act_backward(dz2, w2, z, b1, sh.act, {}, dz, hd, S::act_warpgroups, &db1);
    });
    const double b_pp = t(
        [&] { cuda::sm90_gemm_nn_act_backward(dz2, w2, z, b1, sh.act, {}, dz, hd, S::pingpong); });
    const double b_coop = t([&] {
      cuda::sm90_gemm_nn_act_backward(dz2, w2, z, b1, sh.act, {}, dz, hd, S::cooperative);
    });
    const double b_unfused = t([&] {
      gemm(dz2, w2, dhd);
      bias_act_dropout_backward(dhd, z, b1, sh.act, {}, dz, &db1, &hd);
    });
    const double b_bare_lt = t([&] { gemm(dz2, w2, dhd); });
    const double b_bare_ours = t([&] { cuda::sm90_gemm(dz2, w2, dhd); });
    std::printf(
        "{\"act_epilogue\": \"%s\", \"act\": \"%s\", \"fwd_act_warpgroups_ms\": %.4f, "
        "\"fwd_fused_ms\": %.4f, \"fwd_fused_coop_ms\": %.4f, \"fwd_unfused_ms\": %.4f, "
        "\"fwd_bare_cublaslt_ms\": %.4f, \"fwd_bare_ours_ms\": %.4f, "
        "\"bwd_act_warpgroups_ms\": %.4f, \"bwd_act_warpgroups_db_ms\": %.4f, "
        "\"bwd_fused_ms\": %.4f, \"bwd_fused_coop_ms\": %.4f, \"bwd_unfused_ms\": %.4f, "
        "\"bwd_bare_cublaslt_ms\": %.4f, \"bwd_bare_ours_ms\": %.4f}\n",
        sh.name, activation_name(sh.act), f_aw, f_pp, f_coop, f_unfused, f_bare_lt, f_bare_ours,
        b_aw, b_aw_db, b_pp, b_coop, b_unfused, b_bare_lt, b_bare_ours);
    std::fflush(stdout);
  }
  // The gated FFN's fc1 (Note [GLU warpgroup]): the GLU on the activation warpgroups against
  // GEMM + bias_glu_dropout and the bare GEMM, at the GEGLU workloads' shapes; then its
  // backward's dhd product (with db1) against GEMM + bias_glu_dropout_backward.
  // llama_char's SwiGLU (d_model 384, no biases: b and db undefined, as the model runs it).
  for (const Fc1& sh : {Fc1{"geglu_d1024.fc1", 16384, 4096, 1024, Activation::gelu_tanh},
                        Fc1{"geglu_d2048.fc1", 16384, 8192, 2048, Activation::gelu_tanh},
                        Fc1{"llama_char.fc1", 16384, 1024, 384, Activation::silu}}) {
    const bool bias = sh.d >= 1024;
    const Tensor x = Tensor::randn({sh.m, sh.d}, g, DType::bf16, dev);
    const Tensor w = Tensor::randn({2 * sh.h, sh.d}, g, DType::bf16, dev, 0.0, 0.05);
    const Tensor b = bias ? Tensor::randn({2 * sh.h}, g, DType::bf16, dev) : Tensor();
    Tensor z = Tensor::empty({sh.m, 2 * sh.h}, DType::bf16, dev);
    Tensor out = Tensor::empty({sh.m, sh.h}, DType::bf16, dev);
    auto t = [&](auto&& f) { return median_ms(device, warmup, iters, f); };
    const double fused = t([&] { cuda::sm90_gemm_nt_glu(x, w, b, sh.act, {}, z, out); });
    const double unfused = t([&] {
      gemm(x, w, z, {.trans_b = true});
      bias_glu_dropout(z, b, sh.act, {}, out);
    });
    const double bare = t([&] { cuda::sm90_gemm(x, w, z, {.trans_b = true}); });
    const double bare_lt = t([&] { gemm(x, w, z, {.trans_b = true}); });
    // The backward's dhd = dz2·W2 product with dz, db1 and the recomputed out.
    const Tensor w2 = Tensor::randn({sh.d, sh.h}, g, DType::bf16, dev, 0.0, 0.05);
    const Tensor dz2 = Tensor::randn({sh.m, sh.d}, g, DType::bf16, dev);
    Tensor dz = z.clone(), dhd = out.clone(), db = bias ? b.clone() : Tensor();
    Tensor* dbp = bias ? &db : nullptr;
    const double b_fused =
        t([&] { cuda::sm90_gemm_nn_glu_backward(dz2, w2, z, b, sh.act, {}, dz, out, dbp); });
    const double b_unfused = t([&] {
      gemm(dz2, w2, dhd);
      bias_glu_dropout_backward(dhd, z, b, sh.act, {}, dz, dbp, &out);
    });
    const double b_bare = t([&] { cuda::sm90_gemm(dz2, w2, dhd); });
    const double b_bare_lt = t([&] { gemm(dz2, w2, dhd); });
    std::printf(
        "{\"glu_epilogue\": \"%s\", \"act\": \"%s\", \"bias\": %s, "
        "\"fwd_glu_warpgroups_ms\": %.4f, "
        "\"fwd_unfused_ms\": %.4f, \"fwd_bare_ours_ms\": %.4f, "
        "\"fwd_bare_cublaslt_ms\": %.4f, \"bwd_glu_warpgroups_db_ms\": %.4f, "
        "\"bwd_unfused_ms\": %.4f, \"bwd_bare_ours_ms\": %.4f, \"bwd_bare_cublaslt_ms\": %.4f}\n",
        sh.name, activation_name(sh.act), bias ? "true" : "false", fused, unfused, bare, bare_lt,
        b_fused, b_unfused, b_bare, b_bare_lt);
    std::fflush(stdout);
  }
  // Bias gradients: dW = dyᵀ·x with db = Σ_rows dy in the same cuBLASLt call (BGRADB)
  // against the GEMM followed by bias_grad (what ffn-train ran before).
  struct Wgrad {
    const char* name;
    int64_t m, n, k;  // tokens, out, in
  };
  for (const Wgrad& sh :
       {Wgrad{"gpt2.qkv", 16384, 2304, 768}, Wgrad{"gpt2.proj", 16384, 768, 768},
        Wgrad{"gpt2.fc1", 16384, 3072, 768}, Wgrad{"gpt2.fc2", 16384, 768, 3072}}) {
    const Tensor dy = Tensor::randn({sh.m, sh.n}, g, DType::bf16, dev);
    const Tensor x = Tensor::randn({sh.m, sh.k}, g, DType::bf16, dev);
    Tensor dw = Tensor::empty({sh.n, sh.k}, DType::bf16, dev),
           db = Tensor::empty({sh.n}, DType::bf16, dev);
    const bool tuned = gemm_autotune();
    set_gemm_autotune(false);  // what ffn-train ran before session 18 (Note [GEMM choices])
    const double apart = median_ms(device, warmup, iters, [&] {
      gemm(dy, x, dw, {.trans_a = true});
      bias_grad(dy, db);
    });
    const double with = median_ms(device, warmup, iters, [&] {
      gemm(dy, x, dw, {.trans_a = true, .epilogue = GemmEpilogue::bgrad_a, .bias_grad = db});
    });
    const double bare =
        median_ms(device, warmup, iters, [&] { gemm(dy, x, dw, {.trans_a = true}); });
    set_gemm_autotune(tuned);
    std::printf(
        "{\"bgrad\": \"%s.wgrad\", \"m\": %lld, \"n\": %lld, \"k\": %lld, "
        "\"gemm_plus_bias_grad_ms\": %.4f, \"gemm_bgradb_ms\": %.4f, \"bare_gemm_ms\": %.4f}\n",
        sh.name, static_cast<long long>(sh.n), static_cast<long long>(sh.k),
        static_cast<long long>(sh.m), apart, with, bare);
    std::fflush(stdout);
  }
}

int main(int argc, char** argv) {
  CLI::App app{
      "ffn-bench: time fused FFN forward+backward against the bare GEMMs of the same shapes"};
  std::vector<std::string> only;
  int iters = 30, warmup = 5, device = 0;
  bool recompute = false, kernels = false, epilogues = false, gemm_table = false;
  app.add_option("--workload", only, "Run only these workloads (default: all)");
  app.add_option("--iters", iters, "Timed iterations (median is reported)")
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "Untimed warm-up iterations")->check(CLI::NonNegativeNumber);
  app.add_option("--window-ms", bench::window_ms(),
                 "Each timed loop runs at least this long (Note [Timing window] in "
                 "bench/timing.h; 0: exactly --iters runs)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--device", device, "CUDA device index")->check(CLI::NonNegativeNumber);
  app.add_flag("--recompute", recompute, "Recompute z = x·W1ᵀ in backward instead of saving it");
  app.add_flag("--kernels", kernels, "Also time each fused elementwise kernel alone (GB/s)");
  app.add_flag(
      "--epilogues", epilogues,
      "Also time cuBLASLt epilogues against our kernels where one could replace the other");
  bool xent = false;
  app.add_flag("--xent", xent, "Only the GPT-2 classifier's cross-entropy (forward, backward)");
  bool optimizer = false;
  app.add_flag("--optimizer", optimizer, "Only GPT-2's optimizer step (grad norm, AdamW)");
  bool norm = false;
  app.add_flag(
      "--norm", norm,
      "Only the residual add and norm of GPT-2 and the char models (forward, backward; and "
      "in the branch GEMM's epilogue; and a Llama attention branch with its RMSNorm folded "
      "into the QKV GEMM, against unfolded)");
  app.add_flag("--gemm", gemm_table,
               "Only the GEMM table: our Hopper GEMM against cuBLASLt on the workloads' shapes");
  std::string gemm_only;
  app.add_option("--gemm-only", gemm_only,
                 "With --gemm: only the products whose name contains this (e.g. wgrad)");
  std::string gemm_variant;
  app.add_option("--gemm-variant", gemm_variant,
                 "With --gemm: time only this one, back to back (for long windows beside a clock "
                 "and power sampler)")
      ->check(CLI::IsMember({"cooperative", "pingpong", "auto", "cublaslt"}));
  bool act_epilogues = false;
  app.add_flag(
      "--act-epilogues", act_epilogues,
      "Only the activation epilogues and bias-gradient epilogues against the unfused path");
  bool out_dropout = false;
  app.add_flag("--out-dropout", out_dropout,
               "Only fc2 with output dropout: in the Hopper GEMM's epilogue against GEMM + pass");
  bool rms_fold_only = false;
  std::string rms_fold_variant = "both", rms_fold_case;
  app.add_flag("--rms-fold", rms_fold_only,
               "Only a Llama attention branch with its RMSNorm folded into the QKV GEMM against "
               "unfolded (also part of --norm)");
  app.add_option("--rms-fold-variant", rms_fold_variant,
                 "With --rms-fold: both (alternated twice), or only on or off (for a profiler)")
      ->check(CLI::IsMember({"both", "on", "off"}));
  app.add_option("--rms-fold-case", rms_fold_case,
                 "With --rms-fold: only the cases whose name contains this");
  bool attention = false;
  float attention_dropout = 0.0f;
  app.add_flag("--attention", attention,
               "Only the fused attention kernels (mma.sync and Hopper) at the GPT shapes");
  app.add_option("--attention-dropout", attention_dropout, "Attention dropout p for --attention")
      ->check(CLI::Range(0.0, 1.0));
  // The GEMM autotuner's choices across processes (Note [GEMM choices]): a profiler that
  // serializes kernels (ncu) would time the candidates wrongly, so it restores the choices of a
  // normal run of the same binary instead of timing them itself.
  std::string choices_out, choices_in;
  app.add_option("--gemm-choices-out", choices_out,
                 "Write the GEMM autotuner's choices to this file at exit");
  app.add_option("--gemm-choices-in", choices_in,
                 "Run the GEMM choices in this file (from --gemm-choices-out) instead of timing")
      ->check(CLI::ExistingFile);
  CLI11_PARSE(app, argc, argv);

  try {
    if (cuda_device_count() == 0) {
      std::fprintf(stderr, "ffn-bench: needs a GPU: %s\n", cuda_unavailable_reason().c_str());
      return 1;
    }
    const Device dev = Device::cuda(device);
    const auto& props = cuda::properties(device);
    if (!choices_in.empty()) {
      std::ifstream in(choices_in);
      const std::string text{std::istreambuf_iterator<char>(in), {}};
      const RestoredGemmChoices r = restore_gemm_choices(text, choices_in);
      FFN_CHECK(r.skipped.empty(), "[ffn-bench] --gemm-choices-in ", choices_in,
                " was not restored: ", r.skipped);
      std::fprintf(stderr, "ffn-bench: %lld GEMM choices restored from %s\n",
                   static_cast<long long>(r.count), choices_in.c_str());
    }
    // Written at the end of a successful run, whichever mode ran.
    struct ChoicesWriter {
      const std::string& path;
      ~ChoicesWriter() {
        if (path.empty() || std::uncaught_exceptions() > 0) return;
        std::ofstream(path) << gemm_choices();
      }
    } choices_writer{choices_out};
    if (optimizer) {
      bench::optimizer_bench(device, warmup, iters);
      return 0;
    }
    if (norm) {
      bench::norm_bench(device, warmup, iters);
      bench::norm_epilogue_bench(device, warmup, iters);
      bench::rms_fold_bench(device, warmup, iters);
      return 0;
    }
    if (rms_fold_only) {
      bench::rms_fold_bench(device, warmup, iters, rms_fold_variant, rms_fold_case);
      return 0;
    }
    if (xent) {
      bench::xent_bench(device, warmup, iters);
      return 0;
    }
    if (attention) {
      bench::attention_bench(device, warmup, iters, attention_dropout);
      return 0;
    }
    if (out_dropout) {
      out_dropout_bench(device, warmup, iters);
      return 0;
    }
    if (act_epilogues) {
      act_epilogue_bench(device, warmup, iters);
      out_dropout_bench(device, warmup, iters);
      return 0;
    }
    if (gemm_table) {
      gemm_comparison(device, warmup, iters, gemm_only, gemm_variant);
      return 0;
    }
    for (const auto& w : bench::workloads()) {
      if (!only.empty() && std::find(only.begin(), only.end(), w.name) == only.end()) continue;
      Generator g(1234);
      const Inputs in = make_inputs(w, dev, g);
      const FfnConfig cfg{w.act, w.gated, recompute && w.h1 > 0};
      Generator drop(99);
      auto step = [&]() {
        const FfnDropout d{drop.dropout(w.p_hidden), drop.dropout(w.p_out)};
        FfnForward f = ffn_forward(in.x, in.p, cfg, d);
        ffn_backward(in.dy, in.x, f, in.p, cfg, d, true);
        return f.z.defined() ? f.z.nbytes() : size_t{0};
      };
      size_t saved = step();
      cuda::synchronize(device);
      reset_peak_memory(dev);
      const size_t base = memory_stats(dev).in_use;
      const double ms = median_ms(device, warmup, iters, [&] { saved = step(); });
      const size_t peak = memory_stats(dev).peak - base;
      // Where a step's time goes besides the GPU's work: the host's time to enqueue it (no
      // wait; median), and the step timed four back to back, its launch hidden as in training.
      std::vector<double> host;
      for (int i = 0; i < iters; ++i) {
        cuda::synchronize(device);
        const auto t0 = std::chrono::steady_clock::now();
        step();
        host.push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count());
      }
      cuda::synchronize(device);
      std::sort(host.begin(), host.end());
      const double host_ms = host[host.size() / 2];
      const double b2b_ms = bench::back_to_back_ms(device, 0, iters, [&] { step(); });

      // The floor: the same GEMMs into preallocated outputs, nothing else.
      const int64_t hidden = w.h1 ? (w.gated ? w.h1 / 2 : w.h1) : w.d;
      Tensor z = w.h1 ? Tensor::empty({w.m, w.h1}, w.dtype, dev) : Tensor();
      const Tensor hd = Tensor::randn({w.m, hidden}, g, w.dtype, dev);  // random, never zeros
      const Tensor dz = w.h1 ? Tensor::randn({w.m, w.h1}, g, w.dtype, dev) : Tensor();
      Tensor y = w.d_out ? Tensor::empty({w.m, w.d_out}, w.dtype, dev) : Tensor();
      Tensor dhd = Tensor::empty({w.m, hidden}, w.dtype, dev);
      Tensor dw2 = w.d_out ? Tensor::empty({w.d_out, hidden}, w.dtype, dev) : Tensor();
      Tensor dw1 = w.h1 ? Tensor::empty({w.h1, w.d}, w.dtype, dev) : Tensor();
      Tensor dx = Tensor::empty({w.m, w.d}, w.dtype, dev);
      const double floor_ms = median_ms(device, warmup, iters, [&] {
        if (w.h1) gemm(in.x, in.p.w1, z, {.trans_b = true});
        if (w.d_out) {
          gemm(hd, in.p.w2, y, {.trans_b = true});
          gemm(in.dy, in.p.w2, dhd);
          gemm(in.dy, hd, dw2, {.trans_a = true});
        }
        if (w.h1) {
          gemm(dz, in.x, dw1, {.trans_a = true});
          gemm(dz, in.p.w1, dx);
        }
      });
      const double flops = bench::gemm_flops(w);
      std::printf(
          "{\"workload\": \"%s\", \"dtype\": \"%s\", \"device\": \"%s\", \"iters\": %d, "
          "\"window_ms\": %.0f, "
          "\"recompute\": %s, \"ms\": %.4f, \"gemm_floor_ms\": %.4f, \"ratio_to_floor\": %.3f, "
          "\"tflops\": %.1f, \"floor_tflops\": %.1f, \"saved_bytes\": %zu, \"peak_bytes\": %zu, "
          "\"host_ms\": %.4f, \"back_to_back_ms\": %.4f}\n",
          w.name.c_str(), dtype_name(w.dtype), props.name, iters, bench::window_ms(),
          cfg.recompute ? "true" : "false", ms, floor_ms, ms / floor_ms, flops / ms / 1e9,
          flops / floor_ms / 1e9, saved, peak, host_ms, b2b_ms);
      std::fflush(stdout);
      if (kernels) kernel_breakdown(w, device, warmup, iters);
      if (epilogues) epilogue_comparison(w, device, warmup, iters);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "ffn-bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
