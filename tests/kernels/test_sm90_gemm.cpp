// tests/kernels/test_sm90_gemm.cpp — fused-ffn's own Hopper GEMM (kernels/cuda/gemm/): the
// plain product in every layout and split-K against the CPU reference, the fc1, activation
// and GLU epilogues against the GEMM followed by the unfused kernels, and the argument checks
// of linear_act / linear_glu (FFN_GPU_TEST cases skip visibly without a GPU). The cuBLASLt
// GEMM's cases are in test_gemm.cpp.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/bias_act_dropout.h"
#include "kernels/bias_glu_dropout.h"
#include "kernels/cuda/gemm/sm90_gemm.h"
#include "kernels/gemm.h"
#include "kernels/rope.h"
#include "tests/kernels/kernel_tests.h"
#include "tests/test_util.h"

using namespace ffn;
using namespace ffn::test;

namespace {
// Equal values and NaN-free (the outputs start as NaN, so an unwritten element shows).
bool equal_and_written(const Tensor& a, const Tensor& b) {
  const auto va = a.to_vector(), vb = b.to_vector();
  for (size_t i = 0; i < va.size(); ++i)
    if (std::isnan(va[i]) || std::isnan(vb[i]) || va[i] != vb[i]) return false;
  return va.size() == vb.size();
}
}  // namespace

// fused-ffn's own Hopper GEMM (kernels/cuda/gemm/): C = op(A)·op(B) (+ bias) in every layout
// against the f64 CPU reference by the low-precision rule, every element written (the output
// is poisoned with NaN first), two runs bitwise equal; and the fused fc1 epilogue against the
// unfused path.
namespace {
bool sm90_here() {
  const Tensor probe = Tensor::zeros({8, 8}, DType::bf16, kGpu);
  return cuda::sm90_gemm_supported(probe, probe, probe, false, true);
}
const char* layout_name(bool ta, bool tb) {
  return ta ? (tb ? "TT" : "TN") : (tb ? "NT" : "NN");
}
}  // namespace

FFN_GPU_TEST("sm90 GEMM (TMA + wgmma) matches the CPU reference in every layout at odd shapes") {
  Generator g(71);
  if (!sm90_here()) {
    MESSAGE("not an sm_90 GPU: the Hopper GEMM is not used here, cuBLASLt is");
    return;
  }
  // (M, N, K): M = 1, odd M, N and K (tails of the 128-row and 128/256-column tiles and of
  // the 64-wide k-block), N < 256 (BN = 128) and N >= 256 (BN = 256). A layout runs a shape
  // when its operands' rows are multiples of 8 elements (TMA); the others must be refused.
  const int64_t dims[][3] = {{1, 8, 8},      {7, 3, 64},       {129, 257, 72},  {136, 264, 1001},
                             {1000, 64, 1000}, {64, 4097, 136}, {300, 1600, 776}, {8, 16, 7}};
  for (auto& d : dims)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const int64_t m = d[0], n = d[1], k = d[2];
        const std::vector<int64_t> sa = ta ? std::vector<int64_t>{k, m} : std::vector<int64_t>{m, k};
        const std::vector<int64_t> sb = tb ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n};
        const bool runs = sa[1] % 8 == 0 && sb[1] % 8 == 0;
        for (DType dt : {DType::bf16, DType::f16}) {
          const Tensor a64 = exact(rand64(sa, g), dt), b64 = exact(rand64(sb, g), dt);
          const Tensor a = a64.to(dt).to(kGpu), b = b64.to(dt).to(kGpu);
          const std::string shape = std::string("sm90 gemm ") + layout_name(ta, tb) + " " +
                                    dtype_name(dt) + " m" + std::to_string(m) + " n" +
                                    std::to_string(n) + " k" + std::to_string(k);
          CHECK_MESSAGE(cuda::sm90_gemm_supported(a, b, Tensor::empty({m, n}, dt, kGpu), ta, tb) ==
                            runs,
                        shape, ": supported() disagrees with the row rule");
          if (!runs) continue;
          for (bool bias : {false, true}) {
            const Tensor c64 = exact(rand64({n}, g), dt);
            const Tensor ref =
                matmul(a64, b64, {.trans_a = ta, .trans_b = tb, .bias = bias ? c64 : Tensor()});
            const Tensor naive =
                matmul(a64.to(DType::f32), b64.to(DType::f32),
                       {.trans_a = ta, .trans_b = tb, .bias = bias ? c64.to(DType::f32) : Tensor()});
            for (cuda::Sm90Schedule sched :
                 {cuda::Sm90Schedule::cooperative, cuda::Sm90Schedule::pingpong})
              for (bool tma : {true, false}) {
                const cuda::Sm90GemmArgs args{.trans_a = ta,
                                              .trans_b = tb,
                                              .bias = bias ? c64.to(dt).to(kGpu) : Tensor(),
                                              .schedule = sched,
                                              .tma_store = tma};
                Tensor out = Tensor::full({m, n}, NAN, dt, kGpu),
                       again = Tensor::full({m, n}, NAN, dt, kGpu);
                cuda::sm90_gemm(a, b, out, args);
                cuda::sm90_gemm(a, b, again, args);
                const std::string what =
                    shape + (bias ? " +bias" : "") +
                    (sched == cuda::Sm90Schedule::pingpong ? " ping-pong" : " cooperative") +
                    (tma ? " tma-store" : " register-store");
                check_against_reference(out, ref, naive, dt, what,
                                        {.reduce_len = static_cast<double>(k), .term_bound = 1.0});
                CHECK_MESSAGE(equal_and_written(out, again), what, ": two runs differ");
              }
          }
        }
      }
  // More tiles than SMs, so CTAs take a second tile (in ping-pong: the second warpgroup's),
  // and more k-blocks than stages, so the stage ring wraps many times within one tile. With
  // 9 × 16 tiles of 128 × 128, tiles 132..143 are the CTAs' second ones: row tile 8, the
  // last 76 rows, which are checked against the reference.
  {
    const int64_t m = 1100, n = 2000, k = 4104, r0 = 1024;
    const Tensor a64 = exact(rand64({m, k}, g), DType::bf16),
                 b64 = exact(rand64({n, k}, g), DType::bf16);
    const Tensor tail = a64.narrow(0, r0, m - r0).contiguous();
    const Tensor ref = matmul(tail, b64, {.trans_b = true});
    const Tensor naive = matmul(tail.to(DType::f32), b64.to(DType::f32), {.trans_b = true});
    const Tensor a = a64.to(DType::bf16).to(kGpu), b = b64.to(DType::bf16).to(kGpu);
    for (cuda::Sm90Schedule sched :
         {cuda::Sm90Schedule::cooperative, cuda::Sm90Schedule::pingpong}) {
      Tensor out = Tensor::full({m, n}, NAN, DType::bf16, kGpu);
      cuda::sm90_gemm(a, b, out, {.trans_b = true, .schedule = sched});
      check_against_reference(out.narrow(0, r0, m - r0).contiguous(), ref, naive, DType::bf16,
                              sched == cuda::Sm90Schedule::pingpong
                                  ? "sm90 gemm 1100x2000x4104 ping-pong"
                                  : "sm90 gemm 1100x2000x4104 cooperative",
                              {.reduce_len = static_cast<double>(k), .term_bound = 1.0});
      const auto all = out.to_vector();
      CHECK(std::none_of(all.begin(), all.end(), [](double v) { return std::isnan(v); }));
    }
  }
  // What it does not take goes to cuBLASLt: K % 8 != 0, f32, a misaligned base, shapes that
  // disagree; and sm90_gemm itself refuses them by name.
  const Tensor probe = Tensor::zeros({8, 8}, DType::bf16, kGpu);
  const Tensor k7 = Tensor::zeros({4, 7}, DType::bf16, kGpu);
  CHECK(!cuda::sm90_gemm_supported(k7, k7, Tensor::zeros({4, 4}, DType::bf16, kGpu), false, true));
  const Tensor f = Tensor::zeros({4, 8}, DType::f32, kGpu);
  CHECK(!cuda::sm90_gemm_supported(f, f, Tensor::zeros({4, 4}, DType::f32, kGpu), false, true));
  const Tensor base = Tensor::zeros({4 * 8 + 1}, DType::bf16, kGpu);
  const Tensor off = base.narrow(0, 1, 32).reshape({4, 8});
  Tensor c44 = Tensor::zeros({4, 4}, DType::bf16, kGpu);
  CHECK(!cuda::sm90_gemm_supported(off, probe.narrow(0, 0, 4), c44, false, true));
  CHECK(!cuda::sm90_gemm_supported(probe, probe, c44, false, true));
  CHECK_THROWS_WITH(cuda::sm90_gemm(probe, probe, c44, {.trans_b = true}),
                    doctest::Contains("[sm90_gemm] cannot run a [8, 8] bf16"));
}

FFN_GPU_TEST("sm90 GEMM split-K (Note [Split-K]) matches the CPU reference; runs are bitwise equal") {
  Generator g(73);
  if (!sm90_here()) {
    MESSAGE("not an sm_90 GPU: the Hopper GEMM is not used here, cuBLASLt is");
    return;
  }
  // Forced split counts (uneven K ranges: 17 K blocks in 2, 5 or 17 parts; 1001 = a ragged
  // last block) in every layout and both schedules, N odd (the reduce's element-wise path)
  // and N % 4 == 0 (its 16-byte path); then shapes the cost model splits by itself.
  struct Case {
    int64_t m, n, k;
    int splits;
  };
  const Case cases[] = {{129, 257, 1088, 2}, {136, 264, 1001, 5}, {64, 72, 1088, 17},
                        {8, 16, 520, 3},     {256, 256, 8192, 0}, {384, 768, 4096, 0}};
  for (const Case& cs : cases)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const int64_t m = cs.m, n = cs.n, k = cs.k;
        const std::vector<int64_t> sa = ta ? std::vector<int64_t>{k, m} : std::vector<int64_t>{m, k};
        const std::vector<int64_t> sb = tb ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n};
        if (sa[1] % 8 != 0 || sb[1] % 8 != 0) continue;  // not a TMA layout (tested above)
        const Tensor a64 = exact(rand64(sa, g), DType::bf16), b64 = exact(rand64(sb, g), DType::bf16);
        const Tensor c64 = exact(rand64({n}, g), DType::bf16);
        const Tensor ref = matmul(a64, b64, {.trans_a = ta, .trans_b = tb, .bias = c64});
        const Tensor naive = matmul(a64.to(DType::f32), b64.to(DType::f32),
                                    {.trans_a = ta, .trans_b = tb, .bias = c64.to(DType::f32)});
        const Tensor a = a64.to(DType::bf16).to(kGpu), b = b64.to(DType::bf16).to(kGpu);
        for (cuda::Sm90Schedule sched :
             {cuda::Sm90Schedule::automatic, cuda::Sm90Schedule::pingpong}) {
          if (cs.splits == 0 && sched != cuda::Sm90Schedule::automatic) continue;
          const cuda::Sm90GemmArgs args{.trans_a = ta,
                                        .trans_b = tb,
                                        .bias = c64.to(DType::bf16).to(kGpu),
                                        .schedule = sched,
                                        .splits = cs.splits};
          Tensor out = Tensor::full({m, n}, NAN, DType::bf16, kGpu), again = out.clone();
          cuda::sm90_gemm(a, b, out, args);
          cuda::sm90_gemm(a, b, again, args);
          const std::string what = std::string("sm90 split-K ") + layout_name(ta, tb) + " m" +
                                   std::to_string(m) + " n" + std::to_string(n) + " k" +
                                   std::to_string(k) + " splits " + std::to_string(cs.splits) +
                                   (sched == cuda::Sm90Schedule::pingpong ? " ping-pong" : "");
          check_against_reference(out, ref, naive, DType::bf16, what,
                                  {.reduce_len = static_cast<double>(k), .term_bound = 1.0});
          CHECK_MESSAGE(equal_and_written(out, again), what, ": two runs differ");
        }
      }
  const Tensor probe = Tensor::zeros({8, 8}, DType::bf16, kGpu);
  Tensor c88 = Tensor::zeros({8, 8}, DType::bf16, kGpu);
  CHECK_THROWS_WITH(cuda::sm90_gemm(probe, probe, c88, {.trans_b = true, .splits = -1}),
                    doctest::Contains("[sm90_gemm] splits must be >= 0"));
}

// Note [Operand multicast]: the plain kernels in clusters sharing A (K-major A, an even number
// of column tiles) compute what they compute alone, bit for bit: both schedules, both B
// layouts, split-K, rows past m in a partner's half of A; 1100 × 768 pairs at BN = 128 and not
// at the cooperative kernel's BN = 256 (3 tiles).
FFN_GPU_TEST("sm90 GEMM: clusters sharing A change no bits") {
  Generator g(79);
  if (!sm90_here()) {
    MESSAGE("not an sm_90 GPU: the Hopper GEMM is not used here, cuBLASLt is");
    return;
  }
  struct Restore {
    bool was = gemm_multicast();
    ~Restore() { set_gemm_multicast(was); }
  } restore;
  struct Case {
    int64_t m, n, k;
    int splits;
  };
  const Case cases[] = {{300, 512, 200, 1}, {1100, 768, 64, 1}, {129, 256, 1088, 5}};
  for (const Case& cs : cases)
    for (bool tb : {false, true})
      for (cuda::Sm90Schedule sched : {cuda::Sm90Schedule::automatic, cuda::Sm90Schedule::pingpong,
                                       cuda::Sm90Schedule::cooperative}) {
        const int64_t m = cs.m, n = cs.n, k = cs.k;
        const Tensor a = rand64({m, k}, g).to(DType::bf16).to(kGpu);
        const Tensor b = (tb ? rand64({n, k}, g) : rand64({k, n}, g)).to(DType::bf16).to(kGpu);
        const cuda::Sm90GemmArgs args{.trans_b = tb,
                                      .bias = rand64({n}, g).to(DType::bf16).to(kGpu),
                                      .schedule = sched,
                                      .splits = cs.splits};
        Tensor out[2];
        for (int mc = 0; mc < 2; ++mc) {
          set_gemm_multicast(mc == 1);
          out[mc] = Tensor::full({m, n}, NAN, DType::bf16, kGpu);
          cuda::sm90_gemm(a, b, out[mc], args);
        }
        const std::string what = std::string("sm90 clusters ") + layout_name(false, tb) + " m" +
                                 std::to_string(m) + " n" + std::to_string(n) + " k" +
                                 std::to_string(k) + " splits " + std::to_string(cs.splits) +
                                 " schedule " + std::to_string(static_cast<int>(sched));
        CHECK_MESSAGE(equal_and_written(out[0], out[1]), what);
      }
}

// Note [Own GEMM in gemm()]: gemm() runs the own GEMM where the mode says so (always), or
// where a choices file (Note [GEMM choices]) names one of its schedules; exactly the kernel
// sm90_gemm runs with that schedule, bit for bit. A call the own GEMM does not take (beta =
// 1) runs cuBLASLt's algorithm of the same plan.
FFN_GPU_TEST("gemm runs the own Hopper GEMM where told or where its choice was restored") {
  Generator g(75);
  if (!sm90_here()) {
    MESSAGE("not an sm_90 GPU: the Hopper GEMM is not used here, cuBLASLt is");
    return;
  }
  const bool tuned = gemm_autotune();
  const OwnGemm own = own_gemm();
  set_gemm_autotune(true);
  // Timed products (m·n·k ≥ 2^30): a·b and a·btᵀ + bias; and a small one (never timed).
  const Tensor a = rand64({1024, 1024}, g).to(DType::bf16).to(kGpu);
  const Tensor b = rand64({1024, 1536}, g).to(DType::bf16).to(kGpu);
  const Tensor bt = rand64({1536, 1024}, g).to(DType::bf16).to(kGpu);
  const Tensor bias = rand64({1536}, g).to(DType::bf16).to(kGpu);
  const Tensor s = rand64({72, 40}, g).to(DType::f16).to(kGpu);
  const Tensor st = rand64({24, 40}, g).to(DType::f16).to(kGpu);
  auto ours = [&](const Tensor& x, const Tensor& y, bool tb, const Tensor& bb,
                  cuda::Sm90Schedule sched) {
    Tensor c = Tensor::full({x.size(0), tb ? y.size(0) : y.size(1)}, NAN, x.dtype(), kGpu);
    cuda::sm90_gemm(x, y, c, {.trans_b = tb, .bias = bb, .schedule = sched});
    return c.to_vector();
  };
  auto run = [&] {
    return std::vector{matmul(a, b).to_vector(),
                       matmul(a, bt, {.trans_b = true, .bias = bias}).to_vector(),
                       matmul(s, st, {.trans_b = true}).to_vector()};
  };
  // beta = 1 accumulates into c: never the own GEMM, which only overwrites. (A product too
  // small to be timed, so that cuBLASLt's algorithm is the heuristic's in every mode.)
  const Tensor a2 = a.narrow(0, 0, 256).contiguous();
  auto accumulate = [&] {
    Tensor c = Tensor::full({256, 1536}, 0.5, DType::bf16, kGpu);
    gemm(a2, bt, c, {.trans_b = true, .beta = 1.0});
    return c.to_vector();
  };
  set_own_gemm(OwnGemm::never);
  reset_gemm_choices();
  const auto lt = run();
  const std::string text = gemm_choices();  // two cuBLASLt lines
  REQUIRE(std::count(text.begin(), text.end(), '\n') == 4);
  const auto lt_acc = accumulate();

  set_own_gemm(OwnGemm::always);
  reset_gemm_choices();
  const auto all = run();
  CHECK(all[0] == ours(a, b, false, Tensor(), cuda::Sm90Schedule::automatic));
  CHECK(all[1] == ours(a, bt, true, bias, cuda::Sm90Schedule::automatic));
  CHECK(all[2] == ours(s, st, true, Tensor(), cuda::Sm90Schedule::automatic));
  CHECK(accumulate() == lt_acc);
  CHECK(gemm_choice_stats().own == 4);  // the three products and the accumulating one's plan
  // An f32 product is cuBLASLt's whatever the mode (the own GEMM takes bf16/f16 only).
  const Tensor f = rand64({64, 64}, g).to(DType::f32).to(kGpu);
  CHECK(max_abs_diff(matmul(f, f), matmul(f.to(DType::f64).to(Device::cpu()),
                                          f.to(DType::f64).to(Device::cpu()))
                                       .to(DType::f32)
                                       .to(kGpu)) < 1e-4);

  // A choices file that names the own GEMM's schedules (the first product ping-pong, the
  // second cooperative) runs them under OwnGemm::tuned, and is written back the same.
  const size_t e3 = text.find('\n', text.find('\n', text.find('\n') + 1) + 1);  // line 3's end
  const std::string named = text.substr(0, e3) + " sm90 pingpong\n" +
                            text.substr(e3 + 1, text.size() - e3 - 2) + " sm90 cooperative\n";
  set_own_gemm(OwnGemm::tuned);
  reset_gemm_choices();
  CHECK(restore_gemm_choices(named, "test").count == 2);
  // Which line is which product: lines are sorted by (batch, m, n, k, ta, tb, ...), and both
  // have m = 1024, n = 1536, k = 1024, so a·b (tb = 0) comes first.
  const auto restored = run();
  CHECK(restored[0] == ours(a, b, false, Tensor(), cuda::Sm90Schedule::pingpong));
  CHECK(restored[1] == ours(a, bt, true, bias, cuda::Sm90Schedule::cooperative));
  CHECK(restored[2] == lt[2]);  // not timed, not named: cuBLASLt's heuristic choice
  CHECK(gemm_choice_stats().restored == 2);
  CHECK(gemm_choice_stats().own == 2);
  CHECK(gemm_choice_stats().timed == 0);
  CHECK(gemm_choices() == named);
  CHECK(accumulate() == lt_acc);  // the restored line's cuBLASLt algorithm
  // Under OwnGemm::never the same file runs cuBLASLt's algorithms of those lines.
  set_own_gemm(OwnGemm::never);
  reset_gemm_choices();
  restore_gemm_choices(named, "test");
  CHECK(run() == lt);
  CHECK(gemm_choice_stats().own == 0);

  // Version 1 files (no own-GEMM field, no SM count in the context line) still read; a
  // field they cannot have, a schedule that does not exist and a version from the future are
  // errors naming the line.
  const size_t e1 = text.find('\n'), e2 = text.find('\n', e1 + 1);
  const std::string context = text.substr(e1 + 1, e2 - e1 - 1);  // "cublaslt V sm_90 sms N"
  REQUIRE(context.find(" sms ") != std::string::npos);
  const std::string v1_head =
      "# fused-ffn GEMM choices 1 (kernels/gemm.h)\n" + context.substr(0, context.find(" sms "));
  reset_gemm_choices();
  const RestoredGemmChoices r1 = restore_gemm_choices(v1_head + text.substr(e2), "v1.txt");
  CHECK(r1.skipped.empty());
  CHECK(r1.count == 2);
  CHECK(run() == lt);
  CHECK_THROWS_WITH_AS(restore_gemm_choices(v1_head + named.substr(e2), "v1.txt"),
                       doctest::Contains("v1.txt line 3: trailing text"), Error);
  std::string fast = named;
  fast.replace(fast.find("sm90 pingpong"), 13, "sm90 fastest");
  CHECK_THROWS_WITH_AS(restore_gemm_choices(fast, "f.txt"),
                       doctest::Contains("f.txt line 3: after the algorithm only 'sm90 "
                                         "\"cooperative\", \"pingpong\" or \"automatic\"'"),
                       Error);
  std::string v3 = named;
  v3[std::string("# fused-ffn GEMM choices ").size()] = '3';
  CHECK_THROWS_WITH_AS(restore_gemm_choices(v3, "f.txt"),
                       doctest::Contains("f.txt line 1: a GEMM choices file of a version this "
                                         "build does not read"),
                       Error);
  reset_gemm_choices();
  set_own_gemm(own);
  set_gemm_autotune(tuned);
}

FFN_GPU_TEST("sm90 GEMM's rotary epilogue matches rope(x·Wᵀ + b) of the CPU reference") {
  Generator g(74);
  if (!sm90_here()) {
    MESSAGE("not an sm_90 GPU: the Hopper GEMM is not used here, cuBLASLt is");
    return;
  }
  // Note [Fused rotary embeddings]: rows are (b, t) with t = row % T; the first rope_cols
  // columns are heads of 64 rotated, the rest stored as they are. T odd and not a divisor of
  // the 128-row tile; N < 256 (BN 128) and N ≥ 256 (BN 256, two heads per 128 columns); K
  // with a ragged last block; both schedules; with and without a bias.
  struct Case {
    int64_t b, t, heads, k;
  };
  for (const Case& cs : {Case{3, 37, 1, 72}, Case{2, 100, 2, 136}, Case{1, 300, 4, 64}})
    for (DType dt : {DType::bf16, DType::f16}) {
      const int64_t m = cs.b * cs.t, n = 3 * cs.heads * 64, rot = 2 * cs.heads * 64;
      const Tensor x64 = exact(rand64({m, cs.k}, g), dt), w64 = exact(rand64({n, cs.k}, g), dt);
      const Tensor bias64 = exact(rand64({n}, g), dt);
      for (bool bias : {false, true}) {
        auto reference = [&](DType type) {  // rope(x·Wᵀ + b) on the CPU in `type`
          const Tensor z = matmul(x64.to(type), w64.to(type),
                                  {.trans_b = true, .bias = bias ? bias64.to(type) : Tensor()});
          Tensor out = Tensor::empty({cs.b, cs.t, n}, type);
          rope(z.reshape({cs.b, cs.t, n}), cs.heads, cs.heads, 10000.0, false, out);
          return out.reshape({m, n});
        };
        const Tensor ref = reference(DType::f64), naive = reference(DType::f32);
        for (cuda::Sm90Schedule sched :
             {cuda::Sm90Schedule::automatic, cuda::Sm90Schedule::pingpong}) {
          const cuda::Sm90GemmArgs args{.trans_b = true,
                                        .bias = bias ? bias64.to(dt).to(kGpu) : Tensor(),
                                        .schedule = sched,
                                        .rope_base = 10000.0,
                                        .rope_seq = cs.t,
                                        .rope_cols = rot};
          Tensor out = Tensor::full({m, n}, NAN, dt, kGpu), again = out.clone();
          cuda::sm90_gemm(x64.to(dt).to(kGpu), w64.to(dt).to(kGpu), out, args);
          cuda::sm90_gemm(x64.to(dt).to(kGpu), w64.to(dt).to(kGpu), again, args);
          const std::string what = std::string("sm90 rope epilogue ") + dtype_name(dt) + " T" +
                                   std::to_string(cs.t) + " heads " + std::to_string(cs.heads) +
                                   (bias ? " +bias" : "") +
                                   (sched == cuda::Sm90Schedule::pingpong ? " ping-pong" : "");
          // Each output is c·u − s·v of two length-K products: 2K terms of at most 1.
          check_against_reference(
              out, ref, naive, dt, what,
              {.reduce_len = 2.0 * static_cast<double>(cs.k), .term_bound = 1.0});
          CHECK_MESSAGE(equal_and_written(out, again), what, ": two runs differ");
        }
      }
    }
  // What it does not take says so.
  const Tensor x = Tensor::zeros({8, 64}, DType::bf16, kGpu),
               w = Tensor::zeros({192, 64}, DType::bf16, kGpu);
  Tensor c = Tensor::zeros({8, 192}, DType::bf16, kGpu);
  for (const cuda::Sm90GemmArgs& bad :
       {cuda::Sm90GemmArgs{.trans_b = true, .rope_base = 1e4, .rope_seq = 8, .rope_cols = 100},
        cuda::Sm90GemmArgs{.trans_b = true, .rope_base = 1e4, .rope_seq = 8, .rope_cols = 256},
        cuda::Sm90GemmArgs{.trans_b = true, .rope_base = 1e4, .rope_seq = 0, .rope_cols = 128},
        cuda::Sm90GemmArgs{.trans_b = true,
        .tma_store = false,
        .rope_base = 1e4,
        .rope_seq = 8,
        .rope_cols = 128}})
    CHECK_THROWS_WITH(cuda::sm90_gemm(x, w, c, bad),
                      doctest::Contains("[sm90_gemm] rotary embeddings in the epilogue need x·Wᵀ"));
  Tensor c2 = Tensor::zeros({64, 64}, DType::bf16, kGpu);
  CHECK_THROWS_WITH(
      cuda::sm90_gemm(w, w, c2,
                      {.trans_a = true, .rope_base = 1e4, .rope_seq = 8, .rope_cols = 128}),
      doctest::Contains("got trans_a=1, trans_b=0"));
}

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
      for (Activation act : {Activation::gelu_tanh, Activation::gelu_erf, Activation::silu})
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
  // The front doors take the Hopper path for 16-bit operands with a long enough K (from 768:
  // the activation warpgroups, db in the kernel; K = 4096 as well, where the ping-pong ActTma
  // ran until session 14) and decline f32 and short K (the caller then runs gemm +
  // bias_act_dropout); a mismatched output is an error naming the op.
  for (int64_t kl : {768, 4096}) {
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
    // With the hidden dropout they run from K = 1024 (measured: kActDropoutMinK in
    // kernels/bias_act_dropout.cpp).
    const DropoutSpec d{0.1f, 5, 6};
    CHECK(linear_act(xl, wl, {}, Activation::gelu_erf, d, zl, hl) == (kl >= 1024));
    CHECK(linear_act_backward(xl, wl2, zl, {}, Activation::gelu_erf, d, dzl, hl, &dbl) ==
          (kl >= 1024));
  }
  const Tensor x = rand64({64, 32}, g).to(DType::bf16).to(kGpu);
  const Tensor w = rand64({16, 32}, g).to(DType::bf16).to(kGpu);
  Tensor z = Tensor::empty({64, 16}, DType::bf16, kGpu), hd = z.clone();
  CHECK(!linear_act(x, w, {}, Activation::gelu_erf, {}, z, hd));  // K = 32: measured slower
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
// runs it on Hopper from K = 1024 (returning z) and declines elsewhere (an undefined z);
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
  // The front door: K = 1024 runs here, K = 768 and f32 decline; bad shapes are named.
  for (int64_t kl : {768, 1024}) {
    const Tensor x = rand64({200, kl}, g).to(DType::bf16).to(kGpu);
    const Tensor w = rand64({256, kl}, g).to(DType::bf16).to(kGpu);
    Tensor out = Tensor::empty({200, 128}, DType::bf16, kGpu);
    const Tensor z = linear_glu(x, w, {}, Activation::silu, {}, out);
    CHECK(z.defined() == (kl >= 1024));
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
  // The backward's front door: K = 1024 runs (db in the kernel), K = 768 declines.
  for (int64_t kl : {768, 1024}) {
    const Tensor dy = rand64({200, kl}, g).to(DType::bf16).to(kGpu);
    const Tensor w2 = rand64({kl, 136}, g).to(DType::bf16).to(kGpu);
    const Tensor zl = rand64({200, 272}, g).to(DType::bf16).to(kGpu);
    Tensor dz = Tensor::empty({200, 272}, DType::bf16, kGpu),
           o = Tensor::empty({200, 136}, DType::bf16, kGpu),
           db = Tensor::full({272}, NAN, DType::bf16, kGpu), db_ref = db.clone();
    CHECK(linear_glu_backward(dy, w2, zl, {}, Activation::gelu_tanh, {}, dz, o, &db) ==
          (kl >= 1024));
    if (kl < 1024) continue;
    bias_grad(dz, db_ref);
    check_close(db, db_ref, 1e-6 * 200, 0x1p-7, "linear_glu_backward db");
  }
  Tensor dz_bad = Tensor::empty({8, 200}, DType::bf16, kGpu);
  CHECK_THROWS_WITH(
      cuda::sm90_gemm_nn_glu_backward(x, rand64({1024, 100}, g).to(DType::bf16).to(kGpu), z, {},
                                      Activation::silu, {}, dz_bad, bad),
      doctest::Contains("[sm90_gemm] the GLU backward"));
}

// Note [Dynamic unit order]: the activation kernels' units taken from the global counter or in
// the static order give the same bits (every tile and db partial is one CTA's, the same
// inputs in the same order), for the plain and the GLU kernels, forward and backward with
// db, with and without dropout, at a shape whose ring wraps (more than 8 tiles a CTA) and at
// GPT-2's fc1.
// Note [Dynamic unit order] and Note [Operand multicast]: the dynamic order, the static one
// and the static one in clusters of two CTAs sharing A compute every tile alike. The shapes'
// column tiles pair up (multicast runs in the forwards, rows past m in a partner's half of A
// included; in the plain backward at 600 × 512 × 2048, act_multicast's K >= 2048) except the
// last one's (odd: multicast declines).
FFN_GPU_TEST("sm90 activation GEMMs: the unit order and operand multicast change no bits") {
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
    ~Restore() {
      set_gemm_dynamic_order(order);
      set_gemm_multicast(multicast);
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
        const char* name;
      } runs[] = {{true, false, "dynamic"}, {false, false, "static"}, {false, true, "multicast"}};
      std::vector<Tensor> outs[3];
      for (int r = 0; r < 3; ++r) {
        set_gemm_dynamic_order(runs[r].dynamic);
        set_gemm_multicast(runs[r].multicast);
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
      for (int r = 1; r < 3; ++r)
        for (size_t i = 0; i < outs[0].size(); ++i)
          CHECK_MESSAGE(equal_and_written(outs[0][i], outs[r][i]), what, ": ", names[i], ", ",
                        runs[r].name, " against dynamic");
    }
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
}
