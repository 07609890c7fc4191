#include "corelm/random.h"

#include <cmath>

namespace corelm {

namespace {
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

void Generator::manual_seed(uint64_t seed) {
  uint64_t x = seed;
  for (auto& word : s_) word = splitmix64(x);
  has_spare_ = false;
}

uint64_t Generator::next_u64() {
  uint64_t result = rotl(s_[1] * 5, 7) * 9;
  uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

float Generator::uniform() { return static_cast<float>(next_u64() >> 40) * (1.0f / 16777216.0f); }

float Generator::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  // Box-Muller in double for accuracy; u1 in (0, 1] so log is finite.
  double u1 = (static_cast<double>(next_u64() >> 11) + 1.0) * (1.0 / 9007199254740992.0);
  double u2 = static_cast<double>(next_u64() >> 11) * (1.0 / 9007199254740992.0);
  double r = std::sqrt(-2.0 * std::log(u1));
  double a = 2.0 * M_PI * u2;
  spare_ = static_cast<float>(r * std::sin(a));
  has_spare_ = true;
  return static_cast<float>(r * std::cos(a));
}

uint64_t Generator::below(uint64_t n) {
  if (n <= 1) return 0;
  uint64_t limit = UINT64_MAX - UINT64_MAX % n;  // rejection keeps it unbiased
  uint64_t x;
  do {
    x = next_u64();
  } while (x >= limit);
  return x % n;
}

Generator::State Generator::state() const {
  State st{};
  for (int i = 0; i < 4; ++i) st.s[i] = s_[i];
  st.has_spare = has_spare_;
  st.spare = spare_;
  return st;
}

void Generator::set_state(const State& st) {
  for (int i = 0; i < 4; ++i) s_[i] = st.s[i];
  has_spare_ = st.has_spare;
  spare_ = st.spare;
}

}  // namespace corelm
