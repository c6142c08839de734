// bench/gpt_ops_bench.cpp — the single-op benchmarks of a GPT-2 step (bench/gpt_ops_bench.h):
// the classifier's cross-entropy and the whole fused classifier, the residual add and
// LayerNorm, the optimizer step, the fused attention kernels.
#include "bench/gpt_ops_bench.h"

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/timing.h"
#include "core/generator.h"
#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/bias_act_dropout.h"
#include "kernels/cross_entropy.h"
#include "kernels/cuda/attention_sm90.h"
#include "kernels/cuda/gemm/sm90_gemm.h"
#include "kernels/gemm.h"
#include "kernels/layer_norm.h"
#include "layers/functional.h"

namespace ffn::bench {

// The GPT-2 classifier's softmax cross-entropy, forward + backward, on bf16 logits of the
// padded vocabulary (B·T = 16384 rows of 50304, 50257 classes): ms and the bytes the two
// passes must move (logits read twice, d_logits written once) per second.
void xent_bench(int device, int warmup, int iters) {
  const Device dev = Device::cuda(device);
  const int64_t n = 16384, v = 50304, c = 50257;
  Generator g(5);
  const Tensor logits = Tensor::randn({n, v}, g, DType::bf16, dev, 0.0, 2.0);
  std::vector<double> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    ids[static_cast<size_t>(i)] = static_cast<double>((i * 7919) % c);
  const Tensor t = Tensor::from_vector(ids, {n}, DType::i32, dev);
  Tensor loss = Tensor::empty({}, DType::f32, dev), lse = Tensor::empty({n}, DType::f32, dev);
  Tensor dl = Tensor::empty({n, v}, DType::bf16, dev);
  const Tensor one = Tensor::full({}, 1.0, DType::f32, dev);
  const double fwd =
      median_ms(device, warmup, iters, [&] { cross_entropy(logits, t, loss, lse, false, c); });
  const double bwd = median_ms(device, warmup, iters,
                               [&] { cross_entropy_backward(logits, t, lse, one, dl, c); });
  const double bytes = static_cast<double>(n * v * 2);
  Tensor inout = logits.clone(), rows = Tensor::empty({n}, DType::f32, dev);
  const double fused = median_ms(device, warmup, iters, [&] {
    inout.copy_(logits);  // timed apart below and subtracted: the kernel overwrites its input
    cross_entropy_rows(inout, t, rows, false, c, 1.0 / static_cast<double>(n));
  });
  const double copy = median_ms(device, warmup, iters, [&] { inout.copy_(logits); });
  std::printf(
      "{\"xent\": \"gpt2 %lldx%lld bf16, %lld classes\", \"forward_ms\": %.4f, "
      "\"backward_ms\": %.4f, \"forward_gbps\": %.0f, \"backward_gbps\": %.0f, "
      "\"rows_with_grad_ms\": %.4f, \"rows_gbps\": %.0f}\n",
      static_cast<long long>(n), static_cast<long long>(v), static_cast<long long>(c), fwd, bwd,
      bytes / fwd / 1e6, 2 * bytes / bwd / 1e6, fused - copy, 2 * bytes / (fused - copy) / 1e6);
  std::fflush(stdout);

  // The whole classifier (LM-head GEMM, loss, dx and dw), forward + backward through
  // autograd: the unfused pair against fn::linear_cross_entropy at several chunk sizes. Memory
  // is the peak of live tensors above what x, w and the targets hold.
  const Tensor x = Tensor::randn({n, 768}, g, DType::bf16, dev, 0.0, 1.0);
  const Tensor w = Tensor::randn({v, 768}, g, DType::bf16, dev, 0.0, 0.02);
  auto classifier = [&](int64_t chunk) {  // chunk < 0: unfused
    Var xv(x, true), wv(w, true);
    const Var l = chunk < 0 ? fn::cross_entropy(fn::linear(xv, wv, Var()), t, false, c)
                            : fn::linear_cross_entropy(xv, wv, t, false, c, chunk);
    l.backward();
  };
  double unfused_ms = 0;
  for (int64_t chunk : {int64_t{-1}, int64_t{0}, int64_t{8192}, int64_t{4096}, int64_t{2048}}) {
    classifier(chunk);
    cuda::synchronize(device);
    const size_t base = memory_stats(dev).in_use;
    reset_peak_memory(dev);
    classifier(chunk);
    cuda::synchronize(device);
    const size_t peak = memory_stats(dev).peak - base;
    const double ms = median_ms(device, warmup, iters, [&] { classifier(chunk); });
    if (chunk < 0) unfused_ms = ms;
    std::printf(
        "{\"classifier\": \"%s\", \"chunk_rows\": %lld, \"ms\": %.4f, "
        "\"over_unfused\": %.3f, \"peak_bytes\": %zu}\n",
        chunk < 0 ? "unfused" : "fused", static_cast<long long>(chunk < 0 ? n : chunk), ms,
        ms / unfused_ms, peak);
    std::fflush(stdout);
  }
}

// The residual add and norm of a GPT-2 block (B·T = 16384 rows of 768, fp32 residual
// stream, bf16 weights) and of the char models' (rows of 384: shakespeare_char's LayerNorm
// and llama_char's RMSNorm, with their dropout), as the trainer runs them (Note [Residual add and
// norm]): forward add_layer_norm (reads x and h, writes a and y: 12 bytes an element), backward the
// norm's gradient added into the stream's, the branch's gradient and its column sums with dw and db
// (reads dy, a and dx, writes dx and dh: 16 bytes an element). ms and those bytes per second.
void norm_bench(int device, int warmup, int iters) {
  const Device dev = Device::cuda(device);
  struct Shape2 {
    const char* name;
    int64_t c;
    bool rms, bias;
    float p;  // the residual branch's dropout
  };
  // gpt2_small's LayerNorm (biases: dh's column sums too), shakespeare_char's (no biases,
  // dropout 0.2) and llama_char's RMSNorm (dropout 0.3), 16384 rows each.
  for (const Shape2& sh : {Shape2{"gpt2 add+layer_norm", 768, false, true, 0.0f},
                           Shape2{"shakespeare_char add+layer_norm", 384, false, false, 0.2f},
                           Shape2{"llama_char add+rms_norm", 384, true, false, 0.3f}}) {
    const int64_t n = 16384, c = sh.c;
    Generator g(11);
    const Tensor x = Tensor::randn({n, c}, g, DType::f32, dev, 0.0, 1.0);
    const Tensor h = Tensor::randn({n, c}, g, DType::bf16, dev, 0.0, 1.0);
    const Tensor w = Tensor::randn({c}, g, DType::bf16, dev, 1.0, 0.1);
    const Tensor b = sh.bias ? Tensor::randn({c}, g, DType::bf16, dev, 0.0, 0.1) : Tensor();
    Tensor a = Tensor::empty({n, c}, DType::f32, dev), y = Tensor::empty({n, c}, DType::bf16, dev);
    Tensor mean = sh.rms ? Tensor() : Tensor::empty({n}, DType::f32, dev);
    Tensor rstd = Tensor::empty({n}, DType::f32, dev);
    const DropoutSpec d = sh.p > 0 ? DropoutSpec{sh.p, 5, 0} : DropoutSpec{};
    const double fwd = median_ms(device, warmup, iters,
                                 [&] { add_layer_norm(x, h, d, w, b, 1e-5, a, y, mean, rstd); });
    const Tensor dy = Tensor::randn({n, c}, g, DType::bf16, dev, 0.0, 1.0);
    Tensor dx = Tensor::randn({n, c}, g, DType::f32, dev, 0.0, 1.0);
    Tensor dw = Tensor::empty({c}, DType::bf16, dev), db = Tensor::empty({c}, DType::bf16, dev);
    Tensor dh = Tensor::empty({n, c}, DType::bf16, dev),
           dh_sum = Tensor::empty({c}, DType::bf16, dev);
    const BranchGrad branch{&dh, d, sh.bias ? &dh_sum : nullptr};
    const double bwd = median_ms(device, warmup, iters, [&] {
      if (sh.rms)
        rms_norm_backward(dy, a, w, rstd, &dx, &dw, true, &branch);
      else
        layer_norm_backward(dy, a, w, mean, rstd, &dx, &dw, sh.bias ? &db : nullptr, true, &branch);
    });
    const double e = static_cast<double>(n * c);
    std::printf(
        "{\"norm\": \"%s %lldx%lld, fp32 stream, bf16, p %.1f\", \"forward_ms\": %.4f, "
        "\"forward_gbps\": %.0f, \"backward_ms\": %.4f, \"backward_gbps\": %.0f}\n",
        sh.name, static_cast<long long>(n), static_cast<long long>(c), sh.p, fwd,
        12 * e / fwd / 1e6, bwd, 16 * e / bwd / 1e6);
    std::fflush(stdout);
  }
}

// Note [Residual add and norm in the epilogue]: the branch GEMM that ends in the add and the
// next norm (linear_add_layer_norm) against what runs without it, the product through gemm()
// (the tuned choice of cuBLASLt and the own GEMM, as the trainer runs it) then
// add_layer_norm, and against that product alone; 16384 rows, the fused kernel in each tile
// width that divides the row. ms, and the fused one's ratio to the pair.
void norm_epilogue_bench(int device, int warmup, int iters) {
  const Device dev = Device::cuda(device);
  struct Case {
    const char* name;
    int64_t k, c;
    bool rms, bias;
    float p;
  };
  for (const Case& cs : {Case{"gpt2 c_proj + ln", 768, 768, false, true, 0.0f},
                         Case{"gpt2 fc2 + ln", 3072, 768, false, true, 0.0f},
                         Case{"shakespeare_char c_proj + ln", 384, 384, false, false, 0.2f},
                         Case{"llama_char o_proj + rms", 384, 384, true, false, 0.3f},
                         Case{"llama_char down_proj + rms", 1024, 384, true, false, 0.3f}}) {
    const int64_t n = 16384, c = cs.c;
    Generator g(12);
    const Tensor xin = Tensor::randn({n, cs.k}, g, DType::bf16, dev, 0.0, 1.0);
    const Tensor wl = Tensor::randn({c, cs.k}, g, DType::bf16, dev, 0.0, 0.02);
    const Tensor bl = cs.bias ? Tensor::randn({c}, g, DType::bf16, dev, 0.0, 0.1) : Tensor();
    const Tensor x = Tensor::randn({n, c}, g, DType::f32, dev, 0.0, 1.0);
    const Tensor w = Tensor::randn({c}, g, DType::bf16, dev, 1.0, 0.1);
    const Tensor b = cs.bias ? Tensor::randn({c}, g, DType::bf16, dev, 0.0, 0.1) : Tensor();
    Tensor h = Tensor::empty({n, c}, DType::bf16, dev);
    Tensor a = Tensor::empty({n, c}, DType::f32, dev), y = Tensor::empty({n, c}, DType::bf16, dev);
    Tensor mean = cs.rms ? Tensor() : Tensor::empty({n}, DType::f32, dev);
    Tensor rstd = Tensor::empty({n}, DType::f32, dev);
    const DropoutSpec d = cs.p > 0 ? DropoutSpec{cs.p, 5, 0} : DropoutSpec{};
    const GemmArgs args{.trans_b = true, .bias = bl};
    const double gemm_ms = median_ms(device, warmup, iters, [&] { gemm(xin, wl, h, args); });
    const double pair = median_ms(device, warmup, iters, [&] {
      gemm(xin, wl, h, args);
      add_layer_norm(x, h, d, w, b, 1e-5, a, y, mean, rstd);
    });
    std::printf(
        "{\"norm_epilogue\": \"%s, %lldx%lld <- K %lld, p %.1f\", \"gemm_ms\": %.4f, "
        "\"gemm_then_norm_ms\": %.4f",
        cs.name, static_cast<long long>(n), static_cast<long long>(c), static_cast<long long>(cs.k),
        cs.p, gemm_ms, pair);
    for (int tile : {0, 128, 192}) {
      if (tile > 0 && (c % tile != 0 || c / tile < 2 || c / tile > 4)) continue;
      if (!cuda::sm90_gemm_add_norm_supported(xin, wl, x, a, y)) break;
      const double fused = median_ms(device, warmup, iters, [&] {
        cuda::sm90_gemm_nt_add_norm(xin, wl, bl, x, d, w, b, 1e-5, a, y, mean, rstd, tile);
      });
      std::printf(", \"fused_tile%d_ms\": %.4f, \"fused_tile%d_over_pair\": %.3f", tile, fused,
                  tile, fused / pair);
    }
    std::printf("}\n");
    std::fflush(stdout);
  }
}

// Note [RMSNorm folded into the QKV GEMM] (layers/attention.cpp) and Note [RMSNorm folded
// into the FFN] (layers/ffn_nodes.cpp): a Llama block's attention branch and its MLP branch
// with a 16-bit residual stream, forward and backward through autograd, a = res + dropout(h)
// (its add), out = a + attention(rope(rms_norm(a)·Wᵀ)) or a + swiglu_ffn(rms_norm(a)), with
// rms_fold() on (the norm folded into the QKV GEMM or fc1) and off (add_layer_norm writes y),
// alternated twice.
void rms_fold_bench(int device, int warmup, int iters, const std::string& variant,
                    const std::string& only) {
  const Device dev = Device::cuda(device);
  struct Case {
    const char* name;
    int64_t b, t, c, h, hidden;
    float p;
  };
  const bool fold = rms_fold();
  for (const Case& cs : {Case{"llama_char", 64, 256, 384, 6, 1024, 0.3f},
                         Case{"d768 (gpt2-sized)", 16, 1024, 768, 12, 2048, 0.0f},
                         Case{"d2048", 4, 1024, 2048, 32, 5632, 0.0f}})
    for (const bool mlp : {false, true}) {
      const std::string name = std::string(mlp ? "mlp " : "attention ") + cs.name;
      if (!only.empty() && name.find(only) == std::string::npos) continue;
      Generator g(13);
      const Shape sh{cs.b, cs.t, cs.c};
      const Tensor res = Tensor::randn(sh, g, DType::bf16, dev, 0.0, 1.0);
      const Tensor h = Tensor::randn(sh, g, DType::bf16, dev, 0.0, 1.0);
      const Tensor gain = Tensor::randn({cs.c}, g, DType::bf16, dev, 1.0, 0.1);
      const Tensor w = Tensor::randn({3 * cs.c, cs.c}, g, DType::bf16, dev, 0.0, 0.02);
      const Tensor w1 = Tensor::randn({2 * cs.hidden, cs.c}, g, DType::bf16, dev, 0.0, 0.02);
      const Tensor w2 = Tensor::randn({cs.c, cs.hidden}, g, DType::bf16, dev, 0.0, 0.02);
      const Tensor dy = Tensor::randn(sh, g, DType::bf16, dev, 0.0, 1.0);
      const DropoutSpec d = cs.p > 0 ? DropoutSpec{cs.p, 5, 0} : DropoutSpec{};
      const FfnConfig swiglu{Activation::silu, true, false};
      auto step = [&] {
        Var rv(res, true), hv(h, true), gv(gain, true), wv(w, true), w1v(w1, true), w2v(w2, true);
        if (rms_fold()) {
          const auto [a, rstd] = fn::add_rms_stats(rv, hv, d, gv, 1e-5);
          const Var y =
              mlp ? fn::rms_norm_ffn(a, gv, rstd, 1e-5, w1v, Var(), w2v, Var(), swiglu, {})
                  : fn::rms_norm_rope_attention(a, gv, rstd, 1e-5, wv, cs.h, 10000.0, d);
          fn::add(a, y).backward(dy);
        } else {
          const auto [a, an] = fn::add_layer_norm(rv, hv, d, gv, Var(), 1e-5, /*rms=*/true);
          const Var y = mlp ? fn::ffn(an, w1v, Var(), w2v, Var(), swiglu, {})
                            : fn::rope_attention(an, wv, cs.h, 10000.0, d);
          fn::add(a, y).backward(dy);
        }
      };
      if (variant != "both") {
        set_rms_fold(variant == "on");
        std::printf("{\"rms_fold\": \"%s\", \"%s_ms\": %.4f}\n", name.c_str(),
                    variant == "on" ? "folded" : "unfused", median_ms(device, warmup, iters, step));
        std::fflush(stdout);
        continue;
      }
      double ms[2][2];
      for (int r = 0; r < 2; ++r)
        for (int on = 0; on < 2; ++on) {
          set_rms_fold(on == 1);
          ms[r][on] = median_ms(device, warmup, iters, step);
        }
      // The most the step holds at once beyond what was allocated before it (the graph's saved
      // tensors among it), one step each way.
      long long peak[2];
      for (int on = 0; on < 2; ++on) {
        set_rms_fold(on == 1);
        cuda::synchronize(device);
        const size_t before = memory_stats(dev).in_use;
        reset_peak_memory(dev);
        step();
        cuda::synchronize(device);
        peak[on] = static_cast<long long>(memory_stats(dev).peak - before);
      }
      std::printf(
          "{\"rms_fold\": \"%s, B %lld T %lld C %lld heads %lld hidden %lld, p %.1f\", "
          "\"unfused_ms\": [%.4f, %.4f], \"folded_ms\": [%.4f, %.4f], \"folded_over_unfused\": "
          "%.3f, \"unfused_step_peak_bytes\": %lld, \"folded_step_peak_bytes\": %lld}\n",
          name.c_str(), static_cast<long long>(cs.b), static_cast<long long>(cs.t),
          static_cast<long long>(cs.c), static_cast<long long>(cs.h),
          static_cast<long long>(cs.hidden), cs.p, ms[0][0], ms[1][0], ms[0][1], ms[1][1],
          (ms[0][1] + ms[1][1]) / (ms[0][0] + ms[1][0]), peak[0], peak[1]);
      std::fflush(stdout);
    }
  set_rms_fold(fold);
}

// The optimizer step of GPT-2 124M (bf16 parameters, fp32 master weights and moments,
// padded vocabulary): the global gradient norm and the AdamW update, ms and the bytes the
// update must move (read g, w, m, v; write w, m, v and the bf16 parameter: 28 per value)
// per second.
void optimizer_bench(int device, int warmup, int iters) {
  const Device dev = Device::cuda(device);
  std::vector<Shape> shapes = {{50304, 768}, {1024, 768}};
  for (int l = 0; l < 12; ++l)
    for (const Shape& sh : std::vector<Shape>{{768},
                                              {768},
                                              {2304, 768},
                                              {2304},
                                              {768, 768},
                                              {768},
                                              {768},
                                              {768},
                                              {3072, 768},
                                              {3072},
                                              {768, 3072},
                                              {768}})
      shapes.push_back(sh);
  shapes.push_back({768});
  shapes.push_back({768});
  Generator g(7);
  std::vector<AdamWSlot> slots;
  std::vector<Tensor> grads;
  int64_t n = 0;
  for (const Shape& sh : shapes) {
    AdamWSlot s;
    s.param = Tensor::randn(sh, g, DType::bf16, dev, 0.0, 0.02);
    s.grad = Tensor::randn(sh, g, DType::bf16, dev, 0.0, 1e-3);
    s.master = s.param.to(DType::f32);
    s.m = Tensor::zeros(sh, DType::f32, dev);
    s.v = Tensor::zeros(sh, DType::f32, dev);
    s.decay = sh.size() == 2;
    n += s.param.numel();
    grads.push_back(s.grad);
    slots.push_back(std::move(s));
  }
  const AdamWHyper h{.lr = 6e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  int64_t step = 1;
  const double adamw = median_ms(device, warmup, iters, [&] { adamw_step(slots, h, step++, 1.0); });
  const double norm = median_ms(device, warmup, iters, [&] { (void)global_grad_sumsq(grads); });
  std::printf(
      "{\"optimizer\": \"gpt2 124M, %lld values in %zu tensors\", \"adamw_ms\": %.4f, "
      "\"adamw_gbps\": %.0f, \"grad_sumsq_ms\": %.4f}\n",
      static_cast<long long>(n), slots.size(), adamw, 28.0 * n / adamw / 1e6, norm);
  std::fflush(stdout);
}

// The fused causal attention (kernels/attention.h) at the models' shapes, each CUDA
// implementation forward and backward: ms and TFLOP/s of the causal products (forward 2,
// backward 5 of 2·T²·D/2 per head; the mma.sync backward computes 7, the Hopper one 5,
// Note [Attention backward in one pass]); and the QKV bias gradient summed inside the
// backward against the column-sum pass it replaces.
void attention_bench(int device, int warmup, int iters, float p_drop) {
  const Device dev = Device::cuda(device);
  struct Shape {
    const char* name;
    int64_t b, t, h, d;
  };
  for (const Shape sh : {Shape{"gpt2_small", 16, 1024, 12, 64}, Shape{"gpt2_t512", 32, 512, 12, 64},
                         Shape{"shakespeare_char", 64, 256, 6, 64}}) {
    Generator g(9);
    const int64_t c = sh.h * sh.d;
    const Tensor qkv = Tensor::randn({sh.b, sh.t, 3 * c}, g, DType::bf16, dev);
    const Tensor dy = Tensor::randn({sh.b, sh.t, c}, g, DType::bf16, dev);
    Tensor y = Tensor::empty({sh.b, sh.t, c}, DType::bf16, dev);
    Tensor lse = Tensor::empty({sh.b * sh.h, sh.t}, DType::f32, dev);
    Tensor dqkv = Tensor::empty(qkv.shape(), DType::bf16, dev);
    Tensor dqkv2 = dqkv.view_2d(), db = Tensor::empty({3 * c}, DType::bf16, dev);
    const double scale = 1.0 / std::sqrt(static_cast<double>(sh.d));
    const DropoutSpec d{p_drop, 7, 0};
    // One causal product: 2·T²·D/2 a head (before session 36 this was twice that, so the
    // TFLOP/s printed were twice the true ones; the times were right).
    const double flop = static_cast<double>(sh.b * sh.h) * static_cast<double>(sh.t) *
                        static_cast<double>(sh.t) * static_cast<double>(sh.d);
    // mma_sync, sm90 (its default forward block) and sm90 with the other block size
    // (Note [Forward block rows]; the forward with dropout runs 128 rows either way).
    // Each sm90 forward also with its warpgroups taking turns (Note [Forward ping-pong]).
    struct Variant {
      cuda::AttentionKernel k;
      int64_t forward_rows;  // sm90: 0 the default, else forced
      int pingpong;          // sm90: 0 the default, 1 on
    };
    const int64_t other = cuda::sm90_attention_forward_rows(sh.t) == 192 ? 128 : 192;
    const auto sm90 = cuda::AttentionKernel::sm90;
    for (const Variant v :
         {Variant{cuda::AttentionKernel::mma_sync, 0, 0}, Variant{sm90, 0, 0}, Variant{sm90, 0, 1},
          Variant{sm90, other, 0}, Variant{sm90, other, 1}}) {
      const auto k = v.k;
      if (k == cuda::AttentionKernel::sm90 && !cuda::sm90_attention_supported(qkv, sh.h)) continue;
      cuda::sm90_attention_force_forward_rows(v.forward_rows);
      cuda::sm90_attention_force_forward_pingpong(v.pingpong);
      const int64_t rows = cuda::sm90_attention_forward_rows(sh.t);
      const double fwd = back_to_back_ms(
          device, warmup, iters, [&] { cuda::fused_attention(qkv, sh.h, scale, d, y, lse, k); });
      cuda::sm90_attention_force_forward_rows(0);
      cuda::sm90_attention_force_forward_pingpong(0);
      const double bwd = back_to_back_ms(device, warmup, iters, [&] {
        cuda::fused_attention_backward(qkv, y, dy, lse, sh.h, scale, d, dqkv, 0, k);
      });
      // The QKV bias gradient both ways: summed by the backward (dqkv_sum), or the column-sum
      // pass over dqkv that runs beside a backward without it.
      const double bwd_sums = back_to_back_ms(device, warmup, iters, [&] {
        cuda::fused_attention_backward(qkv, y, dy, lse, sh.h, scale, d, dqkv, 0, k, &db);
      });
      const double colsum = back_to_back_ms(device, warmup, iters, [&] { bias_grad(dqkv2, db); });
      const std::string name =
          k == cuda::AttentionKernel::mma_sync
              ? "mma_sync"
              : (v.forward_rows ? "sm90 fwd" + std::to_string(rows) : std::string("sm90")) +
                    (v.pingpong > 0 ? " pingpong" : "");
      std::printf(
          "{\"attention\": \"%s\", \"kernel\": \"%s\", \"b\": %lld, \"t\": %lld, "
          "\"h\": %lld, \"d\": %lld, \"dropout\": %.2f, \"forward_rows\": %lld, "
          "\"forward_ms\": %.4f, "
          "\"backward_ms\": %.4f, \"backward_with_bias_sums_ms\": %.4f, "
          "\"bias_column_sum_pass_ms\": %.4f, \"forward_tflops\": %.1f, "
          "\"backward_tflops\": %.1f}\n",
          sh.name, name.c_str(), static_cast<long long>(sh.b), static_cast<long long>(sh.t),
          static_cast<long long>(sh.h), static_cast<long long>(sh.d), p_drop,
          static_cast<long long>(k == cuda::AttentionKernel::sm90 ? (d.active() ? 128 : rows) : 0),
          fwd, bwd, bwd_sums, colsum, 2 * flop / fwd / 1e9, 5 * flop / bwd / 1e9);
      std::fflush(stdout);
    }
  }
}

}  // namespace ffn::bench
