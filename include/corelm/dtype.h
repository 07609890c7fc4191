// Element types and the float <-> bf16/f16 conversions (round-to-nearest-even, NaN kept NaN).
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

namespace corelm {

enum class DType : uint8_t { F32, BF16, F16, I32, I64, I8, U8 };

size_t dtype_size(DType dt);
const char* dtype_name(DType dt);          // "f32", "bf16", ...
DType dtype_from_name(const std::string& name);  // throws ValueError on unknown names
bool is_floating(DType dt);

// Storage formats for the 16-bit floats: plain bit patterns so they are trivially copyable.
struct bf16 { uint16_t bits; };
struct f16 { uint16_t bits; };

inline float bf16_to_float(bf16 v) {
  uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline bf16 float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x40)};  // quiet NaN
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);  // ties go to the even bf16
  return bf16{static_cast<uint16_t>((u + rounding) >> 16)};
}

float f16_to_float(f16 v);
f16 float_to_f16(float f);

template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::F32; }
template <> constexpr DType dtype_of<bf16>() { return DType::BF16; }
template <> constexpr DType dtype_of<f16>() { return DType::F16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::I32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::I64; }
template <> constexpr DType dtype_of<int8_t>() { return DType::I8; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::U8; }

}  // namespace corelm
