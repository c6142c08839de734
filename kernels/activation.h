// kernels/activation.h — scalar activation math shared by the CPU references and
// the CUDA kernels (host/device), so both compute the same formulas.
//
//   gelu_erf(x)  = x/2 · (1 + erf(x/√2))
//   gelu_tanh(x) = x/2 · (1 + tanh(√(2/π)·(x + 0.044715·x³)))
//   silu(x)      = x · σ(x)
// T is float or double; 16-bit inputs are converted to float by the caller.
#pragma once

#include <cmath>
#include <string>

#include "core/dtype.h"  // FFN_HD

namespace ffn {

enum class Activation : uint8_t { gelu_erf, gelu_tanh, silu };

const char* activation_name(Activation a);
// Parses "gelu" (= gelu_erf), "gelu_erf", "gelu_tanh", "silu".
Activation parse_activation(const std::string& s);

namespace act_math {

FFN_HD float erf_(float x) { return erff(x); }
FFN_HD double erf_(double x) { return erf(x); }
FFN_HD float tanh_(float x) { return tanhf(x); }
FFN_HD double tanh_(double x) { return tanh(x); }
FFN_HD float exp_(float x) { return expf(x); }
FFN_HD double exp_(double x) { return exp(x); }

template <class T>
FFN_HD T value(T x, Activation a) {
  switch (a) {
    case Activation::gelu_erf:
      return T(0.5) * x * (T(1) + erf_(x * T(0.70710678118654752440)));
    case Activation::gelu_tanh: {
      const T u = T(0.79788456080286535588) * (x + T(0.044715) * x * x * x);
      return T(0.5) * x * (T(1) + tanh_(u));
    }
    case Activation::silu:
      return x / (T(1) + exp_(-x));
  }
  return x;
}

// d value / dx
template <class T>
FFN_HD T grad(T x, Activation a) {
  switch (a) {
    case Activation::gelu_erf: {
      const T cdf = T(0.5) * (T(1) + erf_(x * T(0.70710678118654752440)));
      const T pdf = T(0.39894228040143267794) * exp_(T(-0.5) * x * x);
      return cdf + x * pdf;
    }
    case Activation::gelu_tanh: {
      const T k = T(0.79788456080286535588), c = T(0.044715);
      const T t = tanh_(k * (x + c * x * x * x));
      return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * k * (T(1) + T(3) * c * x * x);
    }
    case Activation::silu: {
      const T s = T(1) / (T(1) + exp_(-x));
      return s * (T(1) + x * (T(1) - s));
    }
  }
  return T(1);
}

}  // namespace act_math
}  // namespace ffn
