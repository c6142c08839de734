// layers/layers.h — Linear, Dropout, FeedForward and GatedFeedForward.
//
// Each layer's forward() checks the input's last dimension, dtype and device
// against its parameters and raises an error naming the layer and both shapes.
// Dropout draws a fresh DropoutSpec from the layer's Generator on every
// training-mode call (Note [Dropout RNG]); in eval mode dropout is off.
#pragma once

#include <memory>

#include "layers/functional.h"
#include "layers/module.h"

namespace ffn {

// Fills used by the layers: U(-1/√fan_in, 1/√fan_in) for weights and biases (PyTorch's
// nn.Linear default) unless `init_std` > 0, which gives N(0, init_std) weights and zero biases.
struct LinearOptions {
  int64_t in_features = 0;
  int64_t out_features = 0;
  bool bias = true;
  double init_std = 0.0;
  ParamInit place;
};

class Linear : public Layer {
 public:
  Linear(const LinearOptions& opt, Generator& init_rng);
  const Var& weight() const { return w_; }
  const Var& bias() const { return b_; }  // undefined Var without bias

 protected:
  void check_input(const Tensor& x) const override;
  Var forward_impl(const Var& x) override;

 private:
  LinearOptions opt_;
  Var w_, b_;
};

class Dropout : public Layer {
 public:
  Dropout(float p, std::shared_ptr<Generator> rng);

 protected:
  void check_input(const Tensor& x) const override;
  Var forward_impl(const Var& x) override;

 private:
  float p_;
  std::shared_ptr<Generator> rng_;
};

// model.ffn: which FFN a transformer block (or ffn-demo) builds. ffn_activation() is the
// one mapping from the name to the math: "gelu" is the exact-erf GELU (PyTorch's nn.GELU()
// default, nanoGPT's MLP), "gelu_tanh" its tanh approximation (GPT-2's and HF's gelu_new),
// "geglu" gates with the tanh GELU, "swiglu" with SiLU.
enum class FfnKind : uint8_t { gelu, geglu, swiglu, gelu_tanh };
inline constexpr NameOf<FfnKind> kFfnKindNames[] = {{FfnKind::gelu, "gelu"},
                                                    {FfnKind::geglu, "geglu"},
                                                    {FfnKind::swiglu, "swiglu"},
                                                    {FfnKind::gelu_tanh, "gelu_tanh"}};
struct FfnActivation {
  Activation act;
  bool gated;
};
constexpr FfnActivation ffn_activation(FfnKind k) {
  return k == FfnKind::swiglu      ? FfnActivation{Activation::silu, true}
         : k == FfnKind::geglu     ? FfnActivation{Activation::gelu_tanh, true}
         : k == FfnKind::gelu_tanh ? FfnActivation{Activation::gelu_tanh, false}
                                   : FfnActivation{Activation::gelu_erf, false};
}

struct FeedForwardOptions {
  int64_t d_model = 0;
  int64_t hidden = 0;  // h; fc1 has 2h rows when gated
  Activation act = Activation::gelu_erf;
  bool gated = false;
  float dropout = 0.0f;      // on the hidden activation
  float out_dropout = 0.0f;  // on the output (the residual dropout of a transformer block)
  bool bias = true;
  bool recompute = false;  // save only x; recompute fc1 in backward
  double init_std = 0.0;   // see LinearOptions
  ParamInit place;
};

// fc1 → act → dropout → fc2 → dropout (GatedFeedForward: fc1 → [v | g] → v ⊙ act(g) → …),
// one autograd node running the fused kernels (layers/ffn_functional.h).
class FeedForward : public Layer {
 public:
  // `rng` draws the dropout masks and, unless `init` is given, the initial weights.
  FeedForward(const FeedForwardOptions& opt, std::shared_ptr<Generator> rng,
              Generator* init = nullptr);
  const FeedForwardOptions& options() const { return opt_; }

 protected:
  void check_input(const Tensor& x) const override;
  Var forward_impl(const Var& x) override;

 private:
  FeedForwardOptions opt_;
  std::shared_ptr<Generator> rng_;
  Var w1_, b1_, w2_, b2_;
};

// GEGLU (act = gelu_tanh or gelu_erf) or SwiGLU (act = silu).
class GatedFeedForward : public FeedForward {
 public:
  GatedFeedForward(const FeedForwardOptions& opt, std::shared_ptr<Generator> rng,
                   Generator* init = nullptr);
};

}  // namespace ffn
