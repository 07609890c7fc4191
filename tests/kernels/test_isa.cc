// ISA detection, names, the scoped override, and the CORELM_ISA environment cap (checked in a
// child process, since the variable is read once per process).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>

#include "corelm/error.h"
#include "corelm/isa.h"
#include "kernels/kernel_test_util.h"

namespace corelm::testing {
namespace {

TEST(Isa, NamesRoundTrip) {
  for (int i = 0; i <= static_cast<int>(Isa::Amx); ++i) {
    const Isa isa = static_cast<Isa>(i);
    EXPECT_EQ(parse_isa(isa_name(isa)), isa);
  }
}

TEST(Isa, BadNameListsTheChoices) {
  try {
    parse_isa("avx513");
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("avx513"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("avx512_bf16"), std::string::npos);
  }
  EXPECT_THROW(parse_isa(""), ValueError);
  EXPECT_THROW(parse_isa("AVX2"), ValueError);  // names are exact, lower case
}

TEST(Isa, SupportedPathsRunFromReferenceToDetected) {
  const auto paths = supported_isas();
  ASSERT_FALSE(paths.empty());
  EXPECT_EQ(paths.front(), Isa::Reference);
  EXPECT_EQ(paths.back(), detected_isa());
  EXPECT_EQ(paths.size(), static_cast<size_t>(detected_isa()) + 1);
}

TEST(Isa, ScopedIsaRestores) {
  const Isa before = active_isa();
  {
    ScopedIsa s(Isa::Reference);
    EXPECT_EQ(active_isa(), Isa::Reference);
  }
  EXPECT_EQ(active_isa(), before);
}

TEST(Isa, UnsupportedPathIsRefused) {
  if (detected_isa() == Isa::Amx) GTEST_SKIP() << "this CPU supports every path";
  EXPECT_THROW(set_active_isa(static_cast<Isa>(static_cast<int>(detected_isa()) + 1)), ValueError);
}

// Helper for the environment test: prints the path this process runs.
TEST(IsaEnvChild, PrintActive) { std::printf("ACTIVE_ISA=%s\n", isa_name(active_isa())); }

std::string run_child(const std::string& env_value) {
  const std::string cmd = "CORELM_ISA=" + env_value +
                          " /proc/" + std::to_string(getpid()) + "/exe --gtest_filter=IsaEnvChild.PrintActive 2>&1";
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[512];
    while (fgets(buf, sizeof buf, p)) out += buf;
    pclose(p);
  }
  return out;
}

TEST(IsaEnv, CapsTheActivePath) {
  EXPECT_NE(run_child("reference").find("ACTIVE_ISA=reference"), std::string::npos);
  if (detected_isa() >= Isa::Avx2) {
    EXPECT_NE(run_child("avx2").find("ACTIVE_ISA=avx2"), std::string::npos);
  }
  // A cap above the CPU's best is clamped to it.
  EXPECT_NE(run_child("amx").find(std::string("ACTIVE_ISA=") + isa_name(detected_isa())), std::string::npos);
}

TEST(IsaEnv, BadValueIsAClearError) {
  const std::string out = run_child("sse9");
  EXPECT_EQ(out.find("ACTIVE_ISA="), std::string::npos) << out;
  EXPECT_NE(out.find("unknown ISA 'sse9'"), std::string::npos) << out;
}

}  // namespace
}  // namespace corelm::testing
