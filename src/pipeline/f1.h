// The harmonic mean of precision and recall (0 when both are 0): per-label F1, token F1 and
// entity F1 of `corelm eval-task`.
#pragma once

namespace corelm::pipeline {

inline double f1_of(double precision, double recall) {
  return precision + recall > 0 ? 2 * precision * recall / (precision + recall) : 0;
}

}  // namespace corelm::pipeline
