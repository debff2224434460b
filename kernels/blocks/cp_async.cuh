// cp.async (sm_80 and later): 16-byte copies from global to shared memory that complete
// asynchronously, in commit groups.
//
// These are the project's own wrappers, not CuTe's SM80_CP_ASYNC_CACHEGLOBAL_ZFILL /
// cp_async_fence / cp_async_wait: CuTe's carry no "memory" clobber, so the compiler may move
// ordinary shared-memory loads and stores across the copy, its commit and its wait (the bytes a
// wait makes visible are then read by plain loads, or by ldmatrix after a barrier), and its copy
// adds an L2::128B prefetch hint that these kernels do not ask for.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace probesidecar::kernels::blocks {

// The 32-bit shared-memory address of a generic pointer into shared memory (what PTX's shared
// state space takes).
__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes from `src` (global, 16-byte aligned) to `dst` (shared address, 16-byte aligned). With
// !valid nothing is read (src must still be a valid global address) and dst is zero-filled.
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, bool valid) {
  const int src_size = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_size)
               : "memory");
}

// Closes the group of the copies issued since the last commit.
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace probesidecar::kernels::blocks
