// layers/llama.h — the blocks of a Llama-shaped model (GptConfig::arch = llama): RMSNorm before
// each branch, rotary position embeddings on q and k, optional grouped-query attention, a
// SwiGLU MLP, no biases. Parameter names are HuggingFace Llama's (self_attn.q_proj, …,
// mlp.gate_proj, …; GPT assembles model.layers.N and model.norm around them), so a
// checkpoint loads there with no renaming.
//
// Note [Llama projections]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// The weights are stored as HF has them, one matrix per projection, but computed the way the
// fused kernels want them: the attention stacks q_proj, k_proj and v_proj into one QKV weight
// (fn::concat_rows, one GEMM, then the existing attention kernels on [q | k | v]); with
// kv_heads < heads each key and value head's rows are repeated for the query heads that share
// it, which is grouped-query attention computed as multi-head attention (the same values and
// gradients, the extra key/value columns computed rather than saved). The MLP stacks up_proj
// over gate_proj into the gated FFN's fc1 ([value | gate], layers/ffn_functional.h), so
// down_proj(silu(gate_proj(x)) ⊙ up_proj(x)) is one fused FFN node. Both stackings are copies
// of the weights per forward (small next to the activations) and sum back in backward.
#pragma once

#include <memory>

#include "layers/transformer.h"

namespace ffn {

// x [B, T, C] → o_proj(attention(rope(q, k), v)).
class LlamaAttention : public Layer {
 public:
  LlamaAttention(const GptConfig& cfg, std::shared_ptr<Generator> rng, Generator& init);
  // The branch up to o_proj's input, and o_proj: forward(x) is o_proj(forward_heads(x)).
  Var forward_heads(const Var& x);
  // forward_heads(norm(x)) for a folded RMSNorm `norm` whose statistics of x are rstd (Note
  // [RMSNorm folded into the QKV GEMM] in layers/attention.cpp).
  Var forward_heads_folded(const Var& x, const RMSNorm& norm, const Tensor& rstd);
  Linear& out_proj() { return o_proj_; }

 protected:
  void check_input(const Tensor& x) const override;
  Var forward_impl(const Var& x) override;

 private:
  GptConfig cfg_;
  int64_t head_dim_, kv_heads_;
  Var qkv_weight() const;  // Note [Llama projections]
  DropoutSpec attention_dropout();

  std::shared_ptr<Generator> rng_;
  Linear q_proj_, k_proj_, v_proj_, o_proj_;
};

// down_proj(act(gate_proj(x)) ⊙ up_proj(x)), act from cfg.ffn (SwiGLU: silu).
class LlamaMLP : public Layer {
 public:
  LlamaMLP(const GptConfig& cfg, Generator& init);
  // forward(norm(x)) for a folded RMSNorm `norm` whose statistics of x are rstd (Note [RMSNorm
  // folded into the FFN] in layers/ffn_nodes.cpp).
  Var forward_folded(const Var& x, const RMSNorm& norm, const Tensor& rstd);

 protected:
  void check_input(const Tensor& x) const override;
  Var forward_impl(const Var& x) override;

 private:
  int64_t d_model_, hidden_;
  Activation act_;
  Linear gate_proj_, up_proj_, down_proj_;
};

// x + self_attn(input_layernorm(x)), then x + mlp(post_attention_layernorm(x)).
// input_layernorm is folded into the QKV GEMM and post_attention_layernorm into the MLP's
// fc1 where they can be (RMSNorm::folds; Note [RMSNorm folded into the QKV GEMM] in
// layers/attention.cpp, Note [RMSNorm folded into the FFN] in layers/ffn_nodes.cpp).
class LlamaBlock : public PreNormBlock {
 public:
  LlamaBlock(const GptConfig& cfg, std::shared_ptr<Generator> rng, Generator& init);
  ResidualNorm& first_norm() override { return input_layernorm_; }

 protected:
  void check_input(const Tensor& x) const override;
  Open open_impl(const Var& x, const Var& x_norm) override;

 private:
  int64_t d_model_;
  float dropout_;
  std::shared_ptr<Generator> rng_;
  RMSNorm input_layernorm_;
  LlamaAttention self_attn_;
  RMSNorm post_attention_layernorm_;
  LlamaMLP mlp_;
};

}  // namespace ffn
