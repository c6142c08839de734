// train/weights.h — GPT weights in the three layouts users meet: ours (what ffn-train's
// checkpoints hold), HuggingFace GPT-2's and nanoGPT's, and the conversions between them
// (ffn-convert, ffn-train --init-from).
//
// Note [Weight layouts]
// ~~~~~~~~~~~~~~~~~~~~~
// Per block N, with d = d_model and h the FFN width (4d for GPT-2):
//
//   ffn (ours)                   hf-gpt2 (Conv1D: [in, out])           nanogpt (Linear: [out, in])
//   wte.weight [V, d]            transformer.wte.weight [V, d]         transformer.wte.weight
//   wpe.weight [T, d]            transformer.wpe.weight [T, d]         transformer.wpe.weight
//   h.N.ln_1.{weight,bias}       transformer.h.N.ln_1.*                transformer.h.N.ln_1.*
//   h.N.attn.c_attn.w [3d, d]    transformer.h.N.attn.c_attn.w [d, 3d] transformer.h.N.attn.c_attn.w [3d, d]
//   h.N.attn.c_proj.w [d, d]     …attn.c_proj.weight [d, d]ᵀ           …attn.c_proj.weight [d, d]
//   h.N.ln_2.*                   transformer.h.N.ln_2.*                transformer.h.N.ln_2.*
//   h.N.mlp.fc1.w [h, d]         …mlp.c_fc.weight [d, h]               …mlp.c_fc.weight [h, d]
//   h.N.mlp.fc2.w [d, h]         …mlp.c_proj.weight [h, d]             …mlp.c_proj.weight [d, h]
//   ln_f.{weight,bias}           transformer.ln_f.*                    transformer.ln_f.*
//                                                                      lm_head.weight (= wte)
// Biases go with their weights (never transposed). The LM head is tied to wte in all three.
// Reading: the layout is detected from the names (our fc1/fc2 against c_fc/c_proj) and, for
// the GPT-2 names, from c_attn's orientation ([d, 3d]: HF; [3d, d]: nanoGPT); the
// "transformer." prefix is optional (the hub's gpt2 file has none); HF's attention-mask
// buffers (attn.bias, attn.masked_bias) are ignored and an lm_head.weight must equal wte.
// Anything else unknown, missing, of another shape or of a non-float dtype is refused,
// naming the tensor. Writing always emits our registration order, so ffn → X → ffn gives
// back a checkpoint's model.safetensors byte for byte. Gated FFNs (geglu, swiglu) have no
// GPT-2 layout and a model without biases none in HF's.
#pragma once

#include <string>

#include "train/io/safetensors.h"

namespace ffn::train {

enum class WeightLayout : uint8_t { ffn, hf_gpt2, nanogpt };
const char* weight_layout_name(WeightLayout l);  // "ffn", "hf-gpt2", "nanogpt"
WeightLayout parse_weight_layout(const std::string& s);  // throws a config error

// The model tensors of `path`: a run directory (its latest checkpoint), a ckpt-* directory
// or a .safetensors file.
NamedTensors read_weights(const std::string& path, std::string* file_used = nullptr);

WeightLayout detect_weight_layout(const NamedTensors& ts, const std::string& origin);
// Any layout to ours, in our registration order.
NamedTensors to_ffn_layout(const NamedTensors& ts, const std::string& origin);
// Ours (as to_ffn_layout returns it) to `to`.
NamedTensors from_ffn_layout(const NamedTensors& ffn, WeightLayout to);

}  // namespace ffn::train
