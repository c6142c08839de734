// kernels/gemm.h — matrix products, the FLOP-heavy half of every layer.
//
//   c = alpha · op(a) · op(b) + beta · c  (+ bias broadcast over rows, if given)
// op(x) = xᵀ when the matching trans flag is set. All tensors 2-D and
// row-major; a and b may be any (contiguous) views, c must be contiguous. c is
// overwritten when beta = 0 and accumulated into (+=) otherwise.
// CPU: Eigen, f64/f32. CUDA: cuBLASLt, f32/bf16/f16 with fp32 accumulation, or for bf16/f16
// products where it was timed faster our own Hopper GEMM (Note [Own GEMM in gemm()]).
// a and b share one dtype; c has it too, except that on the GPU c may be f32 for bf16/f16
// a and b (no bias, no epilogue): the product then lands, and accumulates with beta = 1, in
// fp32 storage (the fused classifier sums its weight gradient over chunks this way).
//
// Epilogues (cuBLASLt's, with the same math in the CPU reference), with
// p = alpha · op(a) · op(b):
//   none           c = p + beta·c (+ bias)                             (BIAS)
//   gelu_aux_bias  aux = p + bias;  c = gelu_tanh(aux)                  (GELU_AUX_BIAS)
//   dgelu_bgrad    c = p ⊙ gelu_tanh'(aux);  bias_grad = Σ_rows c       (DGELU_BGRAD)
//   bgrad_a        c = p + beta·c;  bias_grad[i] = Σ_k op(a)[i, k]      (BGRADB: our a is
//                                                                        cuBLASLt's B)
// aux is [m, n] (written or read); bias_grad ([n] or [m]) is overwritten (=). The GELU
// epilogues need beta = 0 and, on the GPU, n divisible by 8 and a 16-bit dtype:
// cuBLASLt evaluates their tanh approximately (absolute error up to 4e-6 in f32,
// measured on an H100), below bf16/f16 rounding but not f32's. bench/RESULTS-2026-11-22.md has
// the measurements deciding where the layers use which epilogue.
#pragma once

#include <string>

#include "core/tensor.h"

namespace ffn {

enum class GemmEpilogue : uint8_t { none, gelu_aux_bias, dgelu_bgrad, bgrad_a };

struct GemmArgs {
  bool trans_a = false;
  bool trans_b = false;
  double alpha = 1.0;
  double beta = 0.0;
  Tensor bias;  // optional, shape [c.cols]
  GemmEpilogue epilogue = GemmEpilogue::none;
  Tensor aux;        // gelu_aux_bias (written), dgelu_bgrad (read): [m, n]
  Tensor bias_grad;  // dgelu_bgrad: [n]; bgrad_a: [m] (written)
};

void gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmArgs& args = {});

// GPU GEMM autotuning (kernels/cuda/gemm.cu): on by default unless FFN_GEMM_TUNE=0. It picks
// algorithms by timing, so two processes may pick differently (results then differ in the
// last bits) unless the second restores the first's choices (Note [GEMM choices]).
void set_gemm_autotune(bool on);
bool gemm_autotune();

// Which products gemm() may run on fused-ffn's own Hopper GEMM (kernels/cuda/gemm/, Note
// [Own GEMM in gemm()]) instead of cuBLASLt: never; tuned (the default), where the autotuner
// timed it faster than cuBLASLt's candidates; always, every product it can run (for A/B
// runs and tests). FFN_OWN_GEMM = never | tuned | always sets it for a whole program.
enum class OwnGemm : uint8_t { never, tuned, always };
void set_own_gemm(OwnGemm mode);
OwnGemm own_gemm();  // throws, naming the variable, on an FFN_OWN_GEMM it does not know

// Note [Own GEMM in gemm()]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// The own GEMM runs a gemm() call when the product is one it takes (sm90_gemm_supported: an
// sm_90 GPU with sm_90a code, bf16/f16 a, b and c, 16-byte aligned operands and rows), it is
// not batched, has no epilogue but an optional bias, and the call has alpha = 1 and beta =
// 0; any other call of the same shape runs cuBLASLt's algorithm for it. With autotuning the
// first call of a large product times its cooperative and ping-pong schedules (unsplit) and
// its automatic one (which may split K, by the shape and the SM count: Note [Split-K])
// beside cuBLASLt's candidates, all timed alike (Note [Tuning with a cold L2] in
// kernels/cuda/gemm.cu), and the fastest runs from then on. The choice
// is part of Note [GEMM choices]: a resumed run and every rank under data parallelism run the
// same kernel with the same schedule. FFN_GEMM_TUNE_LOG=1 prints every candidate's time.

// Note [GEMM choices]
// ~~~~~~~~~~~~~~~~~~~
// With autotuning on, the first call of each large product (m·n·k ≥ 2^30) times cuBLASLt's
// top candidates (and the own GEMM's schedules, Note [Own GEMM in gemm()]) and keeps the
// fastest for the process. Another process may time them differently and so compute in
// other last bits, which would break bit-exact resume. gemm_choices() writes this process's
// timed (and restored) choices as text: a header with the cuBLASLt version, the GPU's
// compute capability and SM count, then one line per product (batch, m, n, k, transposes,
// cuBLASLt epilogue, dtypes, pointer alignment and the algorithm's 64 bytes, which cuBLASLt
// documents as serializable for the same library version; then "sm90 cooperative", "sm90
// pingpong" or "sm90 automatic" where the own GEMM was chosen). Version 1 files (before the
// own GEMM could be chosen) have neither that field nor the SM count and still read.
// restore_gemm_choices() makes this process use them for those products instead of timing
// (each checked with cublasLtMatmulAlgoCheck; one it rejects is timed and counted); with
// `replace`, plans already made take them too. A file from another cuBLASLt version or GPU
// restores nothing and says why. The trainer stores the text in every checkpoint
// (train/checkpoint.h) and restores it on resume, and under data parallelism every rank
// takes rank 0's choices after the first step, so autotuning is on by default for training
// and resume stays bit-exact. Under FFN_OWN_GEMM = never a restored own-GEMM choice runs
// cuBLASLt's algorithm of the same line instead.
struct RestoredGemmChoices {
  int64_t count = 0;    // products restored
  std::string skipped;  // why none were, when the header did not match
};
struct GemmChoiceStats {
  int64_t timed = 0;     // plans chosen by timing
  int64_t own = 0;       // plans that run the own GEMM (Note [Own GEMM in gemm()])
  int64_t restored = 0;  // plans that took a restored choice
  int64_t rejected = 0;  // restored choices cuBLASLt refused (those plans were timed instead)
};
std::string gemm_choices();  // "" when nothing was timed or restored (always without CUDA)
// Throws, naming `source` and the line, on text that is not a choices file.
RestoredGemmChoices restore_gemm_choices(const std::string& text, const std::string& source,
                                         bool replace = false);
GemmChoiceStats gemm_choice_stats();
// Forgets every plan, restored choice and count: the next call plans as a new process would.
void reset_gemm_choices();

// Whether the layers fold their elementwise work into GEMM epilogues on the GPU (Note
// [Activation warpgroup]: the FFN's activation, and db1, in the own Hopper GEMM). The
// Linear layers' bias gradients are a column-sum pass beside the weight gradient either way
// (measured faster than cuBLASLt's BGRADB epilogue, which gemm's bgrad_a still offers), or
// the next norm's sum (Note [Branch bias gradient], layers/branch_bias_grad.h). On by
// default (FFN_GEMM_EPILOGUES=0 or runtime.gemm_epilogues = false turn it off); the CPU path
// is the same either way.
void set_gemm_epilogues(bool on);
bool gemm_epilogues();

// The order in which the own Hopper GEMM's activation kernels take their tiles (Note [Dynamic
// unit order] in kernels/cuda/gemm/tile_scheduler.cuh): dynamic (from a counter in global
// memory, so CTAs that start late behind NCCL's kernels take fewer tiles) or static (the
// persistent stride, 2-10% faster on a GPU of its own). Static by default; the trainer turns
// dynamic on when it runs on more than one rank. FFN_GEMM_DYNAMIC_ORDER=0|1, when set, wins
// over both (for A/B runs). Bit-identical results either way.
void set_gemm_dynamic_order(bool on);
bool gemm_dynamic_order();

// Whether the own Hopper GEMM runs as clusters of two CTAs that share an operand's tiles by
// TMA multicast (Note [Operand multicast] in kernels/cuda/gemm/mainloop.cuh): the cooperative
// kernel's 192- and 256-column tiles share B where the row tiles pair up, the other plain
// kernels share A wherever A is K-major and the column tiles pair up, the activation kernels
// share A in the static order where act_multicast (kernel.cuh) says. On by default;
// FFN_GEMM_MULTICAST=0 turns it off (A/B runs). Bit-identical results either way.
void set_gemm_multicast(bool on);
bool gemm_multicast();
// Whether the own Hopper GEMM's kernels are launched as programmatic dependents of the kernel
// before them on the stream, so that their launch and set-up overlap its last tiles (Note
// [Dependent launch] in kernels/cuda/gemm/kernel.cuh; not under stream capture). On by
// default; FFN_GEMM_PDL=0 turns it off (A/B runs). Bit-identical results either way.
void set_gemm_dependent_launch(bool on);
bool gemm_dependent_launch();
// Whether a pre-norm block's attention projection ends in the residual add and the next norm
// (linear_add_layer_norm in kernels/layer_norm.h, Note [Residual add and norm in the
// epilogue]) where gemm_epilogues() is on and the kernel runs. Off by default:
// FFN_NORM_EPILOGUE=1 or set_norm_epilogue(true) turns it on. Measured slower than the GEMM
// followed by the norm's pass (H200, session 41: gpt2_small 29.33 -> 30.40 ms a step, the
// char models 5%), so it is there to be measured and worked on, not used.
void set_norm_epilogue(bool on);
bool norm_epilogue();
// Whether a Llama block's RMSNorms are folded into the GEMMs that consume them where the
// residual stream is 16-bit (Note [RMSNorm folded into the QKV GEMM] in layers/attention.cpp,
// Note [RMSNorm folded into the FFN] in layers/ffn_nodes.cpp): the add before each writes
// only the sum and the row statistics, the QKV GEMM or the MLP's fc1 scales its rows, and the
// normalized activation is never stored. Off by default: FFN_RMS_FOLD=1 or set_rms_fold(true)
// turns it on. Both folds measured slower than the norm as its own output (H200, sessions
// 50-51: llama_char's step with a bf16 stream 1.6-2.1% with both; an attention branch
// 0.8-2.9%, an MLP branch 2.1-3.9%; the two weight-sized passes each adds cost more than the
// normalized activation's write it saves), so they are there for the memory (2 bytes an
// element of the stream per norm) and to be worked on, not used by default.
void set_rms_fold(bool on);
bool rms_fold();

// How many tile rows the own Hopper GEMM's kernels walk as a group (Note [Tile groups] in
// kernels/cuda/gemm/tile_scheduler.cuh): 0 (the default) lets each product's shape decide, a
// power of two g up to 4096 forces groups of g rows on every kernel where
// Sm90GemmArgs::group_m does not. FFN_GEMM_GROUP_ROWS=g sets it from the environment (A/B
// runs). Bit-identical results either way.
void set_gemm_group_rows(int rows);
int gemm_group_rows();

// Allocating convenience: returns op(a)·op(b) (+ bias).
Tensor matmul(const Tensor& a, const Tensor& b, const GemmArgs& args = {});

// Batched products: a, b, c are 3-D [batch, ., .] and c[i] = alpha·op(a[i])·op(b[i]) +
// beta·c[i] for every i (one strided-batched cuBLASLt call on the GPU). No bias or
// epilogue. Attention uses it for Q·Kᵀ and P·V over batch × heads.
void gemm_batched(const Tensor& a, const Tensor& b, Tensor& c, const GemmArgs& args = {});
Tensor bmm(const Tensor& a, const Tensor& b, const GemmArgs& args = {});

namespace cpu {
void gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmArgs& args);
}
namespace cuda {
void gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmArgs& args);
void gemm_batched(const Tensor& a, const Tensor& b, Tensor& c, const GemmArgs& args);
std::string gemm_choices();
RestoredGemmChoices restore_gemm_choices(const std::string& text, const std::string& source,
                                         bool replace);
GemmChoiceStats gemm_choice_stats();
void reset_gemm_choices();
}

}  // namespace ffn
