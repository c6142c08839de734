// core/autograd.h — reverse-mode automatic differentiation on a tape of Nodes.
//
// A Var holds a value Tensor, a grad Tensor (undefined until a backward reaches
// it) and, if it was produced by a differentiable op, that op's Node. A Node
// keeps its input Vars (the edges of the graph) and whatever context its
// backward needs. Var::backward() sorts the nodes reachable from the output
// topologically and runs each Node::backward exactly once, summing gradients
// where a value was used more than once. Leaves accumulate into Var::grad
// (+=) across backward calls until zero_grad().
//
// Note [Gradient ownership]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Node::backward receives d_out by value: the engine hands over its only
// reference, so a node may return d_out itself as one of its gradients. Every
// tensor a node returns must otherwise be freshly allocated. The engine sums
// gradients in place into tensors it owns; if a node returns the same storage
// twice, the engine clones the second one, so nothing is ever summed twice.
//
// Note [Accumulating backward]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Right before a node's backward, the engine sets node->sums[i] to the gradient it has
// already summed for inputs[i] when inputs[i] is an op's output with a defined pending sum,
// or a leaf whose grad is defined (what the engine would add this node's gradient to with
// add_, in place, anyway), else null. A node may add its gradient for input i into *sums[i]
// in place — in the kernel that computes it, saving a pass — and return an undefined tensor
// for i. LayerNorm does this for the residual stream (layers/functional.cpp): the residual
// add's gradient always arrives first; the token embedding for a table tied to the LM head,
// whose gradient backward made first (Note [Embeddings in one pass] in kernels/embedding.h).
// The leaf hook still fires once the leaf's last node has run. sums_final[i] is true when no
// node left to run feeds inputs[i] besides this one (set for every op output, with or
// without a pending sum; false for leaves): the sum is complete once this node has added to
// it, so the node may also derive what inputs[i]'s producer will need from it (Note
// [Residual add and norm]); with sums[i] null as well, the producer receives exactly what
// this node returns for i (Note [Branch bias gradient]). sums and sums_final are cleared
// after backward.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace ffn {

class Node;

struct VarImpl {
  Tensor value;
  Tensor grad;
  bool requires_grad = false;
  std::shared_ptr<Node> grad_fn;
  std::string name;
};

class Var {
 public:
  Var() = default;
  explicit Var(Tensor value, bool requires_grad = false, std::string name = {});

  bool defined() const { return impl_ != nullptr; }
  const Tensor& value() const;
  Tensor& mutable_value();  // for optimizers: in-place parameter updates
  const Tensor& grad() const;
  void set_grad(Tensor g);
  void zero_grad();  // drops the gradient (undefined until the next backward)
  bool requires_grad() const;
  const std::shared_ptr<Node>& grad_fn() const;
  const std::string& name() const;
  const Shape& shape() const { return value().shape(); }
  VarImpl* impl() const { return impl_.get(); }

  // Backward from a one-element output (seed 1).
  void backward() const;
  // Backward from any output with an explicit gradient of the same shape.
  void backward(const Tensor& d_out) const;
  // Same, calling on_leaf_ready(leaf) as soon as a leaf's gradient for this backward is
  // complete (no node that runs later can add to it) — data parallelism starts reducing a
  // layer's gradients while earlier layers are still in backward. Leaves that receive no
  // gradient are not reported.
  using LeafHook = std::function<void(const Var&)>;
  void backward(const Tensor& d_out, const LeafHook& on_leaf_ready) const;

 private:
  std::shared_ptr<VarImpl> impl_;
};

class Node {
 public:
  virtual ~Node() = default;
  virtual const char* name() const = 0;
  // One gradient per entry of `inputs` (undefined where not needed). Runs once;
  // see Note [Gradient ownership].
  virtual std::vector<Tensor> backward(Tensor d_out) = 0;
  // Drops the saved context; called by the engine right after backward.
  virtual void release() = 0;
  // Bytes of tensors this node keeps alive for backward beyond its inputs and
  // parameters (saved activations). Benchmarks and tests report it.
  virtual size_t saved_bytes() const { return 0; }

  std::vector<Var> inputs;  // entries may be undefined Vars (absent optional inputs)
  std::vector<Tensor*> sums;  // during backward only: Note [Accumulating backward]
  std::vector<bool> sums_final;  // the same
  bool released = false;
};

// Wraps `value` as the output of `node` applied to `inputs`. The node is
// recorded only when grad mode is on and some input requires grad.
Var make_output(Tensor value, std::shared_ptr<Node> node, std::vector<Var> inputs);

bool grad_enabled();

// Disables graph recording in this thread while alive (evaluation, optimizer steps).
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

}  // namespace ffn
