// tests/kernels/test_sm90_gemm.cpp — fused-ffn's own Hopper GEMM (kernels/cuda/gemm/): the
// plain product in every layout and split-K against the CPU reference, clusters sharing A,
// dependent launches, gemm()'s use of it and the rotary epilogue (FFN_GPU_TEST cases skip
// visibly without a GPU). Its epilogues with the FFN's activation are in test_sm90_act.cpp, the
// cuBLASLt GEMM's cases in test_gemm.cpp.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/cuda/gemm/sm90_gemm.h"
#include "kernels/gemm.h"
#include "kernels/rope.h"
#include "tests/kernels/kernel_tests.h"
#include "tests/kernels/sm90_tests.h"
#include "tests/test_util.h"

using namespace ffn;
using namespace ffn::test;

// How the own GEMM cuts a product (sm90_gemm_plan: host logic, so CI's CUDA build runs it
// without a GPU) on an H100's 132 SMs and 50 MiB of L2: Note [Tile groups]' longer groups
// where B is larger than L2, Note [Split-K]'s cost model (192-column tiles unsplit for gpt2's
// fc1 and fc2 weight gradients, split where there are few tiles), and forced values kept.
TEST_CASE("sm90 GEMM plan: tile width, split count and tile groups by shape, or as forced") {
#if FFN_WITH_CUDA
  constexpr int kSms = 132;
  constexpr int64_t kL2 = int64_t{50} << 20;
  struct Case {
    const char* what;
    int64_t m, n, k;
    int tile_n, splits, group_m;
  };
  const Case cases[] = {
      {"gpt2 LM head forward (B: 77 MB, x's row blocks 196 KB)", 16384, 50304, 768, 256, 1, 32},
      {"gpt2 LM head dgrad (B: 77 MB, A's row blocks 12.9 MB)", 16384, 768, 50304, 256, 1, 16},
      {"ffn_d4096 fc2 weight gradient (B: 268 MB)", 4096, 16384, 8192, 256, 1, 16},
      {"welder_fc2 forward (16 tile rows)", 2048, 4096, 16384, 256, 1, 16},
      {"gpt2 fc1 forward (B fits in L2)", 16384, 3072, 768, 256, 1, 8},
      {"gpt2 fc1 weight gradient (96 tiles of 192 columns)", 3072, 768, 16384, 192, 1, 8},
      {"gpt2 fc2 weight gradient", 768, 3072, 16384, 192, 1, 8},
      {"gpt2 proj weight gradient (24 tiles: split)", 768, 768, 16384, 192, 5, 8},
      {"one row", 1, 8, 8, 128, 1, 8},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    const cuda::Sm90Plan p = cuda::sm90_gemm_plan(c.m, c.n, c.k, kSms, kL2);
    CHECK(!p.pingpong);
    CHECK(p.tile_n == c.tile_n);
    CHECK(p.splits == c.splits);
    CHECK(p.group_m == c.group_m);
  }
  const cuda::Sm90Plan pp =
      cuda::sm90_gemm_plan(3072, 768, 16384, kSms, kL2, {.schedule = cuda::Sm90Schedule::pingpong});
  CHECK((pp.pingpong && pp.tile_n == 128 && pp.splits == 1));  // forced schedules never split
  const cuda::Sm90Plan forced = cuda::sm90_gemm_plan(16384, 50304, 768, kSms, kL2,
                                                     {.splits = 3, .tile_n = 192, .group_m = 4});
  CHECK((!forced.pingpong && forced.tile_n == 192 && forced.splits == 3 && forced.group_m == 4));
  // Forced splits stop at one a K block.
  CHECK(cuda::sm90_gemm_plan(64, 64, 100, kSms, kL2, {.splits = 9}).splits == 2);
#else
  MESSAGE("a CPU-only build: no Hopper GEMM to plan");
#endif
  // The process-wide override (FFN_GEMM_GROUP_ROWS) takes powers of two only.
  CHECK_THROWS_WITH(set_gemm_group_rows(3),
                    doctest::Contains("group rows must be 0 (by shape) or a power of two"));
  const int was = gemm_group_rows();
  set_gemm_group_rows(16);
  CHECK(gemm_group_rows() == 16);
  set_gemm_group_rows(was);
}

// fused-ffn's own Hopper GEMM (kernels/cuda/gemm/): C = op(A)·op(B) (+ bias) in every layout
// against the f64 CPU reference by the low-precision rule, every element written (the output
// is poisoned with NaN first), two runs bitwise equal.

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
              for (int tile_n : {0, 192})  // 192: the cooperative kernel's third tile width
                for (bool tma : {true, false}) {
                  if (tile_n && sched == cuda::Sm90Schedule::pingpong) continue;
                  const cuda::Sm90GemmArgs args{.trans_a = ta,
                                                .trans_b = tb,
                                                .bias = bias ? c64.to(dt).to(kGpu) : Tensor(),
                                                .schedule = sched,
                                                .tma_store = tma,
                                                .tile_n = tile_n};
                  Tensor out = Tensor::full({m, n}, NAN, dt, kGpu),
                         again = Tensor::full({m, n}, NAN, dt, kGpu);
                  cuda::sm90_gemm(a, b, out, args);
                  cuda::sm90_gemm(a, b, again, args);
                  const std::string what =
                      shape + (bias ? " +bias" : "") +
                      (sched == cuda::Sm90Schedule::pingpong ? " ping-pong" : " cooperative") +
                      (tile_n ? " BN 192" : "") + (tma ? " tma-store" : " register-store");
                  check_against_reference(
                      out, ref, naive, dt, what,
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

namespace {
// A bf16 product op(a)·op(b) + bias over exactly representable operands (drawn a, b, then the
// bias): the operands and the bias on the GPU, the f64 reference and the naive f32 one.
struct Bf16Product {
  Tensor a, b, bias, ref, naive;
};
Bf16Product bf16_product(int64_t m, int64_t n, int64_t k, bool ta, bool tb, Generator& g) {
  const Tensor a64 = exact(rand64(ta ? Shape{k, m} : Shape{m, k}, g), DType::bf16);
  const Tensor b64 = exact(rand64(tb ? Shape{n, k} : Shape{k, n}, g), DType::bf16);
  const Tensor c64 = exact(rand64({n}, g), DType::bf16);
  return {a64.to(DType::bf16).to(kGpu), b64.to(DType::bf16).to(kGpu), c64.to(DType::bf16).to(kGpu),
          matmul(a64, b64, {.trans_a = ta, .trans_b = tb, .bias = c64}),
          matmul(a64.to(DType::f32), b64.to(DType::f32),
                 {.trans_a = ta, .trans_b = tb, .bias = c64.to(DType::f32)})};
}
}  // namespace

// The 192-column tiles (session 37) on their own, small enough for racecheck: the three
// layouts, TMA and register stores, unsplit and split (StorePartial), 3 column tiles (odd:
// no clusters) and 2 (clusters sharing A where A is K-major), against the CPU reference.
FFN_GPU_TEST("sm90 GEMM in 192-column tiles: layouts, stores, splits, clusters") {
  Generator g(83);
  if (!sm90_here()) {
    MESSAGE("not an sm_90 GPU: the Hopper GEMM is not used here, cuBLASLt is");
    return;
  }
  const int64_t dims[][3] = {{136, 392, 200}, {264, 384, 520}};
  for (auto& d : dims)
    for (auto [ta, tb] :
         {std::pair{false, true}, std::pair{false, false}, std::pair{true, false}}) {
      const int64_t m = d[0], n = d[1], k = d[2];
      const Bf16Product p = bf16_product(m, n, k, ta, tb, g);
      for (int splits : {1, 3})
        for (bool tma : {true, false}) {
          const cuda::Sm90GemmArgs args{.trans_a = ta,
                                        .trans_b = tb,
                                        .bias = p.bias,
                                        .tma_store = tma,
                                        .splits = splits,
                                        .tile_n = 192};
          Tensor out = Tensor::full({m, n}, NAN, DType::bf16, kGpu);
          cuda::sm90_gemm(p.a, p.b, out, args);
          const std::string what = std::string("sm90 gemm BN 192 ") + layout_name(ta, tb) + " m" +
                                   std::to_string(m) + " n" + std::to_string(n) + " k" +
                                   std::to_string(k) + " splits " + std::to_string(splits) +
                                   (tma ? " tma-store" : " register-store");
          check_against_reference(out, p.ref, p.naive, DType::bf16, what,
                                  {.reduce_len = static_cast<double>(k), .term_bound = 1.0});
        }
    }
}

// The cooperative kernel at several tiles a CTA (64 tile rows, the last partial, × 4-8 column
// tiles on at most 132 SMs; at 192 and 256 columns in clusters sharing B) of 1, 2 and 3
// k-blocks each, so that each tile's epilogue closely follows the one before: its two
// TMA-store buffers alternate across tiles (TileCtx::sub; at BN = 192 a tile has three
// subtiles). The three tile widths, TMA and register stores, split-K, both B layouts, the last
// column tile partial (N = 1000). Against the CPU reference, and two runs bitwise equal.
FFN_GPU_TEST("sm90 GEMM cooperative: several short tiles a CTA") {
  Generator g(89);
  if (!sm90_here()) {
    MESSAGE("not an sm_90 GPU: the Hopper GEMM is not used here, cuBLASLt is");
    return;
  }
  const int64_t m = 8100, n = 1000;
  for (int64_t k : {64, 128, 136})
    for (bool tb : {true, false}) {
      const Bf16Product p = bf16_product(m, n, k, false, tb, g);
      for (int tile_n : {256, 192, 128})
        for (bool tma : {true, false})
          for (int splits : {1, 2}) {
            if (splits == 2 && (k == 64 || !tma)) continue;
            const cuda::Sm90GemmArgs args{.trans_b = tb,
                                          .bias = p.bias,
                                          .schedule = cuda::Sm90Schedule::cooperative,
                                          .tma_store = tma,
                                          .splits = splits,
                                          .tile_n = tile_n};
            Tensor out = Tensor::full({m, n}, NAN, DType::bf16, kGpu), again = out.clone();
            cuda::sm90_gemm(p.a, p.b, out, args);
            cuda::sm90_gemm(p.a, p.b, again, args);
            const std::string what = std::string("sm90 gemm cooperative ") +
                                     layout_name(false, tb) + " k" + std::to_string(k) + " BN " +
                                     std::to_string(tile_n) + " splits " + std::to_string(splits) +
                                     (tma ? " tma-store" : " register-store");
            check_against_reference(out, p.ref, p.naive, DType::bf16, what,
                                    {.reduce_len = static_cast<double>(k), .term_bound = 1.0});
            CHECK_MESSAGE(equal_and_written(out, again), what, ": two runs differ");
          }
    }
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
        // Operand rows of (ta ? m : k) and (tb ? k : n) elements: not a TMA layout unless both
        // are multiples of 8 (tested above).
        if ((ta ? m : k) % 8 != 0 || (tb ? k : n) % 8 != 0) continue;
        const Bf16Product p = bf16_product(m, n, k, ta, tb, g);
        for (cuda::Sm90Schedule sched :
             {cuda::Sm90Schedule::automatic, cuda::Sm90Schedule::pingpong}) {
          if (cs.splits == 0 && sched != cuda::Sm90Schedule::automatic) continue;
          const cuda::Sm90GemmArgs args{
              .trans_a = ta, .trans_b = tb, .bias = p.bias, .schedule = sched, .splits = cs.splits};
          Tensor out = Tensor::full({m, n}, NAN, DType::bf16, kGpu), again = out.clone();
          cuda::sm90_gemm(p.a, p.b, out, args);
          cuda::sm90_gemm(p.a, p.b, again, args);
          const std::string what = std::string("sm90 split-K ") + layout_name(ta, tb) + " m" +
                                   std::to_string(m) + " n" + std::to_string(n) + " k" +
                                   std::to_string(k) + " splits " + std::to_string(cs.splits) +
                                   (sched == cuda::Sm90Schedule::pingpong ? " ping-pong" : "");
          check_against_reference(out, p.ref, p.naive, DType::bf16, what,
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
// of column tiles) or B (the cooperative kernel's 192- and 256-column tiles, an even number of
// row tiles) compute what they compute alone, bit for bit: both schedules, both A and B
// layouts, split-K, rows past m in a partner's half of A; 1100 × 768 pairs at BN = 128 and not
// at the cooperative kernel's BN = 256 (3 tiles, 9 row tiles); 129 × 256 and 1024 × 768 share
// B at BN = 256 (2 and 8 row tiles), the latter with A MN-major as well.
FFN_GPU_TEST("sm90 GEMM: clusters sharing A or B and the tile order change no bits") {
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
  const Case cases[] = {
      {300, 512, 200, 1}, {1100, 768, 64, 1}, {129, 256, 1088, 5}, {1024, 768, 200, 1}};
  for (const Case& cs : cases)
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (cuda::Sm90Schedule sched :
             {cuda::Sm90Schedule::automatic, cuda::Sm90Schedule::pingpong,
              cuda::Sm90Schedule::cooperative}) {
          const int64_t m = cs.m, n = cs.n, k = cs.k;
          if (ta && (m != 1024 || sched == cuda::Sm90Schedule::pingpong)) continue;
          const Tensor a = (ta ? rand64({k, m}, g) : rand64({m, k}, g)).to(DType::bf16).to(kGpu);
          const Tensor b = (tb ? rand64({n, k}, g) : rand64({k, n}, g)).to(DType::bf16).to(kGpu);
          const cuda::Sm90GemmArgs args{.trans_a = ta,
                                        .trans_b = tb,
                                        .bias = rand64({n}, g).to(DType::bf16).to(kGpu),
                                        .schedule = sched,
                                        .splits = cs.splits};
          Tensor out[2];
          for (int mc = 0; mc < 2; ++mc) {
            set_gemm_multicast(mc == 1);
            out[mc] = Tensor::full({m, n}, NAN, DType::bf16, kGpu);
            cuda::sm90_gemm(a, b, out[mc], args);
          }
          const std::string what = std::string("sm90 clusters ") + layout_name(ta, tb) + " m" +
                                   std::to_string(m) + " n" + std::to_string(n) + " k" +
                                   std::to_string(k) + " splits " + std::to_string(cs.splits) +
                                   " schedule " + std::to_string(static_cast<int>(sched));
          CHECK_MESSAGE(equal_and_written(out[0], out[1]), what);
          // Note [Tile groups]: groups of 1, 2 (a remainder group at 3 and 9 tile rows) and 64.
          for (int group : {1, 2, 64}) {
            cuda::Sm90GemmArgs grouped = args;
            grouped.group_m = group;
            Tensor again = Tensor::full({m, n}, NAN, DType::bf16, kGpu);
            cuda::sm90_gemm(a, b, again, grouped);
            CHECK_MESSAGE(equal_and_written(out[1], again), what, " groups of ", group);
          }
          cuda::Sm90GemmArgs odd = args;
          odd.group_m = 3;
          CHECK_THROWS_WITH(cuda::sm90_gemm(a, b, out[1], odd),
                            doctest::Contains("group_m must be 0 (automatic) or a power of two"));
        }
}

// Note [Dependent launch]: a chain of the own GEMM's kernels launched back to back, each
// reading what the one before it wrote (and the third overwriting what the second read),
// gives the same bits with the kernels launched as programmatic dependents as without. The
// first product's 192 tiles leave 72 of 132 SMs free after one tile each, where the second's
// CTAs may start while the first's last tiles are still being written: a kernel that read
// before its grid_dependency_wait could see those rows as NaN (every output starts so) or
// stale. (No build without the wait has been run against it, so how often it would catch
// one is not measured.)
// The chain runs the cooperative, ping-pong and split-K kernels and the activation kernels
// forward and backward (with db), these in the dynamic unit order too (each launch's counter
// is reset by the launch before it).
FFN_GPU_TEST("sm90 GEMM: dependent launches give the same bits as launches in order") {
  Generator g(83);
  if (!sm90_here()) {
    MESSAGE("not an sm_90 GPU: the Hopper GEMM is not used here, cuBLASLt is");
    return;
  }
  struct Restore {
    bool pdl = gemm_dependent_launch(), order = gemm_dynamic_order();
    ~Restore() {
      set_gemm_dependent_launch(pdl);
      set_gemm_dynamic_order(order);
    }
  } restore;
  const int64_t m = 8100;
  auto weight = [&](int64_t n, int64_t k) { return rand64({n, k}, g).to(DType::bf16).to(kGpu); };
  const Tensor x = rand64({m, 512}, g).to(DType::bf16).to(kGpu);
  const Tensor w1 = weight(768, 512), w2 = weight(1024, 768), w3 = weight(768, 1024),
               w4 = weight(1024, 768), w5 = weight(512, 1024), w6 = weight(1024, 1024);
  const Tensor b4 = rand64({1024}, g).to(DType::bf16).to(kGpu);
  const DropoutSpec d{0.1f, 5, 6};
  using S = cuda::Sm90Schedule;
  auto chain = [&](bool pdl, bool dynamic) {
    set_gemm_dependent_launch(pdl);
    set_gemm_dynamic_order(dynamic);
    auto nan = [&](int64_t n) { return Tensor::full({m, n}, NAN, DType::bf16, kGpu); };
    Tensor y1 = nan(768), y2 = nan(1024), z = nan(1024), hd = nan(1024), dz = nan(1024),
           hd2 = nan(1024), z2 = nan(1024), hd3 = nan(1024), y5 = nan(512),
           db = Tensor::full({1024}, NAN, DType::bf16, kGpu);
    cuda::sm90_gemm(x, w1, y1, {.trans_b = true, .schedule = S::cooperative, .splits = 1});
    cuda::sm90_gemm(y1, w2, y2, {.trans_b = true, .schedule = S::pingpong});
    cuda::sm90_gemm(y2, w3, y1, {.trans_b = true, .splits = 1, .tile_n = 192});
    cuda::sm90_gemm_nt_act(y1, w4, b4, Activation::gelu_tanh, d, z, hd);
    cuda::sm90_gemm_nn_act_backward(y1, w3, z, b4, Activation::gelu_tanh, d, dz, hd2, S::automatic,
                                    &db);
    cuda::sm90_gemm_nt_act(dz, w6, b4, Activation::silu, {}, z2, hd3);
    cuda::sm90_gemm(hd3, w5, y5, {.trans_b = true, .splits = 3});
    return std::vector<Tensor>{y1, y2, z, hd, dz, hd2, db, z2, hd3, y5};
  };
  for (bool dynamic : {false, true}) {
    const std::vector<Tensor> in_order = chain(false, dynamic);
    CHECK(!gemm_dependent_launch());
    for (int rep = 0; rep < 3; ++rep) {
      const std::vector<Tensor> dependent = chain(true, dynamic);
      CHECK(gemm_dependent_launch());
      const char* names[] = {"y1", "y2", "z", "hd", "dz", "hd2", "db", "z2", "hd3", "y5"};
      for (size_t i = 0; i < in_order.size(); ++i)
        CHECK_MESSAGE(equal_and_written(in_order[i], dependent[i]), names[i], " dynamic ", dynamic,
                      " run ", rep);
    }
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
