// layers/module.h — the base of every layer: named parameters, children, train/eval.
//
// A Module owns its parameters (Vars with requires_grad) and refers to child
// modules that are its own members, so modules are neither copyable nor movable.
// Layers expose a non-virtual forward() that validates the input and then calls
// the virtual forward_impl(); gradients flow back through autograd nodes.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/autograd.h"
#include "core/generator.h"

namespace ffn {

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Parameters of this module and its children, named "child.param" recursively.
  std::vector<std::pair<std::string, Var>> named_parameters() const;
  std::vector<Var> parameters() const;
  int64_t num_parameters() const;

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  void zero_grad();
  // Moves/casts every parameter (drops gradients).
  void to(Device device, DType dtype);

 protected:
  Var& register_parameter(const std::string& name, Tensor value);
  void register_module(const std::string& name, Module& child);

 private:
  std::vector<std::pair<std::string, Var>> params_;
  std::vector<std::pair<std::string, Module*>> children_;
  bool training_ = true;
};

// A module mapping one Var to one Var.
class Layer : public Module {
 public:
  Var forward(const Var& x) {
    check_input(x.value());
    return forward_impl(x);
  }

 protected:
  virtual void check_input(const Tensor& x) const = 0;
  virtual Var forward_impl(const Var& x) = 0;
};

// Where a layer's parameters live and how they start.
struct ParamInit {
  DType dtype = DType::f32;
  Device device = Device::cpu();
};

}  // namespace ffn
