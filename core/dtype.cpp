// core/dtype.cpp — names of element types.
#include "core/dtype.h"

#include "core/error.h"

namespace ffn {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f64:
      return "f64";
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::i32:
      return "i32";
  }
  return "?";
}

DType parse_dtype(const std::string& s) {
  if (s == "f64" || s == "float64" || s == "fp64") return DType::f64;
  if (s == "f32" || s == "float32" || s == "fp32") return DType::f32;
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  if (s == "f16" || s == "float16" || s == "fp16") return DType::f16;
  if (s == "i32" || s == "int32") return DType::i32;
  FFN_THROW("[dtype] unknown dtype '", s, "' (expected f64, f32, bf16, f16 or i32)");
}

}  // namespace ffn
