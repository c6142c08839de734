// bench/gemm_bench.cpp — ffn-bench's GEMM comparisons (bench/gemm_bench.h): the own Hopper
// GEMM against cuBLASLt product by product, and the fused epilogues (fc1's activation and
// its backward, fc2's output dropout) against the GEMM followed by the elementwise pass.
// Timing as everywhere in ffn-bench (bench/timing.h).
#include "bench/gemm_bench.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/timing.h"
#include "core/cuda/context.h"
#include "core/generator.h"
#include "kernels/bias_act_dropout.h"
#include "kernels/bias_glu_dropout.h"
#include "kernels/cuda/gemm/sm90_gemm.h"

namespace ffn::bench {

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

}  // namespace ffn::bench
