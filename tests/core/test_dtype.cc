#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "corelm/dtype.h"
#include "corelm/error.h"

using namespace corelm;

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_EQ(dtype_size(DType::I64), 8u);
  EXPECT_EQ(dtype_from_name("bf16"), DType::BF16);
  EXPECT_THROW(dtype_from_name("f8"), ValueError);
}

// bf16 keeps the top 16 bits; rounding to nearest even must be exact on ties.
TEST(DType, Bf16RoundsToNearestEven) {
  auto bits = [](float f) { return float_to_bf16(f).bits; };
  EXPECT_EQ(bits(1.0f), 0x3f80);
  uint32_t tie_even = 0x3f808000u;  // exactly halfway between 0x3f80 and 0x3f81: stays even
  uint32_t tie_odd = 0x3f818000u;   // halfway between 0x3f81 and 0x3f82: rounds up to even
  uint32_t above = 0x3f808001u;
  float f;
  std::memcpy(&f, &tie_even, 4);
  EXPECT_EQ(bits(f), 0x3f80);
  std::memcpy(&f, &tie_odd, 4);
  EXPECT_EQ(bits(f), 0x3f82);
  std::memcpy(&f, &above, 4);
  EXPECT_EQ(bits(f), 0x3f81);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(bf16_to_float(float_to_bf16(std::numeric_limits<float>::infinity()))));
}

// Every f16 bit pattern survives f16 -> f32 -> f16 (NaNs stay NaN).
TEST(DType, F16ExhaustiveRoundTrip) {
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    f16 h{static_cast<uint16_t>(b)};
    float f = f16_to_float(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(f))));
      continue;
    }
    ASSERT_EQ(float_to_f16(f).bits, h.bits) << "pattern " << b;
  }
}

TEST(DType, F16RoundingAndRange) {
  EXPECT_EQ(f16_to_float(float_to_f16(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(f16_to_float(float_to_f16(65520.0f))));   // rounds up past max
  EXPECT_EQ(f16_to_float(float_to_f16(65519.0f)), 65504.0f);
  EXPECT_EQ(f16_to_float(float_to_f16(5.9604645e-8f)), 5.9604645e-8f);  // smallest subnormal
  EXPECT_EQ(f16_to_float(float_to_f16(2.0e-8f)), 0.0f);
  // 1 + 2^-11 is halfway between 1 and the next f16: ties to even (1.0).
  EXPECT_EQ(f16_to_float(float_to_f16(1.0f + 1.0f / 2048)), 1.0f);
  EXPECT_EQ(f16_to_float(float_to_f16(1.0f + 3.0f / 2048)), 1.0f + 2.0f / 1024);
}
