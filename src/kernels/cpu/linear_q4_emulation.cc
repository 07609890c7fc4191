// The AVX-512 VNNI q4 kernel's template (linear_q4_tiles.h, same tile shapes) instantiated on
// 16-lane vectors written out in plain C++, compiled for baseline x86-64. The development VM has no
// AVX-512, so this is how the 16-lane indexing, masks and tile loops of that kernel run in tests
// here; only the one-line intrinsic mappings of avx512_bf16/linear_q4.cc are left unexercised.
// vpdpbusd per the Intel SDM: each int32 lane adds the 4 products of its u8 bytes of the first
// operand and the s8 bytes of the second (here exact: a block's sums are far from int32 limits).
//
// Built without optimization: at -O2 GCC spends minutes fully unrolling the tiles' loops over
// these array-backed "registers", and the tests that use this run small shapes.
#pragma GCC optimize("O0")
#include <cmath>
#include <cstring>

#include "corelm/dtype.h"
#include "kernels/cpu/linear_q4_tiles.h"

namespace corelm::kernels::vnni_emulated {
namespace {

struct Emulated16 {
  static constexpr int kLanes = 16;
  struct I {
    uint8_t b[64];
    int32_t lane(int l) const {
      int32_t v;
      std::memcpy(&v, b + 4 * l, 4);
      return v;
    }
  };
  struct IAcc {
    int32_t v[16];
  };
  struct F {
    float v[16];
  };
  static I load_codes(const uint8_t* p) {
    I r;
    std::memcpy(r.b, p, 64);
    return r;
  }
  static I low(I r) {
    for (uint8_t& x : r.b) x &= 0x0f;
    return r;
  }
  // vpsrlw by 4 then vpand 0x0f: each byte's high nibble (bits shifted in from the neighbour are masked off).
  static I high(I r) {
    for (uint8_t& x : r.b) x = static_cast<uint8_t>((x >> 4) & 0x0f);
    return r;
  }
  static IAcc acc_zero() { return IAcc{}; }
  static IAcc dot(IAcc acc, const I& codes, int32_t x4) {
    int8_t x[4];
    std::memcpy(x, &x4, 4);
    for (int l = 0; l < 16; ++l)
      for (int e = 0; e < 4; ++e) acc.v[l] += int32_t{codes.b[4 * l + e]} * int32_t{x[e]};
    return acc;
  }
  static I finish(const IAcc& acc) {
    I r;
    std::memcpy(r.b, acc.v, 64);
    return r;
  }
  static F cvt(const I& v) {
    F r;
    for (int l = 0; l < 16; ++l) r.v[l] = static_cast<float>(v.lane(l));
    return r;
  }
  static I sub_i32(I v, int32_t s) {
    for (int l = 0; l < 16; ++l) {
      const int32_t x = v.lane(l) - s;
      std::memcpy(v.b + 4 * l, &x, 4);
    }
    return v;
  }
  static F load_f16(const uint16_t* p) {  // vcvtph2ps: exact
    F r;
    for (int l = 0; l < 16; ++l) r.v[l] = f16_to_float(f16{p[l]});
    return r;
  }
  static F set1(float x) {
    F r;
    for (float& v : r.v) v = x;
    return r;
  }
  static F zero() { return set1(0.0f); }
  static F mul(F a, const F& b) {
    for (int l = 0; l < 16; ++l) a.v[l] = a.v[l] * b.v[l];
    return a;
  }
  static F add(F a, const F& b) {
    for (int l = 0; l < 16; ++l) a.v[l] = a.v[l] + b.v[l];
    return a;
  }
  static F fmadd(const F& a, const F& b, F c) {
    for (int l = 0; l < 16; ++l) c.v[l] = std::fma(a.v[l], b.v[l], c.v[l]);
    return c;
  }
  static F load_n(const float* p, int n) {  // masked load: lanes past n read nothing
    F r = zero();
    for (int l = 0; l < n; ++l) r.v[l] = p[l];
    return r;
  }
  static void store_n(float* p, const F& v, int n) {
    for (int l = 0; l < n; ++l) p[l] = v.v[l];
  }
};

}  // namespace

void linear_q4_block(const LinearQ4Args& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  q4_block_vnni_shapes<Emulated16>(a, m0, m1, p0, p1);
}

}  // namespace corelm::kernels::vnni_emulated
