// Runtime instruction-set dispatch. The best path the CPU and OS support is detected once (CPUID +
// XGETBV); CORELM_ISA=<name> caps it (e.g. CORELM_ISA=reference runs the scalar reference kernels,
// CORELM_ISA=avx2 the AVX2 ones) so tests can run every path this machine supports. Every path
// passes the same contract tests; faster paths are selected by default.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace corelm {

// Ordered: a path implies the ones before it are usable too.
enum class Isa : int { Reference = 0, Avx2 = 1, Avx512 = 2, Avx512Bf16 = 3, Amx = 4 };

const char* isa_name(Isa isa);          // "reference", "avx2", "avx512", "avx512_bf16", "amx"
Isa parse_isa(std::string_view name);   // ValueError listing the names
Isa detected_isa();                     // best path this CPU + OS supports
std::vector<Isa> supported_isas();      // Reference .. detected_isa(), in order
// The path kernels use now: detected_isa() capped by $CORELM_ISA (read once), unless changed by
// set_active_isa. A cap above what the CPU supports is clamped to detected_isa().
Isa active_isa();
void set_active_isa(Isa isa);           // ValueError if the CPU does not support it

// Sets the active path for a scope (tests iterate over supported_isas()).
class ScopedIsa {
 public:
  explicit ScopedIsa(Isa isa) : saved_(active_isa()) { set_active_isa(isa); }
  ~ScopedIsa() { set_active_isa(saved_); }
  ScopedIsa(const ScopedIsa&) = delete;
  ScopedIsa& operator=(const ScopedIsa&) = delete;

 private:
  Isa saved_;
};

}  // namespace corelm
