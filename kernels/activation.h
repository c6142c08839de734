// kernels/activation.h — scalar activation math shared by the CPU references and
// the CUDA kernels (host/device), so both compute the same formulas.
//
//   gelu_erf(x)  = x/2 · (1 + erf(x/√2))  (float: x·Φ(x) by an erfc, Note [erfc GELU])
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

// exp and a/b; on the GPU the float versions use the hardware units: ex2.approx and
// rcp.approx, as __expf (relative error ~2⁻²¹·(2 + 1.2|x|)) and __fdividef (2 ulp) do, but
// in their .ftz forms: without it each call also carries the denormal range fix-ups (a
// compare and two predicated multiplies per exp, four more instructions per reciprocal),
// which the activation warpgroups of the fused GEMM spend their time on (Note [Activation
// warpgroup]). A result below 2⁻¹²⁶ (an exp of x < -87, a quotient by more than 2¹²⁶)
// becomes 0. Every use below is a sigmoid 1/(1 + e) or an erfc tail, where the errors stay
// relative.
FFN_HD float exp_(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.44269504088896340736f));
  return y;
#else
  return expf(x);
#endif
}
FFN_HD double exp_(double x) {
  return exp(x);
}
FFN_HD float div_(float a, float b) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(b));
  return a * r;
#else
  return a / b;
#endif
}
FFN_HD double div_(double a, double b) {
  return a / b;
}
// div_(a, b) given r = div_(1, b): on the GPU that is a times the same reciprocal, so a·r is
// bit for bit div_(a, b), with one reciprocal where two calls of the asm made two (ptxas does
// not merge them); elsewhere a / b.
FFN_HD float div_shared(float a, float b, float r) {
#if defined(__CUDA_ARCH__)
  (void)b;
  return a * r;
#else
  (void)r;
  return a / b;
#endif
}
FFN_HD double div_shared(double a, double b, double) {
  return a / b;
}

// Note [erfc GELU]: gelu_erf in float is x·Φ(x) with Φ(-|x|) = erfc(a)/2, a = |x|/√2, from
// Numerical Recipes' erfc: t = 1/(1 + a/2), erfc(a) = t·exp(-a² + P(t)) with a degree-9 P
// (fractional error < 1.2e-7 for every a ≥ 0). Against 0.5·x·(1 + erff(x/√2)) it has no
// cancellation for negative x (relative error ~1e-6 there instead of ~5e-5) and costs about
// two thirds of the instructions: one reciprocal, one exp and nine FMAs, and the derivative's
// pdf shares a. This is what the fused GEMM's activation warpgroups spend their time on
// (Note [Activation warpgroup]). CPU reference, unfused kernels and GEMM epilogues all call
// these functions, so fused and unfused outputs stay bit-identical. double: 0.5·erfc(-x/√2).
FFN_HD float erfc_half_tail(float x) {  // Φ(-|x|)
  const float a = fabsf(x) * 0.70710678118654752440f;
  const float t = div_(1.0f, fmaf(0.5f, a, 1.0f));
  float p = 0.17087277f;
  p = fmaf(p, t, -0.82215223f);
  p = fmaf(p, t, 1.48851587f);
  p = fmaf(p, t, -1.13520398f);
  p = fmaf(p, t, 0.27886807f);
  p = fmaf(p, t, -0.18628806f);
  p = fmaf(p, t, 0.09678418f);
  p = fmaf(p, t, 0.37409196f);
  p = fmaf(p, t, 1.00002368f);
  p = fmaf(p, t, -1.26551223f);
  return 0.5f * t * exp_(fmaf(-a, a, p));
}
FFN_HD float gelu_erf_cdf(float x) {  // Φ(x)
  const float q = erfc_half_tail(x);
  return x < 0.0f ? q : 1.0f - q;
}
FFN_HD double gelu_erf_cdf(double x) {
  return 0.5 * erfc(x * -0.70710678118654752440);
}

// gelu_tanh(x) = x/2·(1 + tanh(u)) = x·σ(2u), u = √(2/π)·(x + 0.044715·x³): the sigmoid
// form has no cancellation for negative x and costs one exp.
template <class T>
FFN_HD T value(T x, Activation a) {
  switch (a) {
    case Activation::gelu_erf:
      return x * gelu_erf_cdf(x);
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
      const T cdf = gelu_erf_cdf(x);
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
      const T cdf = gelu_erf_cdf(x);
      v = x * cdf;
      g = cdf + x * (T(0.39894228040143267794) * exp_(T(-0.5) * x * x));
      return;
    }
    case Activation::gelu_tanh: {
      const T k = T(0.79788456080286535588), c = T(0.044715);
      const T e = exp_(T(-2) * k * (x + c * x * x * x));
      const T s = div_(T(1), T(1) + e);
      v = div_shared(x, T(1) + e, s);
      g = s + x * s * (T(1) - s) * T(2) * k * (T(1) + T(3) * c * x * x);
      return;
    }
    case Activation::silu: {
      const T e = exp_(-x);
      const T s = div_(T(1), T(1) + e);
      v = div_shared(x, T(1) + e, s);
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
