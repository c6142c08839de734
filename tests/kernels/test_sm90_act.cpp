// tests/kernels/test_sm90_act.cpp — the own Hopper GEMM's epilogues with the FFN's work in
// them (kernels/cuda/gemm/): the fc1 epilogue, the activation and GLU epilogues on their
// warpgroups (forward and backward, with the hidden dropout and db) against the GEMM followed
// by the unfused kernels, the unit order and operand multicast, and the argument checks of
// linear_act / linear_glu (FFN_GPU_TEST cases skip visibly without a GPU). The plain product's
// cases are in test_sm90_gemm.cpp.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/bias_act_dropout.h"
#include "kernels/bias_glu_dropout.h"
#include "kernels/cuda/gemm/sm90_gemm.h"
#include "kernels/gemm.h"
#include "kernels/scale.h"
#include "tests/kernels/kernel_tests.h"
#include "tests/kernels/sm90_tests.h"
#include "tests/test_util.h"

using namespace ffn;
using namespace ffn::test;

FFN_GPU_TEST("sm90 GEMM's fc1 epilogue equals the GEMM followed by bias_act_dropout") {
  Generator g(72);
  if (!sm90_here()) {
    MESSAGE("not an sm_90 GPU: the Hopper GEMM is not used here");
    return;
  }
  // Ragged (n % 8 != 0) and whole 8-column runs; 1100 × 8192 has 576 tiles of 128 × 128, so
  // CTAs take 4 or 5 and each warpgroup reuses its scratch.
  const int64_t dims[][3] = {
      {5, 3, 8}, {129, 257, 72}, {300, 1601, 256}, {512, 4096, 1024}, {1100, 8192, 64}};
  for (auto& dm : dims)
    for (DType dt : {DType::bf16, DType::f16})
      for (Activation act : {Activation::gelu_tanh, Activation::gelu_erf, Activation::silu,
                             Activation::identity})  // identity: fc2's output dropout
        for (float p : {0.0f, 0.1f}) {
          const int64_t m = dm[0], n = dm[1], k = dm[2];
          const Tensor x = rand64({m, k}, g).to(dt).to(kGpu), w = rand64({n, k}, g).to(dt).to(kGpu);
          const Tensor b = rand64({n}, g).to(dt).to(kGpu);
          const DropoutSpec d{p, 1234, 56};
          // gelu_tanh through the cooperative kernel, the others through ping-pong.
          const auto sched = act == Activation::gelu_tanh ? cuda::Sm90Schedule::cooperative
                                                          : cuda::Sm90Schedule::pingpong;
          Tensor hd = Tensor::full({m, n}, NAN, dt, kGpu), z = Tensor::full({m, n}, NAN, dt, kGpu);
          cuda::sm90_gemm_nt_bias_act_dropout(x, w, b, act, d, hd, &z, sched);
          const std::string what = std::string("fc1 epilogue ") + dtype_name(dt) +
                                   (sched == cuda::Sm90Schedule::pingpong ? " ping-pong " : " ") +
                                   activation_name(act) + " p" + std::to_string(p) + " m" +
                                   std::to_string(m) + " n" + std::to_string(n);
          // z is the plain GEMM (bitwise: same kernel, same accumulation).
          Tensor z_plain = Tensor::full({m, n}, NAN, dt, kGpu);
          cuda::sm90_gemm(x, w, z_plain, {.trans_b = true, .schedule = sched});
          CHECK_MESSAGE(equal_and_written(z, z_plain), what, ": z");
          // hd is exactly bias_act_dropout of that z: same arithmetic, same mask bits.
          Tensor hd_ref = Tensor::empty({m, n}, dt, kGpu);
          bias_act_dropout(z, b, act, d, hd_ref);
          CHECK_MESSAGE(equal_and_written(hd, hd_ref), what, ": hd");
          // Without z (recompute in backward) hd is the same.
          Tensor hd2 = Tensor::full({m, n}, NAN, dt, kGpu);
          cuda::sm90_gemm_nt_bias_act_dropout(x, w, b, act, d, hd2, nullptr, sched);
          CHECK_MESSAGE(equal_and_written(hd2, hd), what, ": hd without z");
        }
}

// Note [Activation epilogues]: the forward (z, hd) and backward (dz, recomputed hd) equal the
// same Hopper product followed by bias_act_dropout(_backward), bit for bit: with p = 0 on
// every schedule, with the hidden dropout (p = 0.1, and p = 1: all dropped) on the activation
// warpgroups, the mask the same bits; the front doors (linear_act*) run them on Hopper and
// decline elsewhere.
FFN_GPU_TEST("sm90 GEMM's activation epilogues equal the GEMM followed by bias_act_dropout") {
  Generator g(74);
  if (!sm90_here()) {
    MESSAGE("not an sm_90 GPU: the Hopper GEMM is not used here");
    return;
  }
  // (M, N = h, K): M = 1, ragged row and column tiles, N < 256 and >= 256 (the cooperative
  // kernel's BN), more tiles than SMs (1100 × 8192: CTAs reuse their buffers), GPT-2's fc1,
  // and more than 8 tiles a CTA on 132 SMs (5000 × 4096, bf16 gelu_erf on the activation
  // warpgroups only: where Note [Dynamic unit order]'s ring of units wraps; these cases run
  // the default order, the static one on a single process, in clusters sharing A where the
  // column tiles pair up (1100 × 8192, 512 × 3072, 5000 × 4096: Note [Operand multicast]);
  // the case "the unit order and operand multicast change no bits" compares all three).
  const int64_t dims[][3] = {{1, 8, 8},        {129, 264, 72},   {300, 1608, 256},
                             {1100, 8192, 64}, {512, 3072, 768}, {5000, 4096, 64}};
  for (auto& dm : dims)
    for (DType dt : {DType::bf16, DType::f16})
      for (Activation act : {Activation::gelu_erf, Activation::gelu_tanh, Activation::silu})
        for (auto [sched, p] : {std::pair{cuda::Sm90Schedule::act_warpgroups, 0.0f},
                                std::pair{cuda::Sm90Schedule::act_warpgroups, 0.1f},
                                std::pair{cuda::Sm90Schedule::pingpong, 0.0f},
                                std::pair{cuda::Sm90Schedule::cooperative, 0.0f}}) {
          const int64_t m = dm[0], n = dm[1], k = dm[2];
          const bool bias = n != 264;  // one shape without a bias
          const bool aw = sched == cuda::Sm90Schedule::act_warpgroups;
          if (m == 5000 && (dt != DType::bf16 || act != Activation::gelu_erf || !aw)) continue;
          // p = 1 at one shape: every element dropped, hd and dz all zeros.
          const DropoutSpec d{p > 0 && n == 1608 ? 1.0f : p, 4321, 77 + static_cast<uint64_t>(m)};
          // The activation warpgroups' kernel runs 128×128 tiles like the ping-pong GEMM.
          const cuda::Sm90Schedule ref_sched = aw ? cuda::Sm90Schedule::pingpong : sched;
          const Tensor x = rand64({m, k}, g).to(dt).to(kGpu),
                       w1 = rand64({n, k}, g).to(dt).to(kGpu);
          const Tensor dy = rand64({m, k}, g).to(dt).to(kGpu),
                       w2 = rand64({k, n}, g).to(dt).to(kGpu);
          const Tensor b = bias ? rand64({n}, g).to(dt).to(kGpu) : Tensor();
          const std::string what = std::string("activation epilogue ") + dtype_name(dt) + " " +
                                   activation_name(act) +
                                   (aw                                      ? " act_warpgroups"
                                    : sched == cuda::Sm90Schedule::pingpong ? " ping-pong"
                                                                            : " cooperative") +
                                   " m" + std::to_string(m) + " n" + std::to_string(n) + " k" +
                                   std::to_string(k) + " p" + std::to_string(d.p);
          // Forward: z is the plain product (same kernel shape, same accumulation), hd is
          // bias_act_dropout of that z.
          Tensor z = Tensor::full({m, n}, NAN, dt, kGpu), hd = z.clone();
          cuda::sm90_gemm_nt_act(x, w1, b, act, d, z, hd, sched);
          Tensor z_ref = Tensor::full({m, n}, NAN, dt, kGpu), hd_ref = z_ref.clone();
          cuda::sm90_gemm(x, w1, z_ref, {.trans_b = true, .schedule = ref_sched});
          CHECK_MESSAGE(equal_and_written(z, z_ref), what, ": z");
          bias_act_dropout(z_ref, b, act, d, hd_ref);
          CHECK_MESSAGE(equal_and_written(hd, hd_ref), what, ": hd");
          // Backward: dz and hd from dhd = dy·w2 and the saved z.
          Tensor dz = Tensor::full({m, n}, NAN, dt, kGpu), hd2 = dz.clone();
          cuda::sm90_gemm_nn_act_backward(dy, w2, z, b, act, d, dz, hd2, sched);
          Tensor dhd = Tensor::full({m, n}, NAN, dt, kGpu);
          cuda::sm90_gemm(dy, w2, dhd, {.schedule = ref_sched});
          Tensor dz_ref = Tensor::full({m, n}, NAN, dt, kGpu), hd2_ref = dz_ref.clone();
          bias_act_dropout_backward(dhd, z, b, act, d, dz_ref, nullptr, &hd2_ref);
          CHECK_MESSAGE(equal_and_written(dz, dz_ref), what, ": dz");
          CHECK_MESSAGE(equal_and_written(hd2, hd2_ref), what, ": recomputed hd");
          if (!aw) continue;
          // db from the activation warpgroup's per-tile partials: Σ_rows of the stored dz
          // within fp32 accumulation plus one rounding to dt, the same bits on a second run.
          Tensor db = Tensor::full({n}, NAN, dt, kGpu), db_again = db.clone();
          cuda::sm90_gemm_nn_act_backward(dy, w2, z, b, act, d, dz, hd2, sched, &db);
          cuda::sm90_gemm_nn_act_backward(dy, w2, z, b, act, d, dz, hd2, sched, &db_again);
          CHECK_MESSAGE(equal_and_written(dz, dz_ref), what, ": dz with db");
          CHECK_MESSAGE(equal_and_written(db, db_again), what, ": db run to run");
          const auto dzv = dz_ref.to_vector(), dbv = db.to_vector();
          const double unit = dt == DType::bf16 ? 0x1p-8 : 0x1p-11;
          int bad = 0;
          for (int64_t c = 0; c < n; ++c) {
            double sum = 0, mag = 0;
            for (int64_t r = 0; r < m; ++r) sum += dzv[r * n + c], mag += std::abs(dzv[r * n + c]);
            if (!(std::abs(dbv[c] - sum) <= unit * std::abs(sum) + 0x1p-23 * m * mag)) ++bad;
          }
          CHECK_MESSAGE(bad == 0, what, ": db off Σ_rows dz in ", bad, " of ", n, " columns");
        }
  // The front doors take the Hopper path for 16-bit operands with a long enough K (from 384,
  // with the hidden dropout from 768: the activation warpgroups, db in the kernel; K = 4096 as
  // well, where the ping-pong ActTma ran until session 14) and decline f32 and short K (the
  // caller then runs gemm + bias_act_dropout); a mismatched output is an error naming the op.
  for (int64_t kl : {384, 768, 4096}) {
    const Tensor xl = rand64({200, kl}, g).to(DType::bf16).to(kGpu);
    const Tensor wl = rand64({136, kl}, g).to(DType::bf16).to(kGpu);
    const Tensor wl2 = rand64({kl, 136}, g).to(DType::bf16).to(kGpu);
    Tensor zl = Tensor::empty({200, 136}, DType::bf16, kGpu), hl = zl.clone(), dzl = zl.clone();
    Tensor dbl = Tensor::full({136}, NAN, DType::bf16, kGpu), db_ref = dbl.clone();
    CHECK(linear_act(xl, wl, {}, Activation::gelu_erf, {}, zl, hl));
    CHECK(linear_act_backward(xl, wl2, zl, {}, Activation::gelu_erf, {}, dzl, hl, &dbl));
    bias_grad(dzl, db_ref);
    check_close(dbl, db_ref, 1e-6 * 200, 0x1p-7,
                "linear_act_backward db, K = " + std::to_string(kl));
    // With the hidden dropout from K = 768 (measured: act_fused_here in
    // kernels/bias_act_dropout.cpp; until session 38 from K = 1024 only).
    const DropoutSpec d{0.1f, 5, 6};
    CHECK(linear_act(xl, wl, {}, Activation::gelu_erf, d, zl, hl) == (kl >= 768));
    CHECK(linear_act_backward(xl, wl2, zl, {}, Activation::gelu_erf, d, dzl, hl, &dbl) ==
          (kl >= 768));
  }
  const Tensor x = rand64({64, 32}, g).to(DType::bf16).to(kGpu);
  const Tensor w = rand64({16, 32}, g).to(DType::bf16).to(kGpu);
  Tensor z = Tensor::empty({64, 16}, DType::bf16, kGpu), hd = z.clone();
  CHECK(!linear_act(x, w, {}, Activation::gelu_erf, {}, z, hd));  // K = 32: below the measured 384
  {
    const Tensor x376 = rand64({64, 376}, g).to(DType::bf16).to(kGpu);
    const Tensor w376 = rand64({16, 376}, g).to(DType::bf16).to(kGpu);
    CHECK(!linear_act(x376, w376, {}, Activation::gelu_erf, {}, z, hd));  // just below 384
  }
  Tensor z32 = Tensor::empty({64, 16}, DType::f32, kGpu), hd32 = z32.clone();
  CHECK(!linear_act(x.to(DType::f32), w.to(DType::f32), {}, Activation::gelu_erf, {}, z32, hd32));
  Tensor bad = Tensor::empty({64, 24}, DType::bf16, kGpu);
  CHECK_THROWS_WITH(linear_act(x, w, {}, Activation::gelu_erf, {}, z, bad),
                    doctest::Contains("[linear_act] hd"));
  const Tensor z_base = Tensor::empty({64 * 16 + 1}, DType::bf16, kGpu);
  const Tensor z_off = z_base.narrow(0, 1, 64 * 16).reshape({64, 16});  // 2-byte aligned
  Tensor dz = Tensor::empty({64, 16}, DType::bf16, kGpu);
  const Tensor w_t = rand64({32, 16}, g).to(DType::bf16).to(kGpu);
  CHECK(!linear_act_backward(x, w_t, z_off, {}, Activation::gelu_erf, {}, dz, hd));
  CHECK_THROWS_WITH(
      cuda::sm90_gemm_nn_act_backward(x, w_t, z_off, {}, Activation::gelu_erf, {}, dz, hd),
      doctest::Contains("the activation backward: z must be"));
  Tensor db = Tensor::empty({16}, DType::bf16, kGpu),
         db_short = Tensor::empty({8}, DType::bf16, kGpu);
  CHECK_THROWS_WITH(cuda::sm90_gemm_nn_act_backward(x, w_t, z, {}, Activation::gelu_erf, {}, dz, hd,
                                                    cuda::Sm90Schedule::pingpong, &db),
                    doctest::Contains("sums db only with the act_warpgroups schedule"));
  CHECK_THROWS_WITH(cuda::sm90_gemm_nn_act_backward(x, w_t, z, {}, Activation::gelu_erf, {}, dz, hd,
                                                    cuda::Sm90Schedule::act_warpgroups, &db_short),
                    doctest::Contains("db must be a contiguous [16] bf16"));
  CHECK_THROWS_WITH(cuda::sm90_gemm_nt_act(x, w, {}, Activation::gelu_erf, {0.1f, 1, 0}, z, hd,
                                           cuda::Sm90Schedule::pingpong),
                    doctest::Contains("dropout (p = 0.1) runs only with the act_warpgroups"));
  Tensor c = Tensor::empty({64, 16}, DType::bf16, kGpu);
  CHECK_THROWS_WITH(
      cuda::sm90_gemm(x, w, c, {.trans_b = true, .schedule = cuda::Sm90Schedule::act_warpgroups}),
      doctest::Contains("act_warpgroups schedule is for the activation epilogues only"));
}

namespace {
// The GLU backward (Note [GLU warpgroup]) against the GEMM followed by
// bias_glu_dropout_backward: dz and the recomputed out bit-identical, db the same bits on a
// second run and within fp32 accumulation plus one rounding of Σ_rows dz.
void check_glu_backward(Generator& g, const Tensor& z, const Tensor& b, Activation act,
                        const DropoutSpec& d, int64_t k, const std::string& what) {
  const int64_t m = z.size(0), h = z.size(1) / 2;
  const DType dt = z.dtype();
  const Tensor dy = rand64({m, k}, g).to(dt).to(kGpu), w2 = rand64({k, h}, g).to(dt).to(kGpu);
  Tensor dz = Tensor::full({m, 2 * h}, NAN, dt, kGpu), out = Tensor::full({m, h}, NAN, dt, kGpu);
  Tensor db = Tensor::full({2 * h}, NAN, dt, kGpu), db_again = db.clone();
  REQUIRE(cuda::sm90_gemm_glu_backward_supported(dy, w2, act, out));
  cuda::sm90_gemm_nn_glu_backward(dy, w2, z, b, act, d, dz, out, &db);
  Tensor dhd = Tensor::full({m, h}, NAN, dt, kGpu);
  cuda::sm90_gemm(dy, w2, dhd, {.schedule = cuda::Sm90Schedule::pingpong});
  Tensor dz_ref = Tensor::full({m, 2 * h}, NAN, dt, kGpu),
         out_ref = Tensor::full({m, h}, NAN, dt, kGpu);
  bias_glu_dropout_backward(dhd, z, b, act, d, dz_ref, nullptr, &out_ref);
  CHECK_MESSAGE(equal_and_written(dz, dz_ref), what, ": backward dz");
  CHECK_MESSAGE(equal_and_written(out, out_ref), what, ": backward's recomputed out");
  Tensor dz2 = Tensor::full({m, 2 * h}, NAN, dt, kGpu), out2 = out.clone();
  cuda::sm90_gemm_nn_glu_backward(dy, w2, z, b, act, d, dz2, out2, &db_again);
  CHECK_MESSAGE(equal_and_written(db, db_again), what, ": db run to run");
  CHECK_MESSAGE(equal_and_written(dz2, dz_ref), what, ": backward dz, second run");
  const auto dzv = dz_ref.to_vector(), dbv = db.to_vector();
  const double unit = dt == DType::bf16 ? 0x1p-8 : 0x1p-11;
  int bad = 0;
  for (int64_t c = 0; c < 2 * h; ++c) {
    double sum = 0, mag = 0;
    for (int64_t r = 0; r < m; ++r) sum += dzv[r * 2 * h + c], mag += std::abs(dzv[r * 2 * h + c]);
    if (!(std::abs(dbv[c] - sum) <= unit * std::abs(sum) + 0x1p-23 * m * mag)) ++bad;
  }
  CHECK_MESSAGE(bad == 0, what, ": db off Σ_rows dz in ", bad, " of ", 2 * h, " columns");
}
}  // namespace

// Note [GLU warpgroup]: z = x·Wᵀ ([value | gate] rows of W in one tile) equals the plain
// product bit for bit, out equals bias_glu_dropout of it, the mask included; the front door
// runs it on Hopper from K = 384 (returning z) and declines elsewhere (an undefined z);
// its backward likewise (check_glu_backward, linear_glu_backward).
FFN_GPU_TEST("sm90 GEMM's GLU epilogue equals the GEMM followed by bias_glu_dropout") {
  Generator g(76);
  if (!sm90_here()) {
    MESSAGE("not an sm_90 GPU: the Hopper GEMM is not used here");
    return;
  }
  // (M, h, K): M = 1, ragged row tiles, one and several column blocks, more tiles than SMs
  // (1100 × h 1024: 9 × 16 tiles), a K that is not a multiple of 64.
  const int64_t dims[][3] = {{1, 64, 8}, {129, 128, 72}, {300, 192, 200}, {1100, 1024, 64}};
  for (auto& dm : dims)
    for (DType dt : {DType::bf16, DType::f16})
      for (Activation act : {Activation::gelu_tanh, Activation::gelu_erf, Activation::silu})
        for (float p : {0.0f, 0.1f}) {
          const int64_t m = dm[0], h = dm[1], k = dm[2];
          const bool bias = h != 128;  // one shape without a bias
          const Tensor x = rand64({m, k}, g).to(dt).to(kGpu);
          const Tensor w = rand64({2 * h, k}, g).to(dt).to(kGpu);
          const Tensor b = bias ? rand64({2 * h}, g).to(dt).to(kGpu) : Tensor();
          const DropoutSpec d{p > 0 && h == 192 ? 1.0f : p, 99, 5 + static_cast<uint64_t>(m)};
          const std::string what = std::string("GLU epilogue ") + dtype_name(dt) + " " +
                                   activation_name(act) + " m" + std::to_string(m) + " h" +
                                   std::to_string(h) + " k" + std::to_string(k) + " p" +
                                   std::to_string(d.p);
          Tensor z = Tensor::full({m, 2 * h}, NAN, dt, kGpu),
                 out = Tensor::full({m, h}, NAN, dt, kGpu);
          REQUIRE(cuda::sm90_gemm_glu_supported(x, w, act, z));
          cuda::sm90_gemm_nt_glu(x, w, b, act, d, z, out);
          Tensor z_ref = Tensor::full({m, 2 * h}, NAN, dt, kGpu), out_ref = out.clone();
          cuda::sm90_gemm(x, w, z_ref, {.trans_b = true, .schedule = cuda::Sm90Schedule::pingpong});
          CHECK_MESSAGE(equal_and_written(z, z_ref), what, ": z");
          bias_glu_dropout(z_ref, b, act, d, out_ref);
          CHECK_MESSAGE(equal_and_written(out, out_ref), what, ": out");
          check_glu_backward(g, z_ref, b, act, d, k, what);
        }
  // The backward runs any h % 8 == 0 (its tiles are the plain GEMM's): ragged column blocks.
  for (DType dt : {DType::bf16, DType::f16})
    for (float p : {0.0f, 0.1f}) {
      const Tensor z = rand64({77, 400}, g).to(dt).to(kGpu), b = rand64({400}, g).to(dt).to(kGpu);
      check_glu_backward(
          g, z, b, Activation::gelu_erf, {p, 7, 3}, 40,
          std::string("GLU backward ") + dtype_name(dt) + " m77 h200 k40 p" + std::to_string(p));
    }
  // The front door: K = 384 runs here, K = 376 and f32 decline; bad shapes are named.
  for (int64_t kl : {376, 384}) {
    const Tensor x = rand64({200, kl}, g).to(DType::bf16).to(kGpu);
    const Tensor w = rand64({256, kl}, g).to(DType::bf16).to(kGpu);
    Tensor out = Tensor::empty({200, 128}, DType::bf16, kGpu);
    const Tensor z = linear_glu(x, w, {}, Activation::silu, {}, out);
    CHECK(z.defined() == (kl >= 384));
    if (z.defined()) CHECK(z.shape() == Shape{200, 256});
  }
  const Tensor x = rand64({8, 1024}, g).to(DType::bf16).to(kGpu);
  const Tensor w =
      rand64({200, 1024}, g).to(DType::bf16).to(kGpu);  // h = 100: not a multiple of 64
  Tensor z = Tensor::empty({8, 200}, DType::bf16, kGpu),
         out = Tensor::empty({8, 100}, DType::bf16, kGpu);
  CHECK(!linear_glu(x, w, {}, Activation::silu, {}, out).defined());
  CHECK(!cuda::sm90_gemm_glu_supported(x, w, Activation::silu, z));
  CHECK_THROWS_WITH(cuda::sm90_gemm_nt_glu(x, w, {}, Activation::silu, {}, z, out),
                    doctest::Contains("[sm90_gemm] the GLU forward cannot run"));
  Tensor bad = Tensor::empty({8, 64}, DType::bf16, kGpu);
  CHECK_THROWS_WITH(linear_glu(x, w, {}, Activation::silu, {}, bad),
                    doctest::Contains("[linear_glu] out"));
  // The backward's front door: K = 384 runs (db in the kernel), K = 376 declines.
  for (int64_t kl : {376, 384}) {
    const Tensor dy = rand64({200, kl}, g).to(DType::bf16).to(kGpu);
    const Tensor w2 = rand64({kl, 136}, g).to(DType::bf16).to(kGpu);
    const Tensor zl = rand64({200, 272}, g).to(DType::bf16).to(kGpu);
    Tensor dz = Tensor::empty({200, 272}, DType::bf16, kGpu),
           o = Tensor::empty({200, 136}, DType::bf16, kGpu),
           db = Tensor::full({272}, NAN, DType::bf16, kGpu), db_ref = db.clone();
    CHECK(linear_glu_backward(dy, w2, zl, {}, Activation::gelu_tanh, {}, dz, o, &db) ==
          (kl >= 384));
    if (kl < 384) continue;
    bias_grad(dz, db_ref);
    check_close(db, db_ref, 1e-6 * 200, 0x1p-7, "linear_glu_backward db");
  }
  Tensor dz_bad = Tensor::empty({8, 200}, DType::bf16, kGpu);
  CHECK_THROWS_WITH(
      cuda::sm90_gemm_nn_glu_backward(x, rand64({1024, 100}, g).to(DType::bf16).to(kGpu), z, {},
                                      Activation::silu, {}, dz_bad, bad),
      doctest::Contains("[sm90_gemm] the GLU backward"));
}

// Note [Dynamic unit order] and Note [Operand multicast]: the activation kernels' units taken
// from the global counter, in the static order, and in the static order in clusters of two
// CTAs sharing A give the same bits (every tile and db partial is one CTA's, the same inputs
// in the same order), for the plain and the GLU kernels, forward and backward with db, with
// and without dropout, at a shape whose ring wraps (more than 8 tiles a CTA) and at GPT-2's
// fc1. The shapes' column tiles pair up (multicast runs in the forwards, rows past m in a
// partner's half of A included; in the plain backward at 600 × 512 × 2048, act_multicast's
// K >= 2048) except the last one's (odd: multicast declines). The fourth run walks groups of
// 2 tile rows instead of the shape's 8 (Note [Tile groups]; remainder groups at odd rows).
FFN_GPU_TEST("sm90 activation GEMMs: unit order, multicast and tile groups change no bits") {
  Generator g(78);
  if (!sm90_here()) {
    MESSAGE("not an sm_90 GPU: the Hopper GEMM is not used here");
    return;
  }
  if (std::getenv("FFN_GEMM_DYNAMIC_ORDER")) {
    MESSAGE("FFN_GEMM_DYNAMIC_ORDER is set: it fixes the order, nothing to compare");
    return;
  }
  struct Restore {
    bool order = gemm_dynamic_order(), multicast = gemm_multicast();
    int group = gemm_group_rows();
    ~Restore() {
      set_gemm_dynamic_order(order);
      set_gemm_multicast(multicast);
      set_gemm_group_rows(group);
    }
  } restore;
  const int64_t dims[][3] = {
      {5000, 4096, 64}, {512, 3072, 768}, {1100, 1024, 200}, {600, 512, 2048}, {300, 384, 128}};
  for (auto& dm : dims)
    for (float p : {0.0f, 0.1f}) {
      const int64_t m = dm[0], n = dm[1], k = dm[2];
      const DType dt = m == 1100 ? DType::f16 : DType::bf16;
      const Activation act = m == 512 ? Activation::gelu_tanh : Activation::gelu_erf;
      const std::string what = std::string(dtype_name(dt)) + " " + activation_name(act) + " m" +
                               std::to_string(m) + " n" + std::to_string(n) + " k" +
                               std::to_string(k) + " p" + std::to_string(p);
      const DropoutSpec d{p, 31, 7};
      const Tensor x = rand64({m, k}, g).to(dt).to(kGpu), w1 = rand64({n, k}, g).to(dt).to(kGpu);
      const Tensor dy = rand64({m, k}, g).to(dt).to(kGpu), w2 = rand64({k, n}, g).to(dt).to(kGpu);
      const Tensor w2g = rand64({k, n / 2}, g).to(dt).to(kGpu);
      const Tensor b = rand64({n}, g).to(dt).to(kGpu);
      const struct {
        bool dynamic, multicast;
        int group;
        const char* name;
      } runs[] = {{true, false, 0, "dynamic"},
                  {false, false, 0, "static"},
                  {false, true, 0, "multicast"},
                  {false, true, 2, "multicast in groups of 2 tile rows"}};
      std::vector<Tensor> outs[4];
      for (int r = 0; r < 4; ++r) {
        set_gemm_dynamic_order(runs[r].dynamic);
        set_gemm_multicast(runs[r].multicast);
        set_gemm_group_rows(runs[r].group);
        CHECK(gemm_dynamic_order() == runs[r].dynamic);
        Tensor z = Tensor::full({m, n}, NAN, dt, kGpu), hd = z.clone(), dz = z.clone(),
               hd2 = z.clone(), db = Tensor::full({n}, NAN, dt, kGpu);
        cuda::sm90_gemm_nt_act(x, w1, b, act, d, z, hd);
        cuda::sm90_gemm_nn_act_backward(dy, w2, z, b, act, d, dz, hd2,
                                        cuda::Sm90Schedule::automatic, &db);
        Tensor gz = Tensor::full({m, n}, NAN, dt, kGpu),
               gout = Tensor::full({m, n / 2}, NAN, dt, kGpu), gdz = gz.clone(),
               gout2 = gout.clone(), gdb = db.clone();
        cuda::sm90_gemm_nt_glu(x, w1, b, act, d, gz, gout);
        cuda::sm90_gemm_nn_glu_backward(dy, w2g, gz, b, act, d, gdz, gout2, &gdb);
        outs[r] = {z, hd, dz, hd2, db, gz, gout, gdz, gout2, gdb};
      }
      const char* names[] = {"z",     "hd",      "dz",     "recomputed hd", "db",
                             "GLU z", "GLU out", "GLU dz", "GLU out again", "GLU db"};
      for (int r = 1; r < 4; ++r)
        for (size_t i = 0; i < outs[0].size(); ++i)
          CHECK_MESSAGE(equal_and_written(outs[0][i], outs[r][i]), what, ": ", names[i], ", ",
                        runs[r].name, " against dynamic");
    }
}

// Note [RMSNorm folded into the FFN]: the GLU kernels' row scale. With powers of two as the
// scales every product is scaled exactly, so the forward's z must equal scale_rows of the
// unscaled kernel's z bit for bit, and the backward's dz scale_rows of its unscaled dz; out
// (and the backward's recomputed out) must be the unfused GLU of the scaled z. In f16 a value
// in the subnormal range (below 2^-14) is rounded on its own grid before or after the scale,
// so there the two may differ by that grid's spacing times the scale: at most 2^-22 (scales
// up to 4, spacing 2^-24, half of it again). Rows past M and both tile parities of the
// consumer's scales: 1100 rows take 9 tile rows.
FFN_GPU_TEST("sm90 GEMM's GLU epilogue with a row scale equals scale_rows of the unscaled one") {
  Generator g(79);
  if (!sm90_here()) {
    MESSAGE("not an sm_90 GPU: the Hopper GEMM is not used here");
    return;
  }
  const int64_t dims[][3] = {{1, 64, 8}, {129, 128, 72}, {300, 192, 200}, {1100, 1024, 384}};
  for (auto& dm : dims)
    for (DType dt : {DType::bf16, DType::f16})
      for (float p : {0.0f, 0.1f}) {
        const int64_t m = dm[0], h = dm[1], k = dm[2];
        const Activation act = dt == DType::bf16 ? Activation::silu : Activation::gelu_tanh;
        const std::string what = std::string("row-scaled GLU ") + dtype_name(dt) + " m" +
                                 std::to_string(m) + " h" + std::to_string(h) + " k" +
                                 std::to_string(k) + " p" + std::to_string(p);
        std::vector<double> sv = rand64({m}, g, 2.5).to_vector();  // 2^-2 .. 2^2
        for (auto& v : sv) v = std::ldexp(1.0, static_cast<int>(std::lround(v)));
        const Tensor rs = Tensor::from_vector(sv, {m}).to(DType::f32).to(kGpu);
        const Tensor x = rand64({m, k}, g).to(dt).to(kGpu),
                     w = rand64({2 * h, k}, g).to(dt).to(kGpu);
        const Tensor b = h == 128 ? Tensor() : rand64({2 * h}, g).to(dt).to(kGpu);
        const DropoutSpec d{p, 41, 9};
        Tensor z = Tensor::full({m, 2 * h}, NAN, dt, kGpu),
               out = Tensor::full({m, h}, NAN, dt, kGpu);
        Tensor z1 = z.clone(), out1 = out.clone();
        cuda::sm90_gemm_nt_glu(x, w, b, act, d, z1, out1);  // unscaled
        cuda::sm90_gemm_nt_glu(x, w, b, act, d, z, out, rs);
        // bf16: the same bits; f16: the same but in the subnormal range (above).
        const auto scaled_equal = [&](const Tensor& got, const Tensor& want) {
          if (dt == DType::bf16) return equal_and_written(got, want);
          const auto gv = got.to(DType::f64).to_vector(), wv = want.to(DType::f64).to_vector();
          for (size_t i = 0; i < gv.size(); ++i) {
            const bool low = std::min(std::abs(gv[i]), std::abs(wv[i])) <= 0x1p-12;
            if (!(gv[i] == wv[i] || (low && std::abs(gv[i] - wv[i]) <= 0x1p-22))) {
              MESSAGE(what, ": element ", i, " is ", gv[i], ", want ", wv[i]);
              return false;
            }
          }
          return true;
        };
        Tensor z_ref = Tensor::full({m, 2 * h}, NAN, dt, kGpu), out_ref = out.clone();
        scale_rows(z1, rs, z_ref);
        CHECK_MESSAGE(scaled_equal(z, z_ref), what, ": z");
        bias_glu_dropout(z, b, act, d, out_ref);
        CHECK_MESSAGE(equal_and_written(out, out_ref), what, ": out");
        // The backward on the scaled z, with and without the scale.
        const Tensor dy = rand64({m, k}, g).to(dt).to(kGpu), w2 = rand64({k, h}, g).to(dt).to(kGpu);
        Tensor dz = z.clone(), dz1 = z.clone(), o = out.clone(), o1 = out.clone();
        dz.fill_(NAN), dz1.fill_(NAN), o.fill_(NAN), o1.fill_(NAN);
        cuda::sm90_gemm_nn_glu_backward(dy, w2, z, b, act, d, dz1, o1);
        cuda::sm90_gemm_nn_glu_backward(dy, w2, z, b, act, d, dz, o, nullptr, rs);
        Tensor dz_ref = dz1.clone();
        scale_rows(dz1, rs, dz_ref);
        CHECK_MESSAGE(scaled_equal(dz, dz_ref), what, ": backward dz");
        CHECK_MESSAGE(equal_and_written(o, out_ref), what, ": backward's recomputed out");
      }
  // The front doors: the row scale's shape and dtype named; db with it declined (linear_glu_
  // backward) or refused (the kernel's entry).
  const Tensor x = rand64({200, 384}, g).to(DType::bf16).to(kGpu);
  const Tensor w = rand64({256, 384}, g).to(DType::bf16).to(kGpu);
  Tensor out = Tensor::empty({200, 128}, DType::bf16, kGpu);
  CHECK_THROWS_WITH(
      linear_glu(x, w, {}, Activation::silu, {}, out, Tensor::full({100}, 1.0, DType::f32, kGpu)),
      doctest::Contains("[linear_glu] row_scale must be a contiguous f32 [200]"));
  const Tensor rs = Tensor::full({200}, 2.0, DType::f32, kGpu);
  const Tensor z = linear_glu(x, w, {}, Activation::silu, {}, out, rs);
  REQUIRE(z.defined());
  const Tensor dy = rand64({200, 384}, g).to(DType::bf16).to(kGpu);
  const Tensor w2 = rand64({384, 128}, g).to(DType::bf16).to(kGpu);
  Tensor dz = Tensor::empty({200, 256}, DType::bf16, kGpu), hd = out.clone();
  Tensor db = Tensor::empty({256}, DType::bf16, kGpu);
  CHECK(linear_glu_backward(dy, w2, z, {}, Activation::silu, {}, dz, hd, nullptr, rs));
  CHECK(!linear_glu_backward(dy, w2, z, {}, Activation::silu, {}, dz, hd, &db, rs));
  CHECK_THROWS_WITH(
      cuda::sm90_gemm_nn_glu_backward(dy, w2, z, {}, Activation::silu, {}, dz, hd, &db, rs),
      doctest::Contains("db with a row_scale"));
  CHECK_THROWS_WITH(cuda::sm90_gemm_nn_glu_backward(dy, w2, z, {}, Activation::silu, {}, dz, hd,
                                                    nullptr, rs.to(DType::bf16)),
                    doctest::Contains("the GLU backward: row_scale must be a contiguous f32"));
}

TEST_CASE("linear_glu declines the CPU and checks its arguments") {
  Generator g(77);
  const Tensor x = rand64({5, 8}, g), w = rand64({16, 8}, g);
  Tensor out = Tensor::empty({5, 8}, DType::f64);
  CHECK(!linear_glu(x, w, {}, Activation::silu, {}, out).defined());
  CHECK_THROWS_WITH(linear_glu(x, rand64({16, 7}, g), {}, Activation::silu, {}, out),
                    doctest::Contains("[linear_glu] x is [5, 8] but w is [16, 7]"));
  CHECK_THROWS_WITH(linear_glu(x, w, {}, Activation::silu, {2.0f, 1, 0}, out),
                    doctest::Contains("[linear_glu]"));
  const Tensor w2 = rand64({8, 8}, g), z = rand64({5, 16}, g);
  Tensor dz = Tensor::empty({5, 16}, DType::f64);
  CHECK(!linear_glu_backward(x, w2, z, {}, Activation::silu, {}, dz, out));
  CHECK_THROWS_WITH(
      linear_glu_backward(x, w2, rand64({5, 12}, g), {}, Activation::silu, {}, dz, out),
      doctest::Contains("[linear_glu_backward] z"));
  CHECK_THROWS_WITH(linear_glu_backward(x, w, z, {}, Activation::silu, {}, dz, out),
                    doctest::Contains("[linear_glu_backward] dy is [5, 8] but w is [16, 8]"));
}

// Note [Output dropout in the GEMM]: linear_dropout runs fc2 with its output dropout in the
// Hopper GEMM for K from 1024 to 4096 (bit for bit the cooperative Hopper product followed by
// bias_dropout; the same mask, p = 1 drops all), declines other K, no dropout and f32, and
// checks its arguments.
FFN_GPU_TEST("linear_dropout: fc2's output dropout in the Hopper GEMM") {
  Generator g(76);
  if (!sm90_here()) {
    MESSAGE("not an sm_90 GPU: the Hopper GEMM is not used here");
    return;
  }
  for (int64_t n : {136, 1000})  // whole and ragged 8-column runs
    for (float p : {0.1f, 1.0f})
      for (bool bias : {true, false}) {
        const Tensor x = rand64({300, 4096}, g).to(DType::bf16).to(kGpu);
        const Tensor w = rand64({n, 4096}, g).to(DType::bf16).to(kGpu);
        const Tensor b = bias ? rand64({n}, g).to(DType::bf16).to(kGpu) : Tensor();
        const DropoutSpec d{p, 11, 12};
        Tensor y = Tensor::full({300, n}, NAN, DType::bf16, kGpu);
        CHECK(linear_dropout(x, w, b, d, y));
        Tensor z = Tensor::empty({300, n}, DType::bf16, kGpu), ref = z.clone();
        cuda::sm90_gemm(x, w, z,  // the fused kernel's product: cooperative, never split
                        {.trans_b = true,
                         .schedule = cuda::Sm90Schedule::cooperative,
                         .splits = 1,
                         .tile_n = n >= 256 ? 256 : 128});
        bias_dropout(z, b, d, ref);
        CHECK_MESSAGE(equal_and_written(y, ref), "n ", n, " p ", p, " bias ", bias);
      }
  const Tensor x = rand64({64, 1024}, g).to(DType::bf16).to(kGpu);
  const Tensor w = rand64({16, 1024}, g).to(DType::bf16).to(kGpu);
  Tensor y = Tensor::empty({64, 16}, DType::bf16, kGpu);
  CHECK(linear_dropout(x, w, {}, {0.1f, 1, 2}, y));  // K = 1024: the measured range's start
  const Tensor x8 = rand64({64, 1016}, g).to(DType::bf16).to(kGpu);
  const Tensor w8 = rand64({16, 1016}, g).to(DType::bf16).to(kGpu);
  CHECK(!linear_dropout(x8, w8, {}, {0.1f, 1, 2}, y));  // just below it
  const Tensor xl = rand64({64, 4104}, g).to(DType::bf16).to(kGpu);
  const Tensor wl = rand64({16, 4104}, g).to(DType::bf16).to(kGpu);
  CHECK(!linear_dropout(xl, wl, {}, {0.1f, 1, 2}, y));  // past 4096: measured slower there
  const Tensor xk = rand64({64, 4096}, g).to(DType::bf16).to(kGpu);
  const Tensor wk = rand64({16, 4096}, g).to(DType::bf16).to(kGpu);
  CHECK(!linear_dropout(xk, wk, {}, {}, y));  // no dropout: the plain GEMM's bias epilogue
  Tensor y32 = Tensor::empty({64, 16}, DType::f32, kGpu);
  CHECK(!linear_dropout(xk.to(DType::f32), wk.to(DType::f32), {}, {0.1f, 1, 2}, y32));
  Tensor bad = Tensor::empty({64, 24}, DType::bf16, kGpu);
  CHECK_THROWS_WITH(linear_dropout(xk, wk, {}, {0.1f, 1, 2}, bad),
                    doctest::Contains("[linear_dropout] y"));
}

TEST_CASE("linear_act declines the CPU and checks its arguments") {
  Generator g(75);
  const Tensor x = rand64({5, 8}, g), w = rand64({16, 8}, g), w2 = rand64({8, 16}, g);
  Tensor z = Tensor::empty({5, 16}, DType::f64), hd = z.clone(), dz = z.clone();
  CHECK(!linear_act(x, w, {}, Activation::gelu_erf, {}, z, hd));  // the CPU runs gemm + kernels
  CHECK(!linear_act_backward(x, w2, z, {}, Activation::gelu_erf, {}, dz, hd));
  Tensor short_z = Tensor::empty({4, 16}, DType::f64);
  CHECK_THROWS_WITH(linear_act(x, w, {}, Activation::gelu_erf, {}, short_z, hd),
                    doctest::Contains("[linear_act] z"));
  CHECK_THROWS_WITH(linear_act(x, w, {}, Activation::gelu_erf, {-0.5f, 1, 0}, z, hd),
                    doctest::Contains("[linear_act]"));
  CHECK_THROWS_WITH(linear_act(x, w2, {}, Activation::gelu_erf, {}, z, hd),
                    doctest::Contains("[linear_act] x is [5, 8] but w is [8, 16]"));
  CHECK_THROWS_WITH(linear_act_backward(x, w, z, {}, Activation::gelu_erf, {}, dz, hd),
                    doctest::Contains("[linear_act_backward] dy is [5, 8] but w is [16, 8]"));
  // linear_dropout likewise (Note [Output dropout in the GEMM]).
  CHECK(!linear_dropout(x, w, {}, {0.1f, 1, 2}, z));
  CHECK_THROWS_WITH(linear_dropout(x, w2, {}, {0.1f, 1, 2}, z),
                    doctest::Contains("[linear_dropout] x is [5, 8] but w is [8, 16]"));
  CHECK_THROWS_WITH(linear_dropout(x, w, {}, {0.1f, 1, 2}, short_z),
                    doctest::Contains("[linear_dropout] y"));
  CHECK_THROWS_WITH(linear_dropout(x, w, {}, {1.5f, 1, 2}, z),
                    doctest::Contains("[linear_dropout]"));
}
