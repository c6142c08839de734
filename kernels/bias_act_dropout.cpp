// kernels/bias_act_dropout.cpp — front door of kernels/bias_act_dropout.h: argument checks, then
// the CPU reference (kernels/cpu/) or the CUDA kernels (kernels/cuda/; a CPU-only build links
// kernels/cuda_stub.cpp, which throws "built without CUDA").
#include "kernels/bias_act_dropout.h"

#include "kernels/checks.h"
#include "kernels/cuda/gemm/sm90_gemm.h"
#include "kernels/gemm.h"

namespace ffn {

Activation parse_activation(const std::string& s) {
  if (const auto a = value_of(kActivationNames, s)) return *a;
  FFN_THROW("[activation] unknown activation '", s, "' (expected ", names_list(kActivationNames),
            ")");
}

void bias_act_dropout(const Tensor& z, const Tensor& b, Activation act, const DropoutSpec& d,
                      Tensor& hd) {
  const char* op = act == Activation::identity ? "bias_dropout" : "bias_act_dropout";
  detail::check_matrix(z, op, "z");
  detail::check_dropout(d, op);
  if (b.defined()) detail::check_like(b, z, {z.size(1)}, op, "b");
  detail::check_like(hd, z, z.shape(), op, "hd");
  const Tensor zc = z.contiguous(), bc = b.defined() ? b.contiguous() : b;
  if (z.is_cuda()) return cuda::bias_act_dropout(zc, bc, act, d, hd);
  cpu::bias_act_dropout(zc, bc, act, d, hd);
}

void bias_act_dropout_backward(const Tensor& dhd, const Tensor& z, const Tensor& b,
                               Activation act, const DropoutSpec& d, Tensor& dpre, Tensor* db,
                               Tensor* hd) {
  const char* op = "bias_act_dropout_backward";
  detail::check_matrix(z, op, "z");
  detail::check_dropout(d, op);
  detail::check_like(dhd, z, z.shape(), op, "dhd");
  if (b.defined()) detail::check_like(b, z, {z.size(1)}, op, "b");
  detail::check_like(dpre, z, z.shape(), op, "dpre");
  if (db) detail::check_like(*db, z, {z.size(1)}, op, "db");
  if (hd) detail::check_like(*hd, z, z.shape(), op, "hd");
  const Tensor zc = z.contiguous(), gc = dhd.contiguous(), bc = b.defined() ? b.contiguous() : b;
  if (z.is_cuda()) return cuda::bias_act_dropout_backward(gc, zc, bc, act, d, &dpre, db, hd);
  cpu::bias_act_dropout_backward(gc, zc, bc, act, d, &dpre, db, hd);
}

void bias_dropout_backward(const Tensor& dy, const DropoutSpec& d, Tensor* dz, Tensor* db) {
  const char* op = "bias_dropout_backward";
  detail::check_matrix(dy, op, "dy");
  detail::check_dropout(d, op);
  if (dz) detail::check_like(*dz, dy, dy.shape(), op, "dz");
  if (db) detail::check_like(*db, dy, {dy.size(1)}, op, "db");
  const Tensor dyc = dy.contiguous();
  if (dy.is_cuda())
    return cuda::bias_act_dropout_backward(dyc, {}, {}, Activation::identity, d, dz, db, nullptr);
  cpu::bias_act_dropout_backward(dyc, {}, {}, Activation::identity, d, dz, db, nullptr);
}

namespace {
// When the fused kernels run, measured on an H100 (bench/RESULTS-2026-11-24-s11-13.md,
// session 13, and bench/RESULTS-2026-11-24-s14-16.md, session 14, `ffn-bench --act-epilogues`,
// against GEMM + bias_act_dropout(_backward)): from K = 768 (GPT-2's fc1) the activation
// warpgroups' kernel (Note [Activation warpgroup]) wins the forward and
// the backward with db at every measured shape (session 14, call 8: gpt2 0.87× and 0.83×, ffn_d1024
// 0.79× and 0.86×, ffn_d4096 0.94× and 0.90×). Until session 14 the ping-pong ActTma (Note
// [Activation epilogues]) ran from K = 4096; with the activation warpgroups' backward on a 5-stage
// ring it is slower there too (forward 1.755 against 1.571 ms, backward 1.986 + a column-sum pass
// against 1.818 with db).
// At K = 384 (shakespeare_char's fc1, 16384 × 1536; H200, session 40, ffn-bench
// --act-epilogues) it wins too: forward 0.059 against 0.076 ms, backward with db 0.085
// against 0.109, and shakespeare_char's step 4.48 → 4.30 ms (alternated twice), without
// dropout. Smaller K, and K = 384 with the hidden dropout, were not measured: the unfused pair
// there (with dropout from K = 768, below).
constexpr int64_t kActMinK = 384, kActDropoutMinK = 768;
constexpr cuda::Sm90Schedule kActSchedule = cuda::Sm90Schedule::act_warpgroups;
// With the hidden dropout the activation warpgroups also draw the mask (one Philox block per
// thread's 8 elements). Session 15 (H100, p = 0.1, fused against GEMM + kernel) had the fused
// kernel lose at K = 768 and run from K = 1024. Measured again after the kernels' later
// changes (H100, session 38, ffn-bench --act-epilogues, two rounds, ms, fused against GEMM +
// kernel): gpt2's fc1 (K = 768, gelu_erf) forward 0.199, 0.202 against 0.217, 0.218, backward
// with db 0.262, 0.264 against 0.297, 0.303; ffn_d1024's (K = 1024) forward 0.311, 0.312
// against 0.331, 0.329, backward 0.409, 0.409 against 0.422, 0.426; ffn_d4096's (K = 4096)
// forward 1.948, 1.938 against 1.860, 1.864, backward 2.079, 2.061 against 2.040, 2.042. So
// with dropout they run from K = 768 (kActDropoutMinK). At K = 4096 the forward measured faster as
// GEMM + kernel, but the whole ffn_d4096 step with that forward did not (session 38, call 2,
// alternated twice: 10.57, 10.46 ms against 10.47, 10.41 with the fused one), so it stays
// fused. Moving the draws onto the producer's idle warps did not help
// (bench/RESULTS-2026-11-28-s35-38.md, session 38).
bool act_fused_here(const Tensor& a, const DropoutSpec& d) {
  return a.size(1) >= (d.active() ? kActDropoutMinK : kActMinK);
}
}  // namespace

bool linear_act(const Tensor& x, const Tensor& w, const Tensor& b, Activation act,
                const DropoutSpec& d, Tensor& z, Tensor& hd) {
  const char* op = "linear_act";
  detail::check_linear(d, x, w, /*nt=*/true, op, "x", "h");
  detail::check_like(z, x, {x.size(0), w.size(0)}, op, "z");
  detail::check_like(hd, x, z.shape(), op, "hd");
  if (b.defined()) detail::check_like(b, x, {w.size(0)}, op, "b");
  if (!x.is_cuda() || !gemm_epilogues() || !act_fused_here(x, d) ||
      !cuda::sm90_gemm_act_supported(x, w, false, act, z) || !detail::dense16(hd) ||
      (b.defined() && !detail::dense16(b)))
    return false;
  cuda::sm90_gemm_nt_act(x, w, b, act, d, z, hd, kActSchedule);
  return true;
}

// Note [Output dropout in the GEMM]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// An FFN's output dropout (y = dropout(hd·W2ᵀ + b2)) ran as the GEMM and then a bias_dropout
// pass that read z2 back and wrote y. sm90_gemm_nt_bias_act_dropout with the identity
// activation does both in the GEMM's epilogue (BiasActDropout, epilogue.cuh: z2 rounded and
// staged in shared memory, a Philox block per 8-column run, y stored), so z2 is never
// written. The product then runs on our cooperative kernel (never split), not on whichever of
// ours and cuBLASLt's the tuner picks for the bare GEMM. Measured (H200, session 43,
// `ffn-bench --out-dropout`, p = 0.1, two runs, ms, fused cooperative / ping-pong against
// gemm() + bias_dropout): K = 1024 (16384 × 1024) 0.072 / 0.080 against 0.090; gpt2's fc2
// (K = 3072) 0.130 / 0.147 against 0.143; ffn_d1024's fc2 (K = 4096) 0.218 / 0.246 against
// 0.235; ffn_d4096's fc2 (K = 16384) 1.704 / 1.841 against 1.673. So the cooperative kernel
// (the consumers' epilogues run together, the mask is cheap beside a pass over y) from K =
// 1024 to 4096, where it was measured faster; elsewhere the pair. ffn_d1024's forward and
// backward (`ffn-bench --workload`, alternated three times): 1.551, 1.551, 1.558 → 1.536,
// 1.545, 1.543 ms, 0.012 ms of the 0.017 the kernel rows predict. Same bits as sm90_gemm
// followed by bias_dropout (test_sm90_act.cpp).
constexpr int64_t kOutDropoutMinK = 1024, kOutDropoutMaxK = 4096;

bool linear_dropout(const Tensor& x, const Tensor& w, const Tensor& b, const DropoutSpec& d,
                    Tensor& y) {
  const char* op = "linear_dropout";
  detail::check_linear(d, x, w, /*nt=*/true, op, "x", "n");
  detail::check_like(y, x, {x.size(0), w.size(0)}, op, "y");
  if (b.defined()) detail::check_like(b, x, {w.size(0)}, op, "b");
  const int64_t k = x.size(1);
  if (!x.is_cuda() || !gemm_epilogues() || !d.active() || k < kOutDropoutMinK ||
      k > kOutDropoutMaxK || !detail::dense16(y) || (b.defined() && !detail::dense16(b)) ||
      !cuda::sm90_gemm_supported(x, w, y, false, true))
    return false;
  cuda::sm90_gemm_nt_bias_act_dropout(x, w, b, Activation::identity, d, y, nullptr,
                                      cuda::Sm90Schedule::cooperative);
  return true;
}

bool linear_act_backward(const Tensor& dy, const Tensor& w, const Tensor& z, const Tensor& b,
                         Activation act, const DropoutSpec& d, Tensor& dz, Tensor& hd, Tensor* db) {
  const char* op = "linear_act_backward";
  detail::check_linear(d, dy, w, /*nt=*/false, op, "dy", "h");
  detail::check_like(z, dy, {dy.size(0), w.size(1)}, op, "z");
  detail::check_like(dz, dy, z.shape(), op, "dz");
  detail::check_like(hd, dy, z.shape(), op, "hd");
  if (b.defined()) detail::check_like(b, dy, {w.size(1)}, op, "b");
  if (db) detail::check_like(*db, dy, {w.size(1)}, op, "db");
  if (!dy.is_cuda() || !gemm_epilogues() || !act_fused_here(dy, d) ||
      !cuda::sm90_gemm_act_supported(dy, w, true, act, dz) || !detail::dense16(z) ||
      !detail::dense16(hd) || (b.defined() && !detail::dense16(b)))
    return false;
  cuda::sm90_gemm_nn_act_backward(dy, w, z, b, act, d, dz, hd, kActSchedule, db);  // db in kernel
  return true;
}

}  // namespace ffn
