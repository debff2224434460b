// Warp-level tensor-core operations (sm_80 and later): ldmatrix and mma.sync m16n8k16 with
// 16-bit inputs and float32 accumulators, as CuTe's atoms (cute/arch/copy_sm75.hpp,
// cute/arch/mma_sm80.hpp) issue them. These adapters give the kernels' register arrays and
// 32-bit shared addresses to CuTe's operations, which take references.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cute/arch/copy_sm75.hpp>
#include <cute/arch/mma_sm80.hpp>
#include <type_traits>

namespace probesidecar::kernels::blocks {

namespace detail {
__device__ __forceinline__ const cute::uint128_t& SharedChunk(uint32_t addr) {
  return *static_cast<const cute::uint128_t*>(__cvta_shared_to_generic(addr));
}
}  // namespace detail

// Four 8 x 8 matrices of 16-bit elements from shared memory: lane l gives the address of row
// l % 8 of matrix l / 8 (16 bytes); r[i] receives this lane's pair of matrix i.
__device__ __forceinline__ void LdMatrixX4(uint32_t addr, uint32_t (&r)[4]) {
  cute::SM75_U32x4_LDSM_N::copy(detail::SharedChunk(addr), r[0], r[1], r[2], r[3]);
}
// The same, each matrix transposed (an MN-major operand read as K-major).
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t addr, uint32_t (&r)[4]) {
  cute::SM75_U16x8_LDSM_T::copy(detail::SharedChunk(addr), r[0], r[1], r[2], r[3]);
}

// d += a * b for one m16n8k16 tile: a row-major 16 x 16 and b column-major 16 x 8 of T (bf16 or
// fp16) in the mma.sync fragment layout, d 16 x 8 float32.
template <typename T>
__device__ __forceinline__ void Mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>, "bf16 or fp16");
  using Op =
      std::conditional_t<std::is_same_v<T, __nv_bfloat16>, cute::SM80_16x8x16_F32BF16BF16F32_TN,
                         cute::SM80_16x8x16_F32F16F16F32_TN>;
  Op::fma(d[0], d[1], d[2], d[3], a[0], a[1], a[2], a[3], b0, b1, d[0], d[1], d[2], d[3]);
}

}  // namespace probesidecar::kernels::blocks
