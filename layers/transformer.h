// layers/transformer.h — the pieces of a GPT: Embedding, LayerNorm, RMSNorm,
// CausalSelfAttention, TransformerBlock (pre-LN, FeedForward or GatedFeedForward) and GPT, the
// whole model (arch gpt, or llama with the blocks of layers/llama.h), its LM head tied to the
// token embedding or not. Parameter names follow nanoGPT's for gpt (wte, wpe, h.N.ln_1,
// h.N.attn.c_attn, …) and HuggingFace Llama's for llama, so checkpoints read naturally next
// to PyTorch ones.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "layers/layers.h"

namespace ffn {

class Embedding : public Module {
 public:
  // N(0, init_std) rows for ids 0..num-1, drawn as for a [num, dim] table, then zero rows up
  // to `rows` (padding, Note [Padded vocabulary]; rows <= num: none).
  Embedding(int64_t num, int64_t dim, double init_std, const ParamInit& place, Generator& init,
            int64_t rows = 0);
  // ids: i32 of any shape with values in [0, num) → [..., dim]. check_ids: see
  // kernels/embedding.h.
  Var forward(const Tensor& ids, bool check_ids = true);
  // table[ids] + pos[positions] as dtype (fn::embedding_sum; ids [B, T]).
  Var forward_sum(const Tensor& ids, const Var& pos, DType dtype, bool check_ids = true);
  const Var& weight() const { return w_; }

 private:
  // Checks ids against the vocabulary here where padding rows follow it; whether the kernel
  // still has to.
  bool kernel_checks_ids(const Tensor& ids, bool check_ids) const;

  int64_t num_;
  Var w_;
};

// A norm that can take the residual add before it into its own pass (Note [Residual add and
// norm]): forward_after_add gives {a, norm(a)} for a = res + dropout(h) (fn::add_layer_norm);
// forward_after_linear_add the same for h = proj(xin), whose GEMM then ends in the add and
// the norm where it can (fn::linear_add_layer_norm, Note [Residual add and norm in the
// epilogue]).
class ResidualNorm : public Layer {
 public:
  virtual std::pair<Var, Var> forward_after_add(const Var& res, const Var& h,
                                                const DropoutSpec& d) = 0;
  virtual std::pair<Var, Var> forward_after_linear_add(const Var& res, const Var& xin, Linear& proj,
                                                       const DropoutSpec& d) = 0;
};

class LayerNorm : public ResidualNorm {
 public:
  LayerNorm(int64_t dim, bool bias, const ParamInit& place, double eps = 1e-5);
  std::pair<Var, Var> forward_after_add(const Var& res, const Var& h,
                                        const DropoutSpec& d) override;
  std::pair<Var, Var> forward_after_linear_add(const Var& res, const Var& xin, Linear& proj,
                                               const DropoutSpec& d) override;

 protected:
  void check_input(const Tensor& x) const override;
  Var forward_impl(const Var& x) override;

 private:
  int64_t dim_;
  double eps_;
  Var w_, b_;
};

// x·w/√(mean(x²) + eps) over the last dimension (fn::rms_norm), w starting at 1.
// A norm whose consumer folds it into its GEMM (set_folded(true); Note [RMSNorm folded into the
// QKV GEMM] in layers/attention.cpp) returns, where folds(x) says the fold runs, its input's
// row statistics rstd (f32 [B, T], no gradient) in place of the normalized output, from
// forward and the forward_after_* calls; the consumer computes from x, weight() and those.
class RMSNorm : public ResidualNorm {
 public:
  RMSNorm(int64_t dim, const ParamInit& place, double eps = 1e-6);
  std::pair<Var, Var> forward_after_add(const Var& res, const Var& h,
                                        const DropoutSpec& d) override;
  std::pair<Var, Var> forward_after_linear_add(const Var& res, const Var& xin, Linear& proj,
                                               const DropoutSpec& d) override;
  void set_folded(bool on) { folded_ = on; }
  // Whether the norm of x is folded: set_folded, rms_fold() and gemm_epilogues() on
  // (kernels/gemm.h), x on the GPU in the weight's 16-bit dtype.
  bool folds(const Tensor& x) const;
  const Var& weight() const { return w_; }
  double eps() const { return eps_; }

 protected:
  void check_input(const Tensor& x) const override;
  Var forward_impl(const Var& x) override;

 private:
  int64_t dim_;
  double eps_;
  Var w_;
  bool folded_ = false;
};

struct AttentionOptions {
  int64_t d_model = 0;
  int64_t heads = 0;
  float attn_dropout = 0.0f;   // on the attention probabilities
  float resid_dropout = 0.0f;  // on the output projection
  bool bias = true;
  double init_std = 0.02;
  double proj_init_std = 0.02;  // c_proj (GPT-2 scales it by 1/√(2·layers))
  ParamInit place;
  bool fused = true;  // flash-style kernels where they apply (fn::causal_attention)
};

// x [B, T, C] → c_proj(attention(c_attn(x))) with causal masking.
class CausalSelfAttention : public Layer {
 public:
  CausalSelfAttention(const AttentionOptions& opt, std::shared_ptr<Generator> rng,
                      Generator& init);
  // The branch up to c_proj's input, and c_proj: forward(x) is c_proj(forward_heads(x)) (+ the
  // residual dropout, which must be 0 for forward_heads: the block that runs c_proj itself,
  // inside the next norm's GEMM, applies its own).
  Var forward_heads(const Var& x);
  Linear& out_proj() { return c_proj_; }

 protected:
  void check_input(const Tensor& x) const override;
  Var forward_impl(const Var& x) override;

 private:
  Var heads(const Var& x);  // the attention's output, before c_proj

  AttentionOptions opt_;
  std::shared_ptr<Generator> rng_;
  Linear c_attn_, c_proj_;
};

// Note [Padded vocabulary]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// The token embedding and the LM head (tied or not) have padded_vocab() = vocab_size rounded
// up to a multiple of vocab_pad_to rows (llm.c's Vp), so the LM-head GEMMs and the
// cross-entropy run on aligned widths: 50257 → 50304 for GPT-2, whose step then takes 37%
// less time on an H100 (67.3 → 42.2 ms, bench/RESULTS-2026-11-23.md session 8). vocab_size stays the
// model's vocabulary:
//   - the padding rows start at zero and stay zero: no id looks them up, and their logits
//     are left out of the softmax (the loss's `classes`: fn::linear_cross_entropy, or
//     fn::cross_entropy without the fused classifier), so their gradient is 0
//     and AdamW (weight decay included) leaves them at 0;
//   - GPT::forward returns [B, T, vocab_size] logits, so no padded id can be sampled;
//   - a checkpoint or weight file holds [vocab_size, d] (GPT::stored_view, used by the
//     trainer, ffn-sample and --init-from), so files do not depend on the padding and a
//     run resumes with any vocab_pad_to.
// The first vocab_size rows are drawn exactly as for an unpadded table: padding changes
// no initial weight and no loss beyond GEMM rounding.

// model.arch: "gpt" (LayerNorm, learned positions, wte/h.N/ln_f names: nanoGPT's) or
// "llama" (RMSNorm, rotary embeddings, gated MLP, no biases, HF Llama's names; layers/llama.h).
enum class Arch : uint8_t { gpt, llama };
inline constexpr NameOf<Arch> kArchNames[] = {{Arch::gpt, "gpt"}, {Arch::llama, "llama"}};

struct GptConfig {
  Arch arch = Arch::gpt;
  int64_t vocab_size = 0;
  int64_t vocab_pad_to = 1;  // Note [Padded vocabulary]; 1: no padding
  int64_t padded_vocab() const {
    return vocab_pad_to > 1 ? (vocab_size + vocab_pad_to - 1) / vocab_pad_to * vocab_pad_to
                            : vocab_size;
  }
  int64_t context = 0;
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t d_model = 0;
  FfnKind ffn = FfnKind::gelu;
  double ffn_mult = 4.0;  // hidden = round(ffn_mult · d_model)
  float dropout = 0.0f;   // embedding, attention, residual dropout (nanoGPT's)
  bool bias = true;
  double init_std = 0.02;
  // llama: key/value heads (0: heads; fewer is grouped-query attention), the rotary base,
  // RMSNorm's eps.
  int64_t kv_heads = 0;
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  bool tie_embeddings = true;  // false: a separate lm_head [vocab, d]
  // 16-bit parameters: keep the residual stream in fp32 (Note [Mixed-precision residual
  // stream]); false keeps it in the parameters' dtype (fewer bytes moved, ~6% faster on
  // shakespeare_char, bench/RESULTS-2026-11-22.md).
  bool fp32_residual = true;
  // Attention as the fused flash-style kernels on the GPU where they apply (bf16/f16, head
  // size 32/64/128); false always uses batched GEMMs + causal softmax (fn::causal_attention).
  bool fused_attention = true;
  // The loss through fn::linear_cross_entropy (Note [Fused classifier]), its logits made
  // classifier_chunk rows at a time (0: chunks of at most kClassifierChunkBytes of logits);
  // false: the LM-head GEMM and fn::cross_entropy on the whole [B·T, V] logits.
  bool fused_classifier = true;
  int64_t classifier_chunk = 0;
  ParamInit place;
};

// x + attn(ln_1(x)), then x + mlp(ln_2(x)).
// A pre-norm block, x + dropout(branch) twice, that can leave its last residual add open so
// the model fuses it with the next norm (Note [Residual add and norm]): forward_open takes the
// stream x and first_norm()'s output for it and returns {a, m, d}, the block's output being
// a + dropout_d(m). forward() is forward_open plus that add.
class PreNormBlock : public Layer {
 public:
  struct Open {
    Var a, m;
    DropoutSpec d;
  };
  Open forward_open(const Var& x, const Var& x_norm) {
    check_input(x.value());
    return open_impl(x, x_norm);
  }
  virtual ResidualNorm& first_norm() = 0;

 protected:
  virtual Open open_impl(const Var& x, const Var& x_norm) = 0;
  Var forward_impl(const Var& x) override;
};

class TransformerBlock : public PreNormBlock {
 public:
  TransformerBlock(const GptConfig& cfg, std::shared_ptr<Generator> rng, Generator& init);
  ResidualNorm& first_norm() override { return ln_1_; }

 protected:
  void check_input(const Tensor& x) const override;
  Open open_impl(const Var& x, const Var& x_norm) override;

 private:
  int64_t d_model_;
  float dropout_;                     // on each branch output, applied in the residual add
  std::shared_ptr<Generator> rng_;    // draws those masks
  LayerNorm ln_1_;
  CausalSelfAttention attn_;
  LayerNorm ln_2_;
  std::unique_ptr<FeedForward> mlp_;
};

// A module that only names its children (the llama arch's "model." prefix).
class ModuleGroup : public Module {
 public:
  void add(const std::string& name, Module& child) { register_module(name, child); }
};

// The whole model: arch gpt (nanoGPT's names: wte, wpe, h.N, ln_f) or llama (HF's:
// model.embed_tokens, model.layers.N, model.norm), the head tied to the token embedding or
// its own lm_head.
class GPT : public Module {
 public:
  // `rng` draws the dropout masks; `init` the initial weights (GPT-2's scheme).
  GPT(const GptConfig& cfg, std::shared_ptr<Generator> rng, Generator& init);
  const GptConfig& config() const { return cfg_; }
  const Var& token_embedding() const { return wte_->weight(); }
  // The LM head's weight [padded vocab, d]: the token embedding when tied.
  const Var& head_weight() const { return cfg_.tie_embeddings ? wte_->weight() : lm_head_; }
  // ids: i32 [B, T] with T ≤ context → final hidden states [B, T, C] (after ln_f).
  Var hidden(const Tensor& ids, bool ids_in_range = false);
  // logits [B, T, vocab_size] through the tied embedding (never the padding).
  Var forward(const Tensor& ids, bool ids_in_range = false);
  // Mean cross-entropy of the next-token predictions against targets [B, T].
  // ids_in_range: the caller guarantees every id and target is < vocab_size, so the GPU
  // range checks (one device sync each) are skipped; the trainer's batches are.
  Var loss(const Tensor& ids, const Tensor& targets, bool ids_in_range = false);
  // Rows per chunk of the fused classifier for a batch of `rows` tokens: classifier_chunk,
  // or equal chunks of at most kClassifierChunkBytes of logits.
  static constexpr int64_t kClassifierChunkBytes = int64_t{1} << 30;
  int64_t classifier_chunk(int64_t rows) const;
  // FLOPs of one training step's forward+backward per token (PaLM's 6N + 12·L·T·C), N
  // without the vocabulary padding.
  double flops_per_token(int64_t t) const;
  // Parameters as a checkpoint stores them: without the vocabulary padding.
  int64_t stored_parameters() const;
  // The tensors of `ts` as files store them (Note [Padded vocabulary]): every tensor of a
  // vocabulary-sized parameter (wte.weight, model.embed_tokens.weight, lm_head.weight, and
  // "<that>.<suffix>" optimizer state) with padded_vocab() rows becomes a view of its first
  // vocab_size rows; the others pass through. Saving writes the views,
  // loading copies into them and leaves the padding at zero.
  using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
  NamedTensors stored_view(NamedTensors ts) const;

 private:
  GptConfig cfg_;
  std::shared_ptr<Generator> rng_;
  ModuleGroup model_;                     // llama: "model"
  std::unique_ptr<Embedding> wte_, wpe_;  // no wpe for llama (rotary embeddings)
  Dropout drop_;
  std::vector<std::unique_ptr<PreNormBlock>> h_;
  std::unique_ptr<ResidualNorm> ln_f_;
  Var lm_head_;  // untied head
};

}  // namespace ffn
