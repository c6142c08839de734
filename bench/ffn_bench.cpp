// bench/ffn_bench.cpp — `ffn-bench`: times docs/design.md's FFN workloads (forward + backward
// through layers/ffn_functional, the code the layers run) and the bare cuBLASLt GEMMs of
// the same shapes, and prints one JSON line per workload; its other modes are the GEMM
// comparisons (bench/gemm_bench.h) and a GPT-2 step's single ops (bench/gpt_ops_bench.h).
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
#include <iterator>
#include <string>
#include <vector>

#include "bench/gemm_bench.h"
#include "bench/gpt_ops_bench.h"
#include "bench/timing.h"
#include "bench/workloads.h"
#include "core/cuda/check.h"
#include "core/cuda/context.h"
#include "core/generator.h"
#include "kernels/bias_act_dropout.h"
#include "kernels/bias_glu_dropout.h"
#include "kernels/gemm.h"
#include "layers/ffn_functional.h"

using namespace ffn;
using bench::back_to_back_ms;
using bench::CublasLtOnly;
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
  if (w.gated)  // the workload's own call: no W2, so no recomputed forward (dz and db only)
    report("bias_glu_dropout_backward_dz_db", act_bwd - w.m * hidden * es,
           median_ms(device, warmup, iters,
                     [&] { bias_glu_dropout_backward(dh, z, b, w.act, d, dz, &db, nullptr); }));
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
      bench::out_dropout_bench(device, warmup, iters);
      return 0;
    }
    if (act_epilogues) {
      bench::act_epilogue_bench(device, warmup, iters);
      bench::out_dropout_bench(device, warmup, iters);
      return 0;
    }
    if (gemm_table) {
      bench::gemm_comparison(device, warmup, iters, gemm_only, gemm_variant);
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
