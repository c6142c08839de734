// kernels/activation.h — scalar activation math shared by the CPU references and
// the CUDA kernels (host/device), so both compute the same formulas.
//
//   gelu_erf(x)  = x/2 · (1 + erf(x/√2))
//   gelu_tanh(x) = x/2 · (1 + tanh(√(2/π)·(x + 0.044715·x³)))  (computed as x·σ(2u))
//   silu(x)      = x · σ(x)
//   identity(x)  = x       (bias + dropout without an activation)
// T is float or double; 16-bit inputs are converted to float by the caller.
#pragma once

#include <cmath>
#include <string>

#include "core/dtype.h"  // FFN_HD
#include "core/names.h"

namespace ffn {

enum class Activation : uint8_t { gelu_erf, gelu_tanh, silu, identity };
// Canonical names first; "gelu" (= gelu_erf, PyTorch's nn.GELU() default) and "swish" are
// aliases.
inline constexpr NameOf<Activation> kActivationNames[] = {
    {Activation::gelu_erf, "gelu_erf"}, {Activation::gelu_tanh, "gelu_tanh"},
    {Activation::silu, "silu"},         {Activation::identity, "identity"},
    {Activation::gelu_erf, "gelu"},     {Activation::silu, "swish"}};

inline const char* activation_name(Activation a) {
  return name_of(kActivationNames, a);
}
Activation parse_activation(const std::string& s);

namespace act_math {

FFN_HD float erf_(float x) {
  return erff(x);
}
FFN_HD double erf_(double x) {
  return erf(x);
}
// exp and a/b; on the GPU the float versions use the hardware units (__expf: relative
// error ~2⁻²¹·(2 + 1.2|x|); __fdividef: 2 ulp), which the fused kernels need to stay
// memory-bound. Every use below is a sigmoid 1/(1 + e), where these errors stay relative.
FFN_HD float exp_(float x) {
#if defined(__CUDA_ARCH__)
  return __expf(x);
#else
  return expf(x);
#endif
}
FFN_HD double exp_(double x) {
  return exp(x);
}
FFN_HD float div_(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdividef(a, b);
#else
  return a / b;
#endif
}
FFN_HD double div_(double a, double b) {
  return a / b;
}

// gelu_tanh(x) = x/2·(1 + tanh(u)) = x·σ(2u), u = √(2/π)·(x + 0.044715·x³): the sigmoid
// form has no cancellation for negative x and costs one exp.
template <class T>
FFN_HD T value(T x, Activation a) {
  switch (a) {
    case Activation::gelu_erf:
      return T(0.5) * x * (T(1) + erf_(x * T(0.70710678118654752440)));
    case Activation::gelu_tanh: {
      const T u = T(0.79788456080286535588) * (x + T(0.044715) * x * x * x);
      return div_(x, T(1) + exp_(T(-2) * u));
    }
    case Activation::silu:
      return div_(x, T(1) + exp_(-x));
    case Activation::identity:
      return x;
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
      const T s = div_(T(1), T(1) + exp_(T(-2) * k * (x + c * x * x * x)));  // σ(2u)
      return s + x * s * (T(1) - s) * T(2) * k * (T(1) + T(3) * c * x * x);
    }
    case Activation::silu: {
      const T s = div_(T(1), T(1) + exp_(-x));
      return s * (T(1) + x * (T(1) - s));
    }
    case Activation::identity:
      return T(1);
  }
  return T(1);
}

// value and grad together (backward kernels recompute the forward for dW2): the
// sigmoid or erf is evaluated once. Same formulas as value() and grad().
template <class T>
FFN_HD void value_grad(T x, Activation a, T& v, T& g) {
  switch (a) {
    case Activation::gelu_erf: {
      const T cdf = T(0.5) * (T(1) + erf_(x * T(0.70710678118654752440)));
      v = x * cdf;
      g = cdf + x * T(0.39894228040143267794) * exp_(T(-0.5) * x * x);
      return;
    }
    case Activation::gelu_tanh: {
      const T k = T(0.79788456080286535588), c = T(0.044715);
      const T e = exp_(T(-2) * k * (x + c * x * x * x));
      const T s = div_(T(1), T(1) + e);
      v = div_(x, T(1) + e);
      g = s + x * s * (T(1) - s) * T(2) * k * (T(1) + T(3) * c * x * x);
      return;
    }
    case Activation::silu: {
      const T e = exp_(-x);
      const T s = div_(T(1), T(1) + e);
      v = div_(x, T(1) + e);
      g = s * (T(1) + x * (T(1) - s));
      return;
    }
    case Activation::identity:
      break;
  }
  v = x;
  g = T(1);
}

}  // namespace act_math
}  // namespace ffn
