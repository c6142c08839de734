// layers/functional.h — differentiable ops on Vars (each records one autograd Node).
//
// Tensor-shaped arguments may have any number of leading dimensions; ops work
// on the flattened [rows, last_dim] view. Dropout specs come from the caller's
// Generator (Generator::dropout) so every call gets its own mask.
#pragma once

#include <utility>

#include "core/autograd.h"
#include "core/philox.h"
#include "layers/ffn_functional.h"

namespace ffn::fn {

// y = x · Wᵀ + b.  x: [..., in], w: [out, in], b: [out] (optional, may be an undefined Var).
Var linear(const Var& x, const Var& w, const Var& b);
// y = x ⊙ mask · 1/(1-p) (identity when d.p = 0).
Var dropout(const Var& x, const DropoutSpec& d);
// y = a + b (same shape). One of them may be 16-bit when the other is fp32 (a mixed-precision
// residual add); y then is fp32 and each input's gradient comes back in its own dtype.
Var add(const Var& a, const Var& b);
// out = res + dropout(y) in one pass each way (kernels/dropout_add.h): the pre-LN block's
// residual add of a branch. res may be the fp32 stream of a 16-bit y (GPU); out is in res's
// dtype and each gradient comes back in its input's dtype.
Var dropout_add(const Var& res, const Var& y, const DropoutSpec& d);
// x converted to `dtype` (identity when it already is); the gradient converts back.
Var cast(const Var& x, DType dtype);
// loss = mean((pred - target)²), shape []. target gets no gradient.
Var mse_loss(const Var& pred, const Tensor& target);
// The fused FFN block (layers/ffn_functional.h) as one node; x: [..., d].
Var ffn(const Var& x, const Var& w1, const Var& b1, const Var& w2, const Var& b2,
        const FfnConfig& cfg, const FfnDropout& d);
// ffn(rms_norm(x, g, eps), w1, …) with the norm folded into fc1 (Note [RMSNorm folded into
// the FFN] in layers/ffn_nodes.cpp), rstd the rows' statistics (add_rms_stats or rms_stats):
// one node whose fc1 runs on x with W1·diag(g) and rstd as its row scale; y is never stored.
// Where it does not fold (rms_fold() off, no rstd or w1, recompute, x not contiguous in w1's
// and g's dtype, on the GPU gemm_epilogues() off or x not 16-bit) it is exactly that
// composition, the norm recomputed from x.
Var rms_norm_ffn(const Var& x, const Var& g, const Tensor& rstd, double eps, const Var& w1,
                 const Var& b1, const Var& w2, const Var& b2, const FfnConfig& cfg,
                 const FfnDropout& d);

// out[..., :] = table[ids[...], :]; ids: i32 of any shape, table: [V, C] → [..., C].
// check_ids: see kernels/embedding.h (false only for ids the caller built in range).
Var embedding(const Tensor& ids, const Var& table, bool check_ids = true);
// table[ids] + pos[positions] (pos optional, position of ids[b, t] = t) as `dtype` (table's,
// or fp32 for a 16-bit table: the residual stream), one pass each way (Note [Embeddings in
// one pass] in kernels/embedding.h). ids [B, T] → [B, T, C].
Var embedding_sum(const Tensor& ids, const Var& table, const Var& pos, DType dtype,
                  bool check_ids = true);
// LayerNorm over the last dimension (kernels/layer_norm.h); b may be an undefined Var. The
// output has w's dtype (x may be the fp32 residual stream of a 16-bit model on the GPU).
Var layer_norm(const Var& x, const Var& w, const Var& b, double eps = 1e-5);
// RMSNorm over the last dimension (kernels/layer_norm.h): x·rstd·w, rstd = 1/√(mean(x²) + eps).
// Mixed precision as layer_norm.
Var rms_norm(const Var& x, const Var& w, double eps = 1e-6);

// {a, norm(a)} with a = dropout_add(res, h, d) and the norm layer_norm(a, w, b, eps) (rms:
// rms_norm(a, w, eps), b ignored), computed in one pass (Note [Residual add and norm] in
// kernels/layer_norm.h); the graph and the gradients are the two ops'.
std::pair<Var, Var> add_layer_norm(const Var& res, const Var& h, const DropoutSpec& d, const Var& w,
                                   const Var& b, double eps, bool rms = false);
// add_layer_norm with h = linear(xin, wl, bl): where the GEMM that makes h can end in the add
// and the norm (kernels/layer_norm.h's linear_add_layer_norm, Note [Residual add and norm in
// the epilogue]) h is never stored; the graph and the gradients are still the three ops'.
// Elsewhere it is linear then add_layer_norm.
std::pair<Var, Var> linear_add_layer_norm(const Var& res, const Var& xin, const Var& wl,
                                          const Var& bl, const DropoutSpec& d, const Var& w,
                                          const Var& b, double eps, bool rms = false);
// Note [RMSNorm folded into the QKV GEMM] (layers/attention.cpp), the norm's side: a =
// dropout_add(res, h, d) as its graph node, and the RMSNorm statistics rstd of a's rows (f32
// [rows], no gradient: the consumer's node owns the norm's) from the same pass, which writes
// no normalized output. w is the norm's weight (for its dtype). rms_stats: the statistics
// alone.
std::pair<Var, Tensor> add_rms_stats(const Var& res, const Var& h, const DropoutSpec& d,
                                     const Var& w, double eps);
Tensor rms_stats(const Var& x, const Var& w, double eps);
// The folded norm's graph node: rms_norm(x, w)'s node for rows of statistics rstd, whose output
// is never computed (its value borrows x's memory: never read it) and whose backward takes
// rstd ⊙ dy (kernels/layer_norm.h, prescaled). Only for a consumer node built with it that
// makes exactly that gradient (fn::rms_norm_rope_attention, fn::rms_norm_ffn).
Var rms_norm_unstored(const Var& x, const Var& w, const Tensor& rstd);
// Mean softmax cross-entropy of logits [..., V] against i32 targets [...]; shape [], in
// acc_dtype(logits) (f32 for 16-bit logits). targets get no gradient.
// check_targets, classes: see kernels/cross_entropy.h (classes > 0: only the first
// `classes` columns are classes, the rest padding; Note [Padded vocabulary]).
Var cross_entropy(const Var& logits, const Tensor& targets, bool check_targets = true,
                  int64_t classes = 0);
// cross_entropy(linear(x, w, {}), targets, check_targets, classes) without the logits
// (Note [Fused classifier]): x [..., d], w [V, d] (the LM head), targets [...]; rows go
// through chunk_rows at a time (0: all at once).
Var linear_cross_entropy(const Var& x, const Var& w, const Tensor& targets,
                         bool check_targets = true, int64_t classes = 0, int64_t chunk_rows = 0);

// Note [Fused classifier]
// ~~~~~~~~~~~~~~~~~~~~~~~
// GPT-2's logits are [B·T, 50304]: 1.6 GB in bf16 at B·T = 16384, and the unfused loss keeps
// them for backward and then writes a second buffer of the same size for their gradient.
// linear_cross_entropy instead takes the rows a chunk at a time, in the forward:
//   1. logits = x_c · wᵀ into one reused [chunk, V] buffer;
//   2. cross_entropy_rows: the chunk's row losses, and the logits overwritten in place by
//      their gradient for d_loss = 1, (softmax - onehot)/N (kernels/cross_entropy.h);
//   3. dx_c = dlogits · w, and dw (+)= dlogitsᵀ · x_c summed over the chunks in fp32 (an f32
//      GEMM output for 16-bit inputs);
// and backward only scales dx and dw by the d_loss it is given (scale_by, read on the device).
// So no [N, V] tensor exists beyond one chunk, the loss reads the logits once instead of
// twice, and the autograd graph keeps dx [N, d] and dw [V, d] (fp32) instead of the logits.
// The forward does the gradient work only when grad mode is on and x or w needs a gradient;
// otherwise it is the loss alone. Chunks trade memory for speed: each one re-reads and
// re-writes the fp32 dw (155 MB for GPT-2), and smaller GEMMs fill the GPU less
// (bench/RESULTS-2026-11-24-s11-13.md, session 11, measures it). The result equals the unfused pair
// up to rounding: the dw sum over chunks is in fp32, the row order of the loss mean is the same.

// Rotary position embeddings on the q and k heads of qkv [B, T, (heads + 2·kv_heads)·D]
// (kernels/rope.h); the gradient rotates back.
Var rope(const Var& qkv, int64_t heads, int64_t kv_heads, double base);
// Rows [begin, begin + count) of a 2-D Var, one piece of concat_rows.
struct RowRange {
  Var v;
  int64_t begin = 0, count = 0;
};
// The pieces' rows stacked in order into one new [Σ count, cols] tensor (same dtype and
// device). A Var may appear in several pieces (its gradient is the sum): the Llama
// attention builds its QKV weight from q_proj, k_proj, v_proj this way, repeating each key
// and value head for the query heads that share it (grouped-query attention).
Var concat_rows(const std::vector<RowRange>& parts);
// x[..., :n] as a new contiguous tensor; the gradient is d_out zero-padded back to x's width.
Var leading_columns(const Var& x, int64_t n);
// Causal multi-head self-attention core: qkv [B, T, 3C] (q | k | v, heads of C/heads
// columns each) → [B, T, C] = concat_h(dropout(softmax(q_h k_hᵀ/√d)) v_h). One node. With
// `fused` (the default), bf16/f16 on the GPU runs the flash-style kernels of
// kernels/attention.h where they are faster (fused_attention_preferred); otherwise batched GEMMs and the fused
// causal softmax, saving the head-split q, k, v and the probabilities (layers/attention.cpp).
Var causal_attention(const Var& qkv, int64_t heads, const DropoutSpec& attn_dropout,
                     bool fused = true);
// The Llama attention's core over its projection: causal_attention(rope(linear(x, w), heads,
// heads, base), heads, attn_dropout, fused) for x [B, T, C] and w [3·heads·D, C] (no bias).
// Where the flash-style kernels run it with gemm_epilogues() on, one node with the rotation
// fused into the projection's epilogue and the attention backward's stores (Note [Fused
// rotary embeddings], layers/attention.cpp); elsewhere exactly that composition.
Var rope_attention(const Var& x, const Var& w, int64_t heads, double base,
                   const DropoutSpec& attn_dropout, bool fused = true);
// rope_attention(rms_norm(x, g, eps), w, …) with the norm folded into the projection (Note
// [RMSNorm folded into the QKV GEMM] in layers/attention.cpp), rstd the rows' statistics
// (add_rms_stats or rms_stats; f32 [B·T]). Where the folded kernels cannot run (rms_fold() off,
// rope_attention's fused path does not run, or x is not in w's 16-bit dtype) it is exactly
// that composition, the norm recomputed from x.
Var rms_norm_rope_attention(const Var& x, const Var& g, const Tensor& rstd, double eps,
                            const Var& w, int64_t heads, double base,
                            const DropoutSpec& attn_dropout, bool fused = true);

}  // namespace ffn::fn
