#include "corelm/dtype.h"

#include "corelm/error.h"

namespace corelm {

size_t dtype_size(DType dt) {
  switch (dt) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::I8: return 1;
    case DType::U8: return 1;
  }
  throw DTypeError("unknown dtype");
}

const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::I8: return "i8";
    case DType::U8: return "u8";
  }
  return "?";
}

DType dtype_from_name(const std::string& name) {
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64, DType::I8, DType::U8})
    if (name == dtype_name(dt)) return dt;
  throw ValueError("unknown dtype '" + name + "' (expected f32, bf16, f16, i32, i64, i8 or u8)");
}

bool is_floating(DType dt) { return dt == DType::F32 || dt == DType::BF16 || dt == DType::F16; }

// IEEE binary16 conversions written out bit by bit so they do not depend on compiler support
// for _Float16; rounding is to nearest even, like the hardware conversions.
float f16_to_float(f16 v) {
  uint32_t sign = static_cast<uint32_t>(v.bits & 0x8000u) << 16;
  uint32_t exp = (v.bits >> 10) & 0x1fu;
  uint32_t mant = v.bits & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        mant <<= 1;
        ++e;
      } while ((mant & 0x400u) == 0);
      u = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

f16 float_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return f16{static_cast<uint16_t>(sign | 0x7e00u)};  // NaN
  if (abs >= 0x477ff000u) return f16{static_cast<uint16_t>(sign | 0x7c00u)};  // rounds to inf
  if (abs < 0x38800000u) {  // result is subnormal or zero in f16
    if (abs < 0x33000000u) return f16{static_cast<uint16_t>(sign)};  // below half the smallest subnormal
    uint32_t exp = abs >> 23;
    uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exp;  // so that the value is mant >> (shift) in units of 2^-24
    uint32_t half_mant = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_mant & 1u))) ++half_mant;
    return f16{static_cast<uint16_t>(sign | half_mant)};
  }
  uint32_t exp = (abs >> 23) - 127 + 15;
  uint32_t mant = abs & 0x7fffffu;
  uint32_t h = (exp << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // carry may roll into the exponent: correct
  return f16{static_cast<uint16_t>(sign | h)};
}

}  // namespace corelm
