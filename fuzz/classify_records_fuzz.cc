// libFuzzer target: the labelled-record reader of `corelm train --task classify`
// (read_classify_texts), with a teacher field (--teacher-field, distillation) read too. Any bytes
// either read as records -- every label an index into the three labels, every teacher
// distribution three finite probabilities in [0, 1] summing to 1 -- or are refused with a
// corelm::Error; no crash, no other exception. Seeds: fuzz/seeds/classify.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "corelm/error.h"
#include "corelm/train.h"
#include "fuzz_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = corelm::fuzz::write_input(data, size, ".jsonl");
  corelm::train::ClassifyDataOptions o;
  o.labels = {"a", "b", "1"};
  o.teacher_field = (size % 2 == 0) ? "t" : "";
  try {
    for (const auto& r : corelm::train::read_classify_texts(path, o)) {
      if (r.label < 0 || r.label >= 3) __builtin_trap();
      if (o.teacher_field.empty() != r.teacher.empty()) __builtin_trap();
      if (r.teacher.empty()) continue;
      if (r.teacher.size() != 3) __builtin_trap();
      double sum = 0;
      for (float p : r.teacher) {
        if (!std::isfinite(p) || p < 0 || p > 1.0001f) __builtin_trap();
        sum += p;
      }
      if (std::abs(sum - 1) > 1e-4) __builtin_trap();
    }
  } catch (const corelm::Error&) {
  }
  return 0;
}
