// Hopper warpgroup MMA (wgmma) around CuTe's GMMA atoms (cute/arch/mma_sm90_gmma.hpp): shared-
// memory matrix descriptors of the 128-byte-swizzled layout that TMA and the kernels' own stores
// write, the swizzle itself, the proxy fence that hands ordinary stores to the tensor cores, and
// the calls that spread a register array over an atom's operand list. sm_90a only.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cute/arch/mma_sm90_desc.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <utility>

#include "kernels/blocks/cp_async.cuh"

namespace probesidecar::kernels::blocks {

// One 128-byte row of a swizzled tile: 64 bf16/fp16 elements, eight 16-byte chunks.
inline constexpr int kSwizzleRowBytes = 128;
// The swizzle repeats every 8 rows: tiles start on 1024-byte boundaries.
inline constexpr int kSwizzleAtomBytes = 1024;

// Byte offset of 16-byte chunk `chunk` (0..7) of row `row` in a 128-byte-swizzled tile: chunk c
// of row r sits at chunk c ^ (r % 8).
__device__ __forceinline__ uint32_t Swizzle128Offset(int row, int chunk) {
  return row * kSwizzleRowBytes + (((chunk ^ (row & 7)) & 7) << 4);
}

// The bytes from shared address `smem_addr` to the next 1024-byte boundary (0 on one): dynamic
// shared memory is only 16-byte aligned, and the swizzle works on address bits. A kernel's tiles
// start at raw + SwizzleAtomPadding(SmemAddr(raw)).
__device__ __forceinline__ uint32_t SwizzleAtomPadding(uint32_t smem_addr) {
  return (kSwizzleAtomBytes - (smem_addr & (kSwizzleAtomBytes - 1))) & (kSwizzleAtomBytes - 1);
}

// A shared-memory matrix descriptor of a 128-byte-swizzled operand starting at `smem_addr`.
// K-major operands: sbo = 1024 (the next 8 rows), lbo unused (16); a 16-deep k-step inside a
// 64-column slab moves the start by 32 bytes. MN-major operands: sbo = 1024 (the next 8 rows
// along K), lbo = the distance to the next 64 columns along M or N.
__device__ __forceinline__ uint64_t SwizzledSmemDesc(uint32_t smem_addr, uint32_t lbo_bytes,
                                                     uint32_t sbo_bytes) {
  cute::GmmaDescriptor d;
  d.bitfield.start_address_ = static_cast<uint16_t>(smem_addr >> 4);
  d.bitfield.leading_byte_offset_ = static_cast<uint16_t>(lbo_bytes >> 4);
  d.bitfield.stride_byte_offset_ = static_cast<uint16_t>(sbo_bytes >> 4);
  d.bitfield.base_offset_ = 0;
  d.bitfield.layout_type_ = 1;  // 128-byte swizzle
  return d.desc_;
}
// The K-major case (A and B of a TN GEMM, Q, K and P of attention).
__device__ __forceinline__ uint64_t SwizzledKMajorDesc(uint32_t smem_addr) {
  return SwizzledSmemDesc(smem_addr, 16, kSwizzleAtomBytes);
}

// The same descriptors for the operand at base + off (both multiples of 16), for a loop of wgmma
// over one base: the start-address field, (base + off) >> 4, is below 2^14 (shared addresses stay
// under 256 KB), so it is base's field plus off >> 4 without a carry, and the upper word is a
// constant. The compiler then forms base's lower word once and adds an immediate per wgmma, where
// SwizzledSmemDesc(base + off, ...) costs ~10 instructions each.
__device__ __forceinline__ uint64_t SwizzledSmemDescAt(uint32_t base, uint32_t off,
                                                       uint32_t lbo_bytes, uint32_t sbo_bytes) {
  const uint64_t flags = SwizzledSmemDesc(0, lbo_bytes, sbo_bytes);
  const uint32_t lo = static_cast<uint32_t>(flags) + (base >> 4) + (off >> 4);
  return (flags >> 32 << 32) | lo;
}
__device__ __forceinline__ uint64_t SwizzledKMajorDescAt(uint32_t base, uint32_t off) {
  return SwizzledSmemDescAt(base, off, 16, kSwizzleAtomBytes);
}

// Makes this thread's ordinary shared-memory stores visible to the async proxy (wgmma, TMA).
// The project's own rather than cutlass::arch::fence_view_async_shared, which has no "memory"
// clobber: without one the compiler may sink the stores below the fence.
__device__ __forceinline__ void FenceProxyAsyncShared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// cute::warpgroup_fence_operand over every register of an accumulator or operand array: keeps the
// compiler from moving their reads and writes across the wgmma that uses them.
template <int kN>
__device__ __forceinline__ void FenceOperands(float (&r)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) cute::warpgroup_fence_operand(r[i]);
}
template <int kN, int kM>
__device__ __forceinline__ void FenceOperands(uint32_t (&r)[kN][kM]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) {
#pragma unroll
    for (int j = 0; j < kM; ++j) cute::warpgroup_fence_operand(r[i][j]);
  }
}

namespace detail {
template <typename Op, int kN, size_t... kI>
__device__ __forceinline__ void WgmmaSS(uint64_t da, uint64_t db, float (&d)[kN],
                                        cute::SM90::GMMA::ScaleOut scale,
                                        std::index_sequence<kI...>) {
  Op::fma(da, db, d[kI]..., scale);
}
template <typename Op, int kN, size_t... kI>
__device__ __forceinline__ void WgmmaRS(uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                        uint64_t db, float (&d)[kN], std::index_sequence<kI...>) {
  Op::fma(a0, a1, a2, a3, db, d[kI]..., cute::SM90::GMMA::ScaleOut::One);
}
}  // namespace detail

// d (+)= A B with both operands in shared memory (an *_SS atom); ScaleOut::Zero overwrites d.
template <typename Op, int kN>
__device__ __forceinline__ void WgmmaSS(
    uint64_t da, uint64_t db, float (&d)[kN],
    cute::SM90::GMMA::ScaleOut scale = cute::SM90::GMMA::ScaleOut::One) {
  detail::WgmmaSS<Op>(da, db, d, scale, std::make_index_sequence<kN>{});
}
// d += A B with A in registers (an *_RS atom: a0..a3, this thread's words of the A fragment).
template <typename Op, int kN>
__device__ __forceinline__ void WgmmaRS(uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                        uint64_t db, float (&d)[kN]) {
  detail::WgmmaRS<Op>(a0, a1, a2, a3, db, d, std::make_index_sequence<kN>{});
}

}  // namespace probesidecar::kernels::blocks
