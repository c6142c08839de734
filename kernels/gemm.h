// kernels/gemm.h — matrix products, the FLOP-heavy half of every layer.
//
//   c = alpha · op(a) · op(b) + beta · c  (+ bias broadcast over rows, if given)
// op(x) = xᵀ when the matching trans flag is set. All tensors 2-D and
// row-major; a and b may be any (contiguous) views, c must be contiguous. c is
// overwritten when beta = 0 and accumulated into (+=) otherwise.
// CPU: Eigen, f64/f32. CUDA: cuBLASLt, f32/bf16/f16 with fp32 accumulation.
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

// Note [GEMM choices]
// ~~~~~~~~~~~~~~~~~~~
// With autotuning on, the first call of each large product (m·n·k ≥ 2^30) times cuBLASLt's
// top candidates and keeps the fastest for the process. Another process may time them
// differently and so compute in other last bits, which would break bit-exact resume.
// gemm_choices() writes this process's timed (and restored) choices as text: a header with
// the cuBLASLt version and the GPU's compute capability, then one line per product (batch,
// m, n, k, transposes, cuBLASLt epilogue, dtypes, pointer alignment and the algorithm's 64
// bytes, which cuBLASLt documents as serializable for the same library version).
// restore_gemm_choices() makes this process use them for those products instead of timing
// (each checked with cublasLtMatmulAlgoCheck; one it rejects is timed and counted); with
// `replace`, plans already made take them too. A file from another cuBLASLt version or GPU
// restores nothing and says why. The trainer stores the text in every checkpoint
// (train/checkpoint.h) and restores it on resume, and under data parallelism every rank
// takes rank 0's choices after the first step, so autotuning is on by default for training
// and resume stays bit-exact.
struct RestoredGemmChoices {
  int64_t count = 0;    // products restored
  std::string skipped;  // why none were, when the header did not match
};
struct GemmChoiceStats {
  int64_t timed = 0;     // plans chosen by timing
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
// the next norm's sum (Note [Branch bias gradient], layers/functional.cpp). On by
// default (FFN_GEMM_EPILOGUES=0 or runtime.gemm_epilogues = false turn it off); the CPU path
// is the same either way.
void set_gemm_epilogues(bool on);
bool gemm_epilogues();

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
