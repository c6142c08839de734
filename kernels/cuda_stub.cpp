// kernels/cuda_stub.cpp — the cuda:: backend of a build without CUDA (MLX's no-GPU pattern).
//
// The front doors (kernels/<op>.cpp) dispatch on the tensor's device with no #if: a CPU-only
// build links these definitions instead of kernels/cuda/*.cu. A CUDA tensor cannot exist in
// such a build, so reaching one of these is a bug or a hand-made device tag; each says which
// op it was. The capability queries answer "no".
#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/bias_act_dropout.h"
#include "kernels/bias_glu_dropout.h"
#include "kernels/bucket.h"
#include "kernels/causal_softmax.h"
#include "kernels/cross_entropy.h"
#include "kernels/cuda/attention_sm90.h"
#include "kernels/cuda/gemm/sm90_gemm.h"
#include "kernels/dropout_add.h"
#include "kernels/embedding.h"
#include "kernels/gemm.h"
#include "kernels/layer_norm.h"
#include "kernels/mse_loss.h"
#include "kernels/rope.h"
#include "kernels/scale.h"
#include "kernels/sgd.h"

namespace ffn::cuda {

namespace {
[[noreturn]] void no_cuda(const char* op) {
  FFN_THROW("[", op, "] built without CUDA: fused-ffn was configured without nvcc, so CUDA "
            "tensors and kernels are not available (rebuild with the CUDA Toolkit)");
}
}  // namespace

void adamw_step(const std::vector<AdamWSlot>&, const AdamWHyper&, int64_t, double,
                const double*) {
  no_cuda("adamw");
}
Tensor global_grad_sumsq(const std::vector<Tensor>&) {
  no_cuda("global_grad_sumsq");
}
void adamw_decide(const Tensor&, const Tensor&, const AdamWDecide&, Tensor&) {
  no_cuda("adamw_decide");
}

bool fused_attention_supported(DType, int64_t, int64_t) {
  return false;
}
bool fused_attention_preferred(DType, int64_t, int64_t) {
  return false;
}
void fused_attention(const Tensor&, int64_t, double, const DropoutSpec&, Tensor&, Tensor&,
                     AttentionKernel) {
  no_cuda("fused_attention");
}
void fused_attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t,
                              double, const DropoutSpec&, Tensor&, double, AttentionKernel, Tensor*,
                              const Tensor&) {
  no_cuda("fused_attention_backward");
}

void bias_act_dropout(const Tensor&, const Tensor&, Activation, const DropoutSpec&, Tensor&) {
  no_cuda("bias_act_dropout");
}
void bias_act_dropout_backward(const Tensor&, const Tensor&, const Tensor&, Activation,
                               const DropoutSpec&, Tensor*, Tensor*, Tensor*) {
  no_cuda("bias_act_dropout_backward");
}

void bias_glu_dropout(const Tensor&, const Tensor&, Activation, const DropoutSpec&, Tensor&) {
  no_cuda("bias_glu_dropout");
}
void bias_glu_dropout_backward(const Tensor&, const Tensor&, const Tensor&, Activation,
                               const DropoutSpec&, Tensor&, Tensor*, Tensor*) {
  no_cuda("bias_glu_dropout_backward");
}

void causal_softmax(const Tensor&, double, const DropoutSpec&, Tensor&, Tensor*) {
  no_cuda("causal_softmax");
}
void causal_softmax_backward(const Tensor&, const Tensor&, double, const DropoutSpec&, Tensor&) {
  no_cuda("causal_softmax_backward");
}

void cross_entropy(const Tensor&, const Tensor&, Tensor&, Tensor&, int64_t) {
  no_cuda("cross_entropy");
}
void cross_entropy_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, Tensor&,
                            int64_t) {
  no_cuda("cross_entropy_backward");
}
void cross_entropy_rows(Tensor&, const Tensor&, Tensor&, int64_t, std::optional<double>) {
  no_cuda("cross_entropy_rows");
}
void mean_rows(const Tensor&, Tensor&) {
  no_cuda("mean_rows");
}
void scale_by(const Tensor&, const Tensor&, Tensor&) {
  no_cuda("scale_by");
}

void scale_rows(const Tensor&, const Tensor&, Tensor&) {
  no_cuda("scale_rows");
}
void scale_columns(const Tensor&, const Tensor&, Tensor&) {
  no_cuda("scale_columns");
}
void dropout_add(const Tensor&, const Tensor&, const DropoutSpec&, Tensor&) {
  no_cuda("dropout_add");
}
void dropout_add_backward(const Tensor&, const DropoutSpec&, Tensor&) {
  no_cuda("dropout_add_backward");
}

void embedding_sum(const Tensor&, const Tensor&, const Tensor&, int64_t, Tensor&) {
  no_cuda("embedding");
}
void embedding_backward(const Tensor&, const Tensor&, Tensor&, bool) {
  no_cuda("embedding_backward");
}
void position_grad(const Tensor&, int64_t, Tensor&) { no_cuda("position_grad"); }
int64_t first_bad_index(const Tensor&, int64_t) {
  no_cuda("check_indices");
}

void gemm(const Tensor&, const Tensor&, Tensor&, const GemmArgs&) {
  no_cuda("gemm");
}
void gemm_batched(const Tensor&, const Tensor&, Tensor&, const GemmArgs&) {
  no_cuda("bmm");
}
// Note [GEMM choices]: nothing is tuned without CUDA.
std::string gemm_choices() {
  return {};
}
RestoredGemmChoices restore_gemm_choices(const std::string&, const std::string&, bool) {
  no_cuda("restore_gemm_choices");
}
GemmChoiceStats gemm_choice_stats() {
  return {};
}
void reset_gemm_choices() {}

bool sm90_gemm_supported(const Tensor&, const Tensor&, const Tensor&, bool, bool) {
  return false;
}
void sm90_gemm(const Tensor&, const Tensor&, Tensor&, const Sm90GemmArgs&) {
  no_cuda("sm90_gemm");
}
Sm90Plan sm90_gemm_plan(int64_t, int64_t, int64_t, int, int64_t, const Sm90GemmArgs&) {
  no_cuda("sm90_gemm_plan");
}
void sm90_gemm_nt_bias_act_dropout(const Tensor&, const Tensor&, const Tensor&, Activation,
                                   const DropoutSpec&, Tensor&, Tensor*, Sm90Schedule) {
  no_cuda("sm90_gemm");
}
bool sm90_gemm_act_supported(const Tensor&, const Tensor&, bool, Activation, const Tensor&) {
  return false;
}
void sm90_gemm_nt_act(const Tensor&, const Tensor&, const Tensor&, Activation, const DropoutSpec&,
                      Tensor&, Tensor&, Sm90Schedule) {
  no_cuda("sm90_gemm");
}
void sm90_gemm_nn_act_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                               Activation, const DropoutSpec&, Tensor&, Tensor&, Sm90Schedule,
                               Tensor*) {
  no_cuda("sm90_gemm");
}

bool sm90_gemm_glu_supported(const Tensor&, const Tensor&, Activation, const Tensor&) {
  return false;
}
void sm90_gemm_nt_glu(const Tensor&, const Tensor&, const Tensor&, Activation, const DropoutSpec&,
                      Tensor&, Tensor&, const Tensor&) {
  no_cuda("sm90_gemm");
}
bool sm90_gemm_glu_backward_supported(const Tensor&, const Tensor&, Activation, const Tensor&) {
  return false;
}
void sm90_gemm_nn_glu_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                               Activation, const DropoutSpec&, Tensor&, Tensor&, Tensor*,
                               const Tensor&) {
  no_cuda("sm90_gemm");
}
bool sm90_gemm_add_norm_supported(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                  const Tensor&) {
  return false;
}
void sm90_gemm_nt_add_norm(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                           const DropoutSpec&, const Tensor&, const Tensor&, double, Tensor&,
                           Tensor&, Tensor&, Tensor&, int) {
  no_cuda("sm90_gemm");
}

bool sm90_attention_supported(const Tensor&, int64_t) {
  return false;
}
void sm90_attention_forward(const Tensor&, int64_t, float, const DropoutSpec&, Tensor&, Tensor&) {
  no_cuda("fused_attention");
}
void sm90_attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t,
                             float, const DropoutSpec&, Tensor&, double, Tensor*, const Tensor&) {
  no_cuda("fused_attention_backward");
}
void sm90_attention_force_unit_group(int64_t) {}  // nothing runs them without CUDA
void sm90_attention_force_grid(int64_t) {}
void sm90_attention_force_forward_rows(int64_t) {}
int64_t sm90_attention_forward_rows(int64_t) { return 0; }
void sm90_attention_force_forward_pingpong(int) {}
void sm90_attention_force_whole_diagonal(bool) {}
bool sm90_attention_forward_pingpong() {
  return false;
}

void layer_norm(const Tensor&, const Tensor&, const Tensor&, double, Tensor&, Tensor&, Tensor&,
                const Tensor&, const DropoutSpec&, Tensor*) {
  no_cuda("layer_norm");
}
void layer_norm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         Tensor*, Tensor*, Tensor*, bool, Tensor*, const DropoutSpec&, Tensor*,
                         bool) {
  no_cuda("layer_norm_backward");
}

void rope(const Tensor&, int64_t, int64_t, double, bool, Tensor&) {
  no_cuda("rope");
}
void mse_loss(const Tensor&, const Tensor&, Tensor&) {
  no_cuda("mse_loss");
}
void mse_loss_backward(const Tensor&, const Tensor&, const Tensor&, Tensor&) {
  no_cuda("mse_loss_backward");
}

void sgd_step(Tensor&, const Tensor&, Tensor*, const SgdHyper&, bool) {
  no_cuda("sgd");
}

void bucket_pack(const std::vector<Tensor>&, const std::vector<int64_t>&, Tensor&, void*) {
  no_cuda("bucket_pack");
}
void bucket_mean(const Tensor&, int64_t, const std::vector<int64_t>&, std::vector<Tensor>&, bool) {
  no_cuda("bucket_mean");
}

}  // namespace ffn::cuda
