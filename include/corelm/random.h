// Seeded, portable random numbers (no std:: distributions, whose output differs between
// standard libraries): the same seed gives the same stream on every platform.
#pragma once
#include <cstdint>

namespace corelm {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) { manual_seed(seed); }
  void manual_seed(uint64_t seed);
  uint64_t next_u64();           // xoshiro256**
  float uniform();               // [0, 1) with 24 random bits
  float normal();                // Box-Muller, standard normal
  uint64_t below(uint64_t n);    // uniform integer in [0, n), unbiased

  // Full state, for checkpoints that resume exactly.
  struct State { uint64_t s[4]; bool has_spare; float spare; };
  State state() const;
  void set_state(const State& st);

 private:
  uint64_t s_[4];
  bool has_spare_ = false;
  float spare_ = 0.0f;
};

}  // namespace corelm
