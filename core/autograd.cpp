// core/autograd.cpp — the backward engine (topological order, gradient sums, leaf grads).
#include "core/autograd.h"

#include <unordered_map>
#include <unordered_set>

namespace ffn {

namespace {
thread_local bool g_grad_enabled = true;

// Sums `g` into `slot` (which the engine owns). See Note [Gradient ownership].
void accumulate(Tensor& slot, Tensor g, const char* where) {
  if (!g.defined()) return;
  if (!slot.defined()) {
    slot = std::move(g);
    return;
  }
  FFN_CHECK(slot.shape() == g.shape(), "[backward] gradient shape ", shape_str(g.shape()), " from ",
            where, " does not match ", shape_str(slot.shape()));
  slot.add_(g);
}
}  // namespace

Var::Var(Tensor value, bool requires_grad, std::string name) : impl_(std::make_shared<VarImpl>()) {
  impl_->value = std::move(value);
  impl_->requires_grad = requires_grad;
  impl_->name = std::move(name);
}

const Tensor& Var::value() const {
  FFN_CHECK(impl_, "[var] access to an undefined Var");
  return impl_->value;
}
Tensor& Var::mutable_value() {
  FFN_CHECK(impl_, "[var] access to an undefined Var");
  return impl_->value;
}
const Tensor& Var::grad() const {
  FFN_CHECK(impl_, "[var] access to an undefined Var");
  return impl_->grad;
}
void Var::set_grad(Tensor g) {
  FFN_CHECK(impl_, "[var] access to an undefined Var");
  impl_->grad = std::move(g);
}
void Var::zero_grad() {
  if (impl_) impl_->grad = Tensor();
}
bool Var::requires_grad() const {
  return impl_ && impl_->requires_grad;
}
const std::shared_ptr<Node>& Var::grad_fn() const {
  FFN_CHECK(impl_, "[var] access to an undefined Var");
  return impl_->grad_fn;
}
const std::string& Var::name() const {
  FFN_CHECK(impl_, "[var] access to an undefined Var");
  return impl_->name;
}

void Var::backward() const {
  FFN_CHECK(impl_, "[backward] called on an undefined Var");
  FFN_CHECK(value().numel() == 1,
            "[backward] called without d_out on a non-scalar output of shape ",
            shape_str(value().shape()), "; pass a gradient of that shape");
  backward(Tensor::full(value().shape(), 1.0, value().dtype(), value().device()));
}

void Var::backward(const Tensor& d_out) const {
  backward(d_out, LeafHook());
}

void Var::backward(const Tensor& d_out, const LeafHook& on_leaf_ready) const {
  FFN_CHECK(impl_, "[backward] called on an undefined Var");
  FFN_CHECK(requires_grad(),
            "[backward] the output does not require grad (no input needed a "
            "gradient, or it was computed under NoGradGuard)");
  check_shape(d_out, value().shape(), "backward", "d_out");
  check_same_device(d_out, value(), "backward", "d_out", "output");
  check_same_dtype(d_out, value(), "backward", "d_out", "output");
  NoGradGuard no_grad;  // backward math is never recorded

  if (!impl_->grad_fn) {  // a leaf
    accumulate(impl_->grad, d_out.clone(), "the seed");
    if (on_leaf_ready) on_leaf_ready(*this);
    return;
  }

  // Post-order DFS (iterative) gives inputs before users; reverse it for backward.
  std::vector<Node*> order;
  std::unordered_set<Node*> visited;
  std::vector<std::pair<Node*, size_t>> stack{{impl_->grad_fn.get(), 0}};
  visited.insert(impl_->grad_fn.get());
  while (!stack.empty()) {
    auto& [node, next] = stack.back();
    if (next < node->inputs.size()) {
      const Var& in = node->inputs[next++];
      Node* child = in.defined() ? in.impl()->grad_fn.get() : nullptr;
      if (child && visited.insert(child).second) stack.push_back({child, 0});
    } else {
      order.push_back(node);
      stack.pop_back();
    }
  }

  // For the hook: how many nodes still to visit feed each leaf. A leaf is complete when
  // the last of them has been visited (run or skipped).
  std::unordered_map<VarImpl*, int> leaf_edges;
  std::unordered_map<VarImpl*, Var> leaf_var;
  if (on_leaf_ready)
    for (Node* node : order)
      for (const Var& in : node->inputs)
        if (in.defined() && !in.grad_fn() && in.requires_grad()) {
          ++leaf_edges[in.impl()];
          leaf_var.emplace(in.impl(), in);
        }
  auto visited_node = [&](Node* node) {
    if (!on_leaf_ready) return;
    for (const Var& in : node->inputs)
      if (in.defined() && !in.grad_fn() && in.requires_grad() && --leaf_edges[in.impl()] == 0 &&
          in.impl()->grad.defined())
        on_leaf_ready(leaf_var.at(in.impl()));
  };

  // Edges from nodes still to visit into each node (Note [Accumulating backward]'s sums_final).
  std::unordered_map<Node*, int> users;
  for (Node* node : order)
    for (const Var& in : node->inputs)
      if (in.defined() && in.grad_fn()) ++users[in.grad_fn().get()];
  auto release_edges = [&](Node* node) {
    for (const Var& in : node->inputs)
      if (in.defined() && in.grad_fn()) --users[in.grad_fn().get()];
  };

  std::unordered_map<Node*, Tensor> pending;
  pending[impl_->grad_fn.get()] = d_out.clone();
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node* node = *it;
    auto found = pending.find(node);
    if (found == pending.end()) {  // no gradient flowed here
      visited_node(node);
      release_edges(node);
      continue;
    }
    FFN_CHECK(!node->released, "[backward] '", node->name(),
              "' already ran backward and freed its saved tensors; run forward again "
              "before calling backward a second time");
    Tensor g_out = std::move(found->second);
    pending.erase(found);
    // Note [Accumulating backward]. (Pointers into an unordered_map stay valid: backward
    // adds no entries.)
    node->sums.assign(node->inputs.size(), nullptr);
    node->sums_final.assign(node->inputs.size(), false);
    for (size_t i = 0; i < node->inputs.size(); ++i) {
      const Var& in = node->inputs[i];
      if (!in.defined() || !in.requires_grad()) continue;
      if (!in.grad_fn()) {  // a leaf: its gradient so far
        if (in.impl()->grad.defined()) node->sums[i] = &in.impl()->grad;
        continue;
      }
      int own = 0;  // this node's edges into the same producer
      for (const Var& other : node->inputs)
        if (other.defined() && other.grad_fn() == in.grad_fn()) ++own;
      node->sums_final[i] = users[in.grad_fn().get()] == own;
      const auto slot = pending.find(in.grad_fn().get());
      if (slot == pending.end() || !slot->second.defined()) continue;
      node->sums[i] = &slot->second;
    }
    std::vector<Tensor> grads = node->backward(std::move(g_out));
    release_edges(node);
    node->sums.clear();
    node->sums_final.clear();
    node->release();
    node->released = true;
    FFN_CHECK(grads.size() == node->inputs.size(), "[backward] '", node->name(), "' returned ",
              grads.size(), " gradients for ", node->inputs.size(), " inputs");
    for (size_t i = 0; i < grads.size(); ++i) {
      for (size_t j = 0; j < i; ++j)  // Note [Gradient ownership]: never alias two slots
        if (grads[i].defined() && grads[j].defined() && grads[i].storage() == grads[j].storage())
          grads[i] = grads[i].clone();
      const Var& in = node->inputs[i];
      if (!in.requires_grad() || !grads[i].defined()) continue;
      check_shape(grads[i], in.value().shape(), node->name(), "input gradient");
      if (in.grad_fn())
        accumulate(pending[in.grad_fn().get()], std::move(grads[i]), node->name());
      else
        accumulate(in.impl()->grad, std::move(grads[i]), node->name());
    }
    visited_node(node);
  }
}

Var make_output(Tensor value, std::shared_ptr<Node> node, std::vector<Var> inputs) {
  bool needs = false;
  if (g_grad_enabled)
    for (const Var& v : inputs) needs = needs || v.requires_grad();
  Var out(std::move(value), needs);
  if (needs) {
    node->inputs = std::move(inputs);
    out.impl()->grad_fn = std::move(node);
  }
  return out;
}

bool grad_enabled() {
  return g_grad_enabled;
}

NoGradGuard::NoGradGuard() : prev_(g_grad_enabled) {
  g_grad_enabled = false;
}
NoGradGuard::~NoGradGuard() {
  g_grad_enabled = prev_;
}

}  // namespace ffn
