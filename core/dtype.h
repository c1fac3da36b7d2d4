// Element types: f32, f64, f16, bf16, i64, i32, u8, and the 16-bit float
// conversions shared by the CPU and CUDA code.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include <loom/core/error.h>
#include <loom/core/host_device.h>

namespace loom {

enum class DType : uint8_t { f32, f64, f16, bf16, i64, i32, u8 };

constexpr size_t element_size(DType t) {
  switch (t) {
    case DType::f64:
    case DType::i64: return 8;
    case DType::f32:
    case DType::i32: return 4;
    case DType::f16:
    case DType::bf16: return 2;
    case DType::u8: return 1;
  }
  return 0;
}

constexpr bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16;
}

const char* dtype_name(DType t);
// Parses "f32", "float32", "f16", "half", "bf16", "bfloat16", ... ; throws otherwise.
DType parse_dtype(const std::string& name);

// IEEE binary16, stored as bits; arithmetic goes through float.
struct Half {
  uint16_t bits = 0;
  Half() = default;
  LOOM_HOST_DEVICE explicit Half(float value);
  LOOM_HOST_DEVICE operator float() const;
};

// bfloat16: the top half of an f32, rounded to nearest even.
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  LOOM_HOST_DEVICE explicit BFloat16(float value);
  LOOM_HOST_DEVICE operator float() const;
};
static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2);

LOOM_HOST_DEVICE inline uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
LOOM_HOST_DEVICE inline float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

LOOM_HOST_DEVICE inline BFloat16::BFloat16(float value) {
  uint32_t u = float_bits(value);
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN stays a quiet NaN
    bits = static_cast<uint16_t>((u >> 16) | 0x40u);
    return;
  }
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  bits = static_cast<uint16_t>((u + rounding) >> 16);
}
LOOM_HOST_DEVICE inline BFloat16::operator float() const { return bits_float(static_cast<uint32_t>(bits) << 16); }

LOOM_HOST_DEVICE inline Half::Half(float value) {
  uint32_t u = float_bits(value);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) {  // NaN
    bits = static_cast<uint16_t>(sign | 0x7e00u);
  } else if (abs >= 0x477ff000u) {  // rounds to >= 65520: infinity
    bits = static_cast<uint16_t>(sign | 0x7c00u);
  } else if (abs < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    // Scale into the subnormal grid (units of 2^-24) with round-to-nearest-even
    // by adding 0.5 in float arithmetic, which rounds to even.
    float magnitude = bits_float(abs);
    float scaled = magnitude * 16777216.0f;  // 2^24
    uint32_t q = static_cast<uint32_t>(scaled);
    float remainder = scaled - static_cast<float>(q);
    if (remainder > 0.5f || (remainder == 0.5f && (q & 1u))) ++q;
    bits = static_cast<uint16_t>(sign | q);
  } else {
    uint32_t mantissa_odd = (abs >> 13) & 1u;
    abs += 0xc8000fffu + mantissa_odd;  // rebias exponent (-112 << 23) and round to nearest even
    bits = static_cast<uint16_t>(sign | (abs >> 13));
  }
}

LOOM_HOST_DEVICE inline Half::operator float() const {
  uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {
    // zero or subnormal: mantissa * 2^-24
    float f = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -f : f;
  }
  if (exponent == 31) return bits_float(sign | 0x7f800000u | (mantissa << 13));
  return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// The C++ type of each dtype, for templated kernels.
template <DType T> struct CppType;
template <> struct CppType<DType::f32> { using type = float; };
template <> struct CppType<DType::f64> { using type = double; };
template <> struct CppType<DType::f16> { using type = Half; };
template <> struct CppType<DType::bf16> { using type = BFloat16; };
template <> struct CppType<DType::i64> { using type = int64_t; };
template <> struct CppType<DType::i32> { using type = int32_t; };
template <> struct CppType<DType::u8> { using type = uint8_t; };

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }
template <> constexpr DType dtype_of<Half>() { return DType::f16; }
template <> constexpr DType dtype_of<BFloat16>() { return DType::bf16; }
template <> constexpr DType dtype_of<int64_t>() { return DType::i64; }
template <> constexpr DType dtype_of<int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::u8; }

// Calls fn.template operator()<T>() with T the C++ type of `t`:
//   visit_dtype(t, [&]<class T>() { ... });
template <class Fn>
decltype(auto) visit_dtype(DType t, Fn&& fn) {
  switch (t) {
    case DType::f32: return fn.template operator()<float>();
    case DType::f64: return fn.template operator()<double>();
    case DType::f16: return fn.template operator()<Half>();
    case DType::bf16: return fn.template operator()<BFloat16>();
    case DType::i64: return fn.template operator()<int64_t>();
    case DType::i32: return fn.template operator()<int32_t>();
    case DType::u8: return fn.template operator()<uint8_t>();
  }
  LOOM_FAIL("unknown dtype");
}

// The same, restricted to the types CPU math kernels compute in (f32, f64);
// `op` names the operation in the error for anything else.
template <class Fn>
decltype(auto) visit_compute_dtype(DType t, const char* op, Fn&& fn) {
  switch (t) {
    case DType::f32: return fn.template operator()<float>();
    case DType::f64: return fn.template operator()<double>();
    default: LOOM_FAIL(op, ": expected an f32 or f64 tensor, got ", dtype_name(t));
  }
}

}  // namespace loom
