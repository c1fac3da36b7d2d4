#include <loom/core/dtype.h>

namespace loom {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i64: return "i64";
    case DType::i32: return "i32";
    case DType::u8: return "u8";
  }
  return "?";
}

DType parse_dtype(const std::string& name) {
  if (name == "f32" || name == "float32" || name == "float") return DType::f32;
  if (name == "f64" || name == "float64" || name == "double") return DType::f64;
  if (name == "f16" || name == "float16" || name == "half") return DType::f16;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  if (name == "i64" || name == "int64") return DType::i64;
  if (name == "i32" || name == "int32") return DType::i32;
  if (name == "u8" || name == "uint8") return DType::u8;
  LOOM_FAIL("unknown dtype '", name, "'; expected one of f32, f64, f16, bf16, i64, i32, u8");
}

}  // namespace loom
