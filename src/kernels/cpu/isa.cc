// CPU feature detection for the kernel dispatch (include/corelm/isa.h).
#include "corelm/isa.h"

#include <atomic>
#include <cpuid.h>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <sys/syscall.h>
#include <unistd.h>

#include "corelm/error.h"

namespace corelm {
namespace {

struct CpuidRegs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

CpuidRegs cpuid(unsigned leaf, unsigned sub) {
  CpuidRegs r;
  __cpuid_count(leaf, sub, r.a, r.b, r.c, r.d);
  return r;
}

uint64_t xgetbv0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

bool request_tile_state() {
  constexpr long kArchReqXcompPerm = 0x1023;  // arch_prctl code (asm/prctl.h)
  constexpr long kXfeatureTileData = 18;      // XFEATURE_XTILEDATA
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureTileData) == 0;
}

Isa detect() {
  if (__get_cpuid_max(0, nullptr) < 7) return Isa::Reference;
  const CpuidRegs l1 = cpuid(1, 0);
  const bool osxsave = l1.c & (1u << 27), fma = l1.c & (1u << 12);
  if (!osxsave) return Isa::Reference;
  const uint64_t xcr0 = xgetbv0();
  const bool os_avx = (xcr0 & 0x6) == 0x6;             // XMM + YMM state
  const bool os_avx512 = (xcr0 & 0xE6) == 0xE6;        // + opmask, ZMM_Hi256, Hi16_ZMM
  const bool os_amx = (xcr0 & 0x60000) == 0x60000;     // XTILECFG + XTILEDATA
  const CpuidRegs l7 = cpuid(7, 0), l7s1 = cpuid(7, 1);
  const bool avx2 = l7.b & (1u << 5);
  const bool avx512f = l7.b & (1u << 16), avx512bw = l7.b & (1u << 30), avx512vl = l7.b & (1u << 31);
  const bool avx512dq = l7.b & (1u << 17);
  const bool avx512bf16 = l7s1.a & (1u << 5);
  const bool avx512vnni = l7.c & (1u << 11);
  const bool amx_bf16 = l7.d & (1u << 22), amx_tile = l7.d & (1u << 24);
  if (!(os_avx && avx2 && fma)) return Isa::Reference;
  if (!(os_avx512 && avx512f && avx512bw && avx512vl && avx512dq)) return Isa::Avx2;
  if (!(avx512bf16 && avx512vnni)) return Isa::Avx512;
  const bool amx_int8 = l7.d & (1u << 25);
  if (!(os_amx && amx_bf16 && amx_int8 && amx_tile)) return Isa::Avx512Bf16;
  // Linux (5.16+) hands out the 8 KiB tile data state per process on request; without the grant
  // the first tile instruction faults, so a refusal means the AVX-512 BF16 path.
  return request_tile_state() ? Isa::Amx : Isa::Avx512Bf16;
}

Isa env_capped(Isa detected) {
  const char* env = std::getenv("CORELM_ISA");
  if (!env || !*env) return detected;
  const Isa want = parse_isa(env);
  return static_cast<int>(want) < static_cast<int>(detected) ? want : detected;
}

std::atomic<int>& active_slot() {
  static std::atomic<int> slot{static_cast<int>(env_capped(detected_isa()))};
  return slot;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Reference: return "reference";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
    case Isa::Avx512Bf16: return "avx512_bf16";
    case Isa::Amx: return "amx";
  }
  return "unknown";
}

Isa parse_isa(std::string_view name) {
  for (int i = 0; i <= static_cast<int>(Isa::Amx); ++i)
    if (name == isa_name(static_cast<Isa>(i))) return static_cast<Isa>(i);
  throw ValueError("unknown ISA '" + std::string(name) +
                   "' (CORELM_ISA): expected reference, avx2, avx512, avx512_bf16 or amx");
}

Isa detected_isa() {
  static const Isa isa = detect();
  return isa;
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (int i = 0; i <= static_cast<int>(detected_isa()); ++i) out.push_back(static_cast<Isa>(i));
  return out;
}

Isa active_isa() { return static_cast<Isa>(active_slot().load(std::memory_order_relaxed)); }

void set_active_isa(Isa isa) {
  CORELM_CHECK(static_cast<int>(isa) <= static_cast<int>(detected_isa()), ValueError, "set_active_isa: ",
               isa_name(isa), " is not supported by this CPU (best: ", isa_name(detected_isa()), ")");
  active_slot().store(static_cast<int>(isa), std::memory_order_relaxed);
}

}  // namespace corelm
