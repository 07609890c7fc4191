// Runs the AMX tile kernels on any CPU with emulated tiles (tile_emulation.cc), for tests: the
// kernels' loops, packing offsets and padding are checked against the reference contract on
// machines without AMX, and against the hardware on machines with it. Not for production use
// (scalar and slow).
#pragma once
#include <cstdint>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/linear_int8.h"

namespace corelm::kernels {

// pack_linear_bf16 / pack_linear_int8 for an explicit kernel without the check that this CPU
// runs it (packing is plain C++), e.g. Isa::Amx on a CPU without AMX.
PackedLinear pack_linear_bf16_any_cpu(const float* W, int64_t n, int64_t k, int64_t ldw, const float* bias, Isa kernel);
PackedLinearI8 pack_linear_int8_any_cpu(const float* W, int64_t n, int64_t k, int64_t ldw, const float* bias,
                                        Isa kernel);

// linear_bf16 / linear_int8 of a weight packed for Isa::Amx, with the same work split and
// scratch handling, but the emulated tile machine instead of the AMX registers.
void linear_bf16_tile_emulation(const float* X, int64_t m, int64_t ldx, const PackedLinear& W, float* Y, int64_t ldy);
// gemm_bf16 on the AMX tile kernel (amx_tile_kernels.h) with emulated tiles.
void gemm_bf16_tile_emulation(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A,
                              int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate = false);
void linear_int8_tile_emulation(const float* X, int64_t m, int64_t ldx, const PackedLinearI8& W, float* Y,
                                int64_t ldy);

}  // namespace corelm::kernels
