// core/dispatch.h — run a generic lambda/body for a tensor's element type.
//
//   FFN_DISPATCH_ALL(t.dtype(), "op", [&]<class T>() { ... });    // f64, f32, bf16, f16
//   FFN_DISPATCH_ANY(t.dtype(), "op", [&]<class T>() { ... });    // those and i32 (copies)
//   FFN_DISPATCH_FLOAT(t.dtype(), "op", [&]<class T>() { ... });  // f64, f32 only
//
// Unsupported dtypes throw an error naming the op.
#pragma once

#include <utility>

#include "core/dtype.h"
#include "core/error.h"

namespace ffn::detail {

template <class F>
decltype(auto) dispatch_all(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::f64:
      return f.template operator()<double>();
    case DType::f32:
      return f.template operator()<float>();
    case DType::bf16:
      return f.template operator()<bf16>();
    case DType::f16:
      return f.template operator()<f16>();
    default:
      break;
  }
  FFN_THROW("[", op, "] dtype ", dtype_name(dt), " is not supported here (expected a float type)");
}

template <class F>
decltype(auto) dispatch_any(DType dt, const char* op, F&& f) {
  if (dt == DType::i32) return f.template operator()<int32_t>();
  return dispatch_all(dt, op, std::forward<F>(f));
}

template <class F>
decltype(auto) dispatch_float(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::f64:
      return f.template operator()<double>();
    case DType::f32:
      return f.template operator()<float>();
    default:
      break;
  }
  FFN_THROW("[", op, "] dtype ", dtype_name(dt), " is not supported here (expected f64 or f32)");
}

// Value conversion between element types; 16-bit floats go through float.
template <class To, class From>
FFN_HD To cast_value(From v) {
  if constexpr (std::is_same_v<From, bf16> || std::is_same_v<From, f16>) {
    return cast_value<To>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, bf16> || std::is_same_v<To, f16>) {
    return To(static_cast<float>(v));
  } else {
    return static_cast<To>(v);
  }
}

}  // namespace ffn::detail

#define FFN_DISPATCH_ALL(dt, op, ...) ::ffn::detail::dispatch_all(dt, op, __VA_ARGS__)
#define FFN_DISPATCH_ANY(dt, op, ...) ::ffn::detail::dispatch_any(dt, op, __VA_ARGS__)
#define FFN_DISPATCH_FLOAT(dt, op, ...) ::ffn::detail::dispatch_float(dt, op, __VA_ARGS__)
